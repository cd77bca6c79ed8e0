// Inputs and outputs of `kvattn bench` for the side-by-side run with the peers (bench/run-peers):
// the deterministic input generator that kvattn and the Python side both implement, a writer of
// NumPy .npy files, and the export directory (`--save-io DIR`) with its manifest.json.
//
// The directory holds one folder per benchmark case and DIR/manifest.json describing them
// (format "kvattn-bench-io" version 1, documented in bench/peers/README.md). bf16 tensors are
// stored as uint16 ("<u2") and named bf16 in the manifest's dtypes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvattn_cli {

// ---- input generator "kvattn-hash-v1" -------------------------------------------------------------
// Element i (flat index, C order) of the tensor with seed s is (u - 128) * scale, where
//   t = mix32(s * 0x9e3779b9 + (i >> 32)),  u = mix32(uint32(i) ^ t) >> 24   (mod 2^32 arithmetic)
// and mix32 is the "lowbias32" integer hash:
//   x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16.
// With scale a power of two the values are exact in bf16, f16 and f32, so the Python side
// (bench/peers/kvio.py) regenerates the same bits on the GPU for tensors too large to export.
inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}
inline uint32_t bench_hash_u8(uint32_t seed, uint64_t i) {
  const uint32_t t = mix32(seed * 0x9e3779b9u + uint32_t(i >> 32));
  return mix32(uint32_t(i) ^ t) >> 24;
}
// Seeds and scales of the benchmarks' tensors (recorded in the manifest): q; K and V, paged
// (k_cache, v_cache) or ragged (k, v: prefill), with the same seeds.
inline constexpr uint32_t kSeedQ = 1, kSeedK = 2, kSeedV = 3;
inline constexpr float kScaleQ = 1.0f / 32, kScaleKV = 1.0f / 128;

// Fills dst[0, count) with the bf16 bits of elements [first, first + count) of tensor `seed`,
// on all hardware threads.
void fill_bench_bf16(uint16_t* dst, uint64_t first, uint64_t count, uint32_t seed, float scale);

// The same elements as fp8 bits (`e5m2`: e5m2, else e4m3): (u - 128) * scale rounded to nearest
// even (e4m3 holds 3 mantissa bits, so most values round).
void fill_bench_fp8(uint8_t* dst, uint64_t first, uint64_t count, uint32_t seed, float scale, bool e5m2);

// fp8 caches of `kvattn bench decode --kv-dtype`: the K/V generator's values times 16 (so they use
// fp8's normal range), with k_scale = v_scale = 1/16 bringing them back.
inline constexpr float kFp8KVScale = 1.0f / 16;

// ---- .npy -----------------------------------------------------------------------------------------
// Writes a C-order NumPy file (format 1.0); descr is NumPy's type string: "<u2", "<i4", "<f4".
// Throws kvattn::Error when the file cannot be written.
void write_npy(const std::string& path, const char* descr, const std::vector<int64_t>& shape,
               const void* data, size_t nbytes);

// ---- the export directory -------------------------------------------------------------------------
class IoExport {
 public:
  // Creates `dir` (and parents). kv_limit_bytes: a case's K and V caches are written only when
  // together at most this big, and a prefill case's q only when at most this big (the Python
  // side regenerates larger ones; decode's and cascade's q, index arrays, out and lse are always
  // written).
  IoExport(std::string dir, std::string tool, int64_t kv_limit_bytes);

  int64_t kv_limit_bytes() const { return kv_limit_bytes_; }
  // The folder of case `id` (created), relative to the directory, with a trailing '/'.
  std::string case_dir(const std::string& id);
  // Writes dir/<rel> as .npy; returns its manifest entry {"file", "dtype", "shape"}.
  nlohmann::json array(const std::string& rel, const char* dtype, const std::vector<int64_t>& shape,
                       const void* data, size_t nbytes);
  // Appends a case and rewrites manifest.json (so an interrupted run leaves a valid manifest).
  void add_case(nlohmann::json c);

 private:
  std::string dir_;
  int64_t kv_limit_bytes_;
  nlohmann::json manifest_;
};

// A page table on the host (int32; SEMANTICS.md, "Paged KV cache"), with the qo_indptr of the
// queries that attend through it.
struct IoPageTable {
  std::vector<int32_t> qo_indptr, indptr, indices, last_page_len;
};

