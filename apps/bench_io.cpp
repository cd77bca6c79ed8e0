// See bench_io.h.
#include "bench_io.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "bench_common.h"
#include "host_tensors.h"
#include "kernels/common/convert.cuh"
#include "kvattn/kvattn.h"

#if KVATTN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/runtime.h"
#endif

namespace kvattn_cli {

namespace {
// dst[j] = table[u of element first + j], on all hardware threads.
template <class T>
void fill_from_table(T* dst, uint64_t first, uint64_t count, uint32_t seed, const T (&table)[256]) {
  const uint64_t threads =
      std::clamp<uint64_t>(count / (uint64_t(1) << 20), 1, std::max(1u, std::thread::hardware_concurrency()));
  auto work = [&](uint64_t t) {
    const uint64_t lo = count * t / threads, hi = count * (t + 1) / threads;
    for (uint64_t j = lo; j < hi; ++j) dst[j] = table[bench_hash_u8(seed, first + j)];
  };
  std::vector<std::thread> pool;
  for (uint64_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
}
}  // namespace

void fill_bench_bf16(uint16_t* dst, uint64_t first, uint64_t count, uint32_t seed, float scale) {
  // The 256 possible values, as bf16 bits (exact: (u - 128) * scale with scale a power of two).
  uint16_t table[256];
  for (int u = 0; u < 256; ++u) table[u] = float_to_bf16(float(u - 128) * scale);
  fill_from_table(dst, first, count, seed, table);
}

void fill_bench_fp8(uint8_t* dst, uint64_t first, uint64_t count, uint32_t seed, float scale, bool e5m2) {
  uint8_t table[256];
  for (int u = 0; u < 256; ++u) {
    const uint32_t bits = kvattn::kernels::cvt::f32_bits(float(u - 128) * scale);
    table[u] = e5m2 ? kvattn::kernels::cvt::f32_to_e5m2_bits(bits) : kvattn::kernels::cvt::f32_to_e4m3_bits(bits);
  }
  fill_from_table(dst, first, count, seed, table);
}

void write_npy(const std::string& path, const char* descr, const std::vector<int64_t>& shape,
               const void* data, size_t nbytes) {
  std::string dims;  // "3, 4" for (3, 4); "5," for (5,); "" for a scalar
  for (size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) dims += ",";
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple of 64
  // and ended by '\n', as NumPy writes it.
  const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  if (!f) throw kvattn::Error("cannot write " + path + ": " + std::strerror(errno));
  const unsigned char preamble[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                      static_cast<unsigned char>(header.size() & 0xff),
                                      static_cast<unsigned char>(header.size() >> 8)};
  f.write(reinterpret_cast<const char*>(preamble), sizeof preamble);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(static_cast<const char*>(data), std::streamsize(nbytes));
  if (!f) throw kvattn::Error("cannot write " + path + " (disk full?)");
}

IoExport::IoExport(std::string dir, std::string tool, int64_t kv_limit_bytes)
    : dir_(std::move(dir)), kv_limit_bytes_(kv_limit_bytes) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) throw kvattn::Error("--save-io: cannot create " + dir_ + ": " + ec.message());
  if (!dir_.empty() && dir_.back() != '/') dir_ += '/';
  manifest_ = {{"format", "kvattn-bench-io"},
               {"format_version", 1},
               {"tool", std::move(tool)},
               {"kvattn_version", kvattn::kVersion},
               {"kv_limit_bytes", kv_limit_bytes_},
               {"generator",
                {{"name", "kvattn-hash-v1"},
                 {"seeds", {{"q", kSeedQ}, {"k_cache", kSeedK}, {"v_cache", kSeedV}, {"k", kSeedK}, {"v", kSeedV}}},
                 {"scales",
                  {{"q", kScaleQ}, {"k_cache", kScaleKV}, {"v_cache", kScaleKV}, {"k", kScaleKV}, {"v", kScaleKV}}}}},
               {"cases", nlohmann::json::array()}};
}

std::string IoExport::case_dir(const std::string& id) {
  std::error_code ec;
  std::filesystem::create_directories(dir_ + id, ec);
  if (ec) throw kvattn::Error("--save-io: cannot create " + dir_ + id + ": " + ec.message());
  return id + "/";
}

