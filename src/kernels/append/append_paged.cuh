// append_paged_kv_cache on the GPU (kvattn/ops.h; SEMANTICS.md, "Paged KV cache"): row r of the
// appended K and V goes to token positions[r] of request batch_indices[r], i.e. page
// kv_indices[kv_indptr[b] + pos / page_size], slot pos % page_size, of either layout (the strides
// say which), split or combined caches alike.
//
// The index arrays live on the device and are never read by the host, so this kernel is their
// only check: a row whose request is out of [0, batch_size), whose position is out of
// [0, kv_len(b)), whose request's indptr / last_page_len entries are inconsistent (indptr not
// within [0, num_indices] or decreasing, last_page_len outside [1, page_size]) or whose page id
// is out of [0, num_pages) is skipped: nothing is written for it, and nothing outside the cache is
// ever written. Two rows targeting one slot are not detected (which values land there is
// unspecified).
//
// Equal dtypes copy bits (in the widest piece, up to 16 bytes, that every address allows); other
// pairs convert through f32 with kernels/common/convert.cuh, bit-identical to the CPU backend.
// One CTA per (row, K or V); its threads stride over heads x head_dim.
#pragma once

#include "kernels/common/host_device.cuh"
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#include "kernels/common/convert.cuh"
#endif

namespace kvattn::kernels {

// One side (K or V) of the append. Strides in elements of the side's dtypes.
struct AppendSideParams {
  const void* src = nullptr;  // [num_rows, num_heads, head_dim]
  int64_t src_row = 0, src_head = 0;
  void* dst = nullptr;        // page p, slot t, head h at p * dst_page + t * dst_token + h * dst_head
  int64_t dst_page = 0, dst_token = 0, dst_head = 0;
  int32_t src_dtype = 0, dst_dtype = 0;  // numbered as kvattn::DType (f32, f16, bf16, e4m3, e5m2)
  int32_t head_dim = 0;
  // Equal dtypes: bytes per copy (16, 8, 4, 2 or 1), a divisor of every address and stride the
  // copy forms and of head_dim * element size. 0: the dtypes differ, convert element by element.
  int32_t copy_bytes = 0;
};

struct AppendParams {
  AppendSideParams k, v;
  const int32_t* batch_indices = nullptr;    // [num_rows]
  const int32_t* positions = nullptr;        // [num_rows]
  const int32_t* kv_indptr = nullptr;        // [batch_size + 1]
  const int32_t* kv_indices = nullptr;       // [num_indices]
  const int32_t* kv_last_page_len = nullptr; // [batch_size]
  int64_t num_rows = 0;
  int64_t num_pages = 0;
  int32_t num_heads = 0, page_size = 1, batch_size = 0, num_indices = 0;
};

// Grid: (num_rows, 2) CTAs of kAppendThreads.
constexpr int kAppendThreads = 128;

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)

namespace append_detail {

// The page and slot row r writes; false when any index on the way is out of range.
__device__ __forceinline__ bool resolve(const AppendParams& p, int64_t r, int64_t& page, int32_t& slot) {
  const int32_t b = p.batch_indices[r];
  if (b < 0 || b >= p.batch_size) return false;
  const int32_t pos = p.positions[r];
  if (pos < 0) return false;
  const int32_t begin = p.kv_indptr[b], end = p.kv_indptr[b + 1];
  if (begin < 0 || end <= begin || end > p.num_indices) return false;  // (no pages: length 0)
  const int32_t last = p.kv_last_page_len[b];
  if (last < 1 || last > p.page_size) return false;
  const int64_t len = int64_t(end - begin - 1) * p.page_size + last;
  if (pos >= len) return false;
  const int32_t id = p.kv_indices[begin + pos / p.page_size];  // < end: pos < (end - begin) * page_size
  if (id < 0 || id >= p.num_pages) return false;
  page = id;
  slot = pos % p.page_size;
  return true;
}

__device__ __forceinline__ int dtype_bytes(int dt) { return dt == 0 ? 4 : dt <= 2 ? 2 : 1; }

// Equal dtypes: heads x (head_dim * esz / sizeof(W)) words of W.
template <class W>
__device__ __forceinline__ void copy_words(const AppendSideParams& s, const char* src, char* dst,
                                           int heads, int esz) {
  const int per_head = s.head_dim * esz / int(sizeof(W));
  const int64_t n = int64_t(heads) * per_head;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int h = int(i / per_head), w = int(i % per_head);
    const W x = *reinterpret_cast<const W*>(src + h * s.src_head * esz + int64_t(w) * int64_t(sizeof(W)));
    *reinterpret_cast<W*>(dst + h * s.dst_head * esz + int64_t(w) * int64_t(sizeof(W))) = x;
  }
}

template <int S, int D>
__device__ __forceinline__ void convert_elements(const AppendSideParams& s, const char* src, char* dst,
                                                 int heads) {
  const int64_t n = int64_t(heads) * s.head_dim;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int h = int(i / s.head_dim), e = int(i % s.head_dim);
    cvt::store_f32<D>(dst, h * s.dst_head + e, cvt::load_f32<S>(src, h * s.src_head + e));
  }
}

template <int S>
__device__ __forceinline__ void convert_from(const AppendSideParams& s, const char* src, char* dst, int heads) {
  switch (s.dst_dtype) {
    case 0: convert_elements<S, 0>(s, src, dst, heads); break;
    case 1: convert_elements<S, 1>(s, src, dst, heads); break;
    case 2: convert_elements<S, 2>(s, src, dst, heads); break;
    case 3: convert_elements<S, 3>(s, src, dst, heads); break;
    case 4: convert_elements<S, 4>(s, src, dst, heads); break;
    default: break;
  }
}

}  // namespace append_detail

__device__ __forceinline__ void append_paged(const AppendParams& p) {
  using namespace append_detail;
  const int64_t r = blockIdx.x;
  if (r >= p.num_rows) return;
  int64_t page = 0;
  int32_t slot = 0;
  if (!resolve(p, r, page, slot)) return;  // the whole CTA skips the row
  const AppendSideParams s = blockIdx.y == 0 ? p.k : p.v;
  const int ssz = dtype_bytes(s.src_dtype), dsz = dtype_bytes(s.dst_dtype);
  const char* src = static_cast<const char*>(s.src) + r * s.src_row * ssz;
  char* dst = static_cast<char*>(s.dst) + (page * s.dst_page + int64_t(slot) * s.dst_token) * dsz;
  switch (s.copy_bytes) {
    case 16: copy_words<uint4>(s, src, dst, p.num_heads, ssz); break;
    case 8: copy_words<uint2>(s, src, dst, p.num_heads, ssz); break;
    case 4: copy_words<uint32_t>(s, src, dst, p.num_heads, ssz); break;
    case 2: copy_words<uint16_t>(s, src, dst, p.num_heads, ssz); break;
    case 1: copy_words<uint8_t>(s, src, dst, p.num_heads, ssz); break;
    default:
      switch (s.src_dtype) {
        case 0: convert_from<0>(s, src, dst, p.num_heads); break;
        case 1: convert_from<1>(s, src, dst, p.num_heads); break;
        case 2: convert_from<2>(s, src, dst, p.num_heads); break;
        case 3: convert_from<3>(s, src, dst, p.num_heads); break;
        case 4: convert_from<4>(s, src, dst, p.num_heads); break;
        default: break;
      }
  }
}

#endif

}  // namespace kvattn::kernels