#if KVATTN_WITH_CUDA
// Fills `count` bf16 elements of tensor `seed` at `dev` (device memory) with the generator's
// values, made on the host through two pinned chunks (making one overlaps copying the other).
void upload_bench_values(uint16_t* dev, uint64_t count, uint32_t seed, float scale);

// The paged K and V caches of a timed case at `kv` (K: cache_elems bf16, then V), then `copies`
// copies of both (cold-L2 rotation): the generator's values; with `whole` all of each cache
// (exports, whose readers regenerate them), otherwise its first 32 Mi elements (64 MB) repeated
// over the rest, so that caches of tens of GB are not generated on the host.
void upload_bench_kv(uint16_t* kv, size_t cache_elems, int copies, bool whole);
// The same for an fp8 cache (fill_bench_fp8 of scale kScaleKV / kFp8KVScale), prefix generated
// and repeated.
void upload_bench_kv_fp8(uint8_t* kv, size_t cache_elems, int copies, bool e5m2);

// One decode case for the export: its manifest fields, the device tensors (q [B, Hq, D], the
// NHD caches [pages, page_size, Hkv, D], out [B, Hq, D] bf16, lse [B, Hq] f32) and the host page
// table. export_decode_case copies them to the host and writes them.
struct DecodeCaseIo {
  std::string id;
  nlohmann::json fields;
  int64_t batch = 0, num_qo_heads = 0, num_kv_heads = 0, head_dim = 0, num_pages = 0, page_size = 0;
  const uint16_t *q = nullptr, *k_cache = nullptr, *v_cache = nullptr, *out = nullptr;
  const float* lse = nullptr;
  const std::vector<int32_t>*indptr = nullptr, *indices = nullptr, *last_page_len = nullptr;
};
void export_decode_case(IoExport& io, const DecodeCaseIo& c);

// One prefill case: its manifest fields, the device tensors (q [nnz_q, Hq, Dqk]; ragged k/v
// [nnz_kv, Hkv, D] or the NHD caches [num_pages, page_size, Hkv, D] when page_size > 0; out
// [nnz_q, Hq, Dvo] bf16, lse [nnz_q, Hq] f32) and the host index arrays (qo_indptr, kv_indptr
// [B+1] in tokens; paged: page_indptr [B+1], page_ids, last_page_len [B]).
struct PrefillCaseIo {
  std::string id;
  nlohmann::json fields;
  int64_t nnz_q = 0, nnz_kv = 0, num_qo_heads = 0, num_kv_heads = 0, head_dim_qk = 0, head_dim_vo = 0;
  int64_t num_pages = 0, page_size = 0;  // page_size 0: ragged
  const uint16_t *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr;
  const float* lse = nullptr;
  const std::vector<int32_t>*qo_indptr = nullptr, *kv_indptr = nullptr, *page_indptr = nullptr,
                       *page_ids = nullptr, *last_page_len = nullptr;
};
void export_prefill_case(IoExport& io, const PrefillCaseIo& c);

// One cascade case (two levels over one paged cache): its manifest fields, the device tensors
// (q [B, Hq, D], the NHD caches [num_pages, page_size, Hkv, D]; out, flat_out [B, Hq, D] bf16,
// lse, flat_lse [B, Hq] f32: the cascade's and plain decode's) and the host page tables of level
// 0 (the shared prefix: qo_indptr [0, B], one request), level 1 (each request's suffix) and flat
// (each request's whole list: prefix pages, then its suffix pages).
struct CascadeCaseIo {
  std::string id;
  nlohmann::json fields;
  int64_t batch = 0, num_qo_heads = 0, num_kv_heads = 0, head_dim = 0, num_pages = 0, page_size = 0;
  const uint16_t *q = nullptr, *k_cache = nullptr, *v_cache = nullptr, *out = nullptr, *flat_out = nullptr;
  const float *lse = nullptr, *flat_lse = nullptr;
  const IoPageTable *level0 = nullptr, *level1 = nullptr, *flat = nullptr;
};
void export_cascade_case(IoExport& io, const CascadeCaseIo& c);
#endif

}  // namespace kvattn_cli