nlohmann::json IoExport::array(const std::string& rel, const char* dtype, const std::vector<int64_t>& shape,
                               const void* data, size_t nbytes) {
  const std::string d(dtype);
  const char* descr = d == "i32" ? "<i4" : d == "f32" ? "<f4" : "<u2";  // bf16 and f16 as uint16
  write_npy(dir_ + rel, descr, shape, data, nbytes);
  return {{"file", rel}, {"dtype", d}, {"shape", shape}};
}

void IoExport::add_case(nlohmann::json c) {
  manifest_["cases"].push_back(std::move(c));
  const std::string tmp = dir_ + "manifest.json.tmp";
  {
    std::ofstream f(tmp);
    f << manifest_.dump(1) << "\n";
    if (!f) throw kvattn::Error("cannot write " + tmp);
  }
  std::filesystem::rename(tmp, dir_ + "manifest.json");
}

#if KVATTN_WITH_CUDA
namespace {

template <class T>
std::vector<T> to_host(const T* dev, size_t n) {
  std::vector<T> h(n);
  cuda_ok(cudaMemcpy(h.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
  return h;
}
}  // namespace

void upload_bench_values(uint16_t* dev, uint64_t count, uint32_t seed, float scale) {
  const uint64_t chunk = std::clamp<uint64_t>(count, 1, uint64_t(1) << 25);  // up to 32 Mi elements (64 MB)
  uint16_t* pinned[2] = {nullptr, nullptr};
  cudaEvent_t done[2];
  for (int b = 0; b < 2; ++b) {
    cuda_ok(cudaMallocHost(reinterpret_cast<void**>(&pinned[b]), chunk * 2), "cudaMallocHost");
    cuda_ok(cudaEventCreateWithFlags(&done[b], cudaEventDisableTiming), "cudaEventCreate");
  }
  for (uint64_t at = 0, k = 0; at < count; at += chunk, ++k) {
    const int b = int(k % 2);
    const uint64_t n = std::min(chunk, count - at);
    cuda_ok(cudaEventSynchronize(done[b]), "cudaEventSynchronize");  // the chunk's last copy is done
    fill_bench_bf16(pinned[b], at, n, seed, scale);
    cuda_ok(cudaMemcpyAsync(dev + at, pinned[b], n * 2, cudaMemcpyHostToDevice, nullptr), "cudaMemcpyAsync");
    cuda_ok(cudaEventRecord(done[b], nullptr), "cudaEventRecord");
  }
  cuda_ok(cudaDeviceSynchronize(), "upload");
  for (int b = 0; b < 2; ++b) {
    cudaEventDestroy(done[b]);
    cudaFreeHost(pinned[b]);
  }
}

void upload_bench_kv(uint16_t* kv, size_t cache_elems, int copies, bool whole) {
  const size_t generated = whole ? cache_elems : std::min(cache_elems, size_t(1) << 25);
  upload_bench_values(kv, generated, kSeedK, kScaleKV);
  upload_bench_values(kv + cache_elems, generated, kSeedV, kScaleKV);
  for (uint16_t* cache : {kv, kv + cache_elems})
    for (size_t filled = generated; filled < cache_elems;) {  // doubling copies of the prefix
      const size_t n = std::min(filled, cache_elems - filled);
      cuda_ok(cudaMemcpy(cache + filled, cache, n * 2, cudaMemcpyDeviceToDevice), "cudaMemcpy (repeat)");
      filled += n;
    }
  for (int i = 1; i < copies; ++i)
    cuda_ok(cudaMemcpy(kv + size_t(i) * 2 * cache_elems, kv, 2 * cache_elems * 2, cudaMemcpyDeviceToDevice),
            "cudaMemcpy (cache copies)");
}

void upload_bench_kv_fp8(uint8_t* kv, size_t cache_elems, int copies, bool e5m2) {
  const size_t generated = std::min(cache_elems, size_t(1) << 25);
  std::vector<uint8_t> host(generated);
  for (uint8_t* cache : {kv, kv + cache_elems}) {
    fill_bench_fp8(host.data(), 0, generated, cache == kv ? kSeedK : kSeedV, kScaleKV / kFp8KVScale, e5m2);
    cuda_ok(cudaMemcpy(cache, host.data(), generated, cudaMemcpyHostToDevice), "cudaMemcpy");
    for (size_t filled = generated; filled < cache_elems;) {  // doubling copies of the prefix
      const size_t n = std::min(filled, cache_elems - filled);
      cuda_ok(cudaMemcpy(cache + filled, cache, n, cudaMemcpyDeviceToDevice), "cudaMemcpy (repeat)");
      filled += n;
    }
  }
  for (int i = 1; i < copies; ++i)
    cuda_ok(cudaMemcpy(kv + size_t(i) * 2 * cache_elems, kv, 2 * cache_elems, cudaMemcpyDeviceToDevice),
            "cudaMemcpy (cache copies)");
}

void export_decode_case(IoExport& io, const DecodeCaseIo& c) {
  const std::string dir = io.case_dir(c.id);
  const int64_t rows = c.batch * c.num_qo_heads, D = c.head_dim;
  const std::vector<int64_t> cache_shape{c.num_pages, c.page_size, c.num_kv_heads, D};
  const size_t cache_elems = size_t(c.num_pages * c.page_size * c.num_kv_heads * D);
  nlohmann::json arrays;
  arrays["q"] = io.array(dir + "q.npy", "bf16", {c.batch, c.num_qo_heads, D}, to_host(c.q, size_t(rows * D)).data(),
                         size_t(rows * D) * 2);
  arrays["kv_indptr"] = io.array(dir + "kv_indptr.npy", "i32", {int64_t(c.indptr->size())}, c.indptr->data(),
                                 c.indptr->size() * 4);
  arrays["kv_indices"] = io.array(dir + "kv_indices.npy", "i32", {int64_t(c.indices->size())}, c.indices->data(),
                                  c.indices->size() * 4);
  arrays["kv_last_page_len"] = io.array(dir + "kv_last_page_len.npy", "i32", {int64_t(c.last_page_len->size())},
                                        c.last_page_len->data(), c.last_page_len->size() * 4);
  for (const char* name : {"k_cache", "v_cache"}) {
    const uint16_t* src = std::string(name) == "k_cache" ? c.k_cache : c.v_cache;
    if (int64_t(2 * cache_elems * 2) <= io.kv_limit_bytes())
      arrays[name] = io.array(dir + name + ".npy", "bf16", cache_shape, to_host(src, cache_elems).data(), cache_elems * 2);
    else  // too big to export: readers regenerate it (the manifest's "generator")
      arrays[name] = {{"file", nullptr}, {"dtype", "bf16"}, {"shape", cache_shape}};
  }
  arrays["out"] = io.array(dir + "out.npy", "bf16", {c.batch, c.num_qo_heads, D}, to_host(c.out, size_t(rows * D)).data(),
                           size_t(rows * D) * 2);
  arrays["lse"] = io.array(dir + "lse.npy", "f32", {c.batch, c.num_qo_heads}, to_host(c.lse, size_t(rows)).data(),
                           size_t(rows) * 4);
  nlohmann::json entry = c.fields;
  entry["id"] = c.id;
  entry["arrays"] = std::move(arrays);
  io.add_case(std::move(entry));
}

void export_prefill_case(IoExport& io, const PrefillCaseIo& c) {
  const std::string dir = io.case_dir(c.id);
  const bool paged = c.page_size > 0;
  nlohmann::json arrays;
  auto ints = [&](const char* name, const std::vector<int32_t>& v) {
    arrays[name] = io.array(dir + name + ".npy", "i32", {int64_t(v.size())}, v.data(), v.size() * 4);
  };
  // A generated input: written when at most `limit` bytes, else only described (readers
  // regenerate it from the manifest's generator).
  auto input = [&](const char* name, const uint16_t* src, const std::vector<int64_t>& shape, int64_t limit) {
    size_t n = 1;
    for (int64_t d : shape) n *= size_t(d);
    if (int64_t(n * 2) <= limit)
      arrays[name] = io.array(dir + name + ".npy", "bf16", shape, to_host(src, n).data(), n * 2);
    else
      arrays[name] = {{"file", nullptr}, {"dtype", "bf16"}, {"shape", shape}};
  };
  input("q", c.q, {c.nnz_q, c.num_qo_heads, c.head_dim_qk}, io.kv_limit_bytes());
  ints("qo_indptr", *c.qo_indptr);
  const int64_t kv_rows = paged ? c.num_pages * c.page_size : c.nnz_kv;
  // K and V together against the limit: each gets half of it.
  const std::vector<int64_t> k_shape = paged ? std::vector<int64_t>{c.num_pages, c.page_size, c.num_kv_heads, c.head_dim_qk}
                                             : std::vector<int64_t>{c.nnz_kv, c.num_kv_heads, c.head_dim_qk};
  std::vector<int64_t> v_shape = k_shape;
  v_shape.back() = c.head_dim_vo;
  const bool kv_fits = kv_rows * c.num_kv_heads * (c.head_dim_qk + c.head_dim_vo) * 2 <= io.kv_limit_bytes();
  const int64_t kv_limit = kv_fits ? INT64_MAX : -1;
  if (paged) {
    input("k_cache", c.k, k_shape, kv_limit);
    input("v_cache", c.v, v_shape, kv_limit);
    ints("kv_indptr", *c.page_indptr);  // in pages, as FlashInfer's paged kv_indptr
    ints("kv_indices", *c.page_ids);
    ints("kv_last_page_len", *c.last_page_len);
  } else {
    input("k", c.k, k_shape, kv_limit);
    input("v", c.v, v_shape, kv_limit);
    ints("kv_indptr", *c.kv_indptr);  // in tokens
  }
  const size_t out_n = size_t(c.nnz_q * c.num_qo_heads * c.head_dim_vo), lse_n = size_t(c.nnz_q * c.num_qo_heads);
  arrays["out"] = io.array(dir + "out.npy", "bf16", {c.nnz_q, c.num_qo_heads, c.head_dim_vo},
                           to_host(c.out, out_n).data(), out_n * 2);
  arrays["lse"] = io.array(dir + "lse.npy", "f32", {c.nnz_q, c.num_qo_heads}, to_host(c.lse, lse_n).data(), lse_n * 4);
  nlohmann::json entry = c.fields;
  entry["id"] = c.id;
  entry["arrays"] = std::move(arrays);
  io.add_case(std::move(entry));
}

void export_cascade_case(IoExport& io, const CascadeCaseIo& c) {
  const std::string dir = io.case_dir(c.id);
  const int64_t rows = c.batch * c.num_qo_heads, D = c.head_dim;
  nlohmann::json arrays;
  auto ints = [&](const std::string& name, const std::vector<int32_t>& v) {
    arrays[name] = io.array(dir + name + ".npy", "i32", {int64_t(v.size())}, v.data(), v.size() * 4);
  };
  auto bf16 = [&](const char* name, const uint16_t* src) {
    arrays[name] = io.array(dir + name + ".npy", "bf16", {c.batch, c.num_qo_heads, D},
                            to_host(src, size_t(rows * D)).data(), size_t(rows * D) * 2);
  };
  auto f32 = [&](const char* name, const float* src) {
    arrays[name] = io.array(dir + name + ".npy", "f32", {c.batch, c.num_qo_heads}, to_host(src, size_t(rows)).data(),
                            size_t(rows) * 4);
  };
  bf16("q", c.q);
  const std::vector<int64_t> cache_shape{c.num_pages, c.page_size, c.num_kv_heads, D};
  const size_t cache_elems = size_t(c.num_pages * c.page_size * c.num_kv_heads * D);
  for (const char* name : {"k_cache", "v_cache"}) {
    const uint16_t* src = std::string(name) == "k_cache" ? c.k_cache : c.v_cache;
    if (int64_t(2 * cache_elems * 2) <= io.kv_limit_bytes())
      arrays[name] = io.array(dir + name + ".npy", "bf16", cache_shape, to_host(src, cache_elems).data(), cache_elems * 2);
    else  // too big to export: readers regenerate it (the manifest's "generator")
      arrays[name] = {{"file", nullptr}, {"dtype", "bf16"}, {"shape", cache_shape}};
  }
  // level0_*, level1_*: the cascade's tables (FlashInfer's qo_indptr_arr, paged_kv_indptr_arr, ...);
  // kv_*: the flat tables, named as in a decode case.
  for (auto [prefix, t] : {std::pair{std::string("level0_"), c.level0}, std::pair{std::string("level1_"), c.level1}}) {
    ints(prefix + "qo_indptr", t->qo_indptr);
    ints(prefix + "kv_indptr", t->indptr);
    ints(prefix + "kv_indices", t->indices);
    ints(prefix + "kv_last_page_len", t->last_page_len);
  }
  ints("kv_indptr", c.flat->indptr);
  ints("kv_indices", c.flat->indices);
  ints("kv_last_page_len", c.flat->last_page_len);
  bf16("out", c.out);
  f32("lse", c.lse);
  bf16("flat_out", c.flat_out);
  f32("flat_lse", c.flat_lse);
  nlohmann::json entry = c.fields;
  entry["id"] = c.id;
  entry["arrays"] = std::move(arrays);
  io.add_case(std::move(entry));
}
#endif

}  // namespace kvattn_cli
