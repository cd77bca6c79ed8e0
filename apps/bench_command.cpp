// `kvattn bench decode`: paged batch decode on the GPU, timed with CUDA events on a cold L2
// (several copies of the KV cache in rotation), median of many runs, GB/s against the H200's
// 4.8 TB/s, plan() time on the host; a table, and JSON with --json.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "commands.h"
#include "core/batch_shapes.h"
#include "kvattn/kvattn.h"

#if KVATTN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/runtime.h"
#endif

namespace {

struct DecodeBenchCase {
  std::string name;
  int num_qo_heads, num_kv_heads;
  std::vector<int32_t> lens;
  int page_size = 16;
};

std::vector<DecodeBenchCase> decode_cases(bool quick) {
  std::vector<DecodeBenchCase> cases;
  const std::vector<int> batches = quick ? std::vector<int>{1, 64} : std::vector<int>{1, 16, 64, 256};
  const std::vector<int> lens = quick ? std::vector<int>{4096} : std::vector<int>{512, 4096, 32768};
  for (auto [hq, hkv] : {std::pair{32, 8}, std::pair{32, 32}})
    for (int b : batches)
      for (int l : lens)
        cases.push_back({std::to_string(b) + " x " + std::to_string(l), hq, hkv,
                         std::vector<int32_t>(size_t(b), l)});
  // Skewed batches and their uniform twins with the same total KV.
  auto zipf = kvattn::detail::zipf_lengths(64, 4096.0, 1.0, 7);
  cases.push_back({"64 zipf (mean 4k)", 32, 8, zipf});
  auto one_long = kvattn::detail::one_long_lengths(32768, 63, 512);
  cases.push_back({"1 x 32k + 63 x 512", 32, 8, one_long});
  int64_t total = std::accumulate(one_long.begin(), one_long.end(), int64_t(0));
  cases.push_back({"64 x " + std::to_string(total / 64) + " (same total)", 32, 8,
                   std::vector<int32_t>(64, int32_t(total / 64))});
  cases.push_back({"64 x 4096, page 1", 32, 8, std::vector<int32_t>(64, 4096), 1});
  return cases;
}

#if KVATTN_WITH_CUDA
void cuda_ok(cudaError_t e, const char* what) { kvattn::cuda::check(e, what); }

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  explicit DeviceBuffer(size_t n) { cuda_ok(cudaMalloc(reinterpret_cast<void**>(&ptr), std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
};

nlohmann::json run_decode_case(const DecodeBenchCase& c, int iters, double peak_gbps) {
  using kvattn::DType;
  using kvattn::TensorView;
  const int D = 128, P = c.page_size, B = int(c.lens.size());
  std::vector<int32_t> indptr{0}, last;
  for (int32_t l : c.lens) {
    int32_t pages = (l + P - 1) / P;
    indptr.push_back(indptr.back() + pages);
    last.push_back(pages ? l - (pages - 1) * P : 0);
  }
  const int64_t pages = indptr.back();
  std::vector<int32_t> indices(static_cast<size_t>(pages));
  std::iota(indices.begin(), indices.end(), 0);
  std::shuffle(indices.begin(), indices.end(), std::mt19937(1));
  const int64_t tokens = std::accumulate(c.lens.begin(), c.lens.end(), int64_t(0));
  const size_t cache_elems = size_t(pages) * P * c.num_kv_heads * D;
  const double kv_bytes = double(tokens) * 2 * c.num_kv_heads * D * 2;
  // Enough copies of the cache that one run's data has left the 60 MB L2 before it is read again.
  const int copies = int(std::clamp<double>(std::ceil(256e6 / (2.0 * cache_elems * 2)), 1, 8));
  DeviceBuffer<uint16_t> kv(2 * cache_elems * size_t(copies));
  cuda_ok(cudaMemset(kv.ptr, 0x3c, 2 * cache_elems * copies * 2), "cudaMemset");  // bf16 ~0.0115
  DeviceBuffer<uint16_t> q(size_t(B) * c.num_qo_heads * D), out(size_t(B) * c.num_qo_heads * D);
  cuda_ok(cudaMemset(q.ptr, 0x3c, size_t(B) * c.num_qo_heads * D * 2), "cudaMemset");
  const int64_t ws_bytes = int64_t(512) << 20;
  DeviceBuffer<char> ws(static_cast<size_t>(ws_bytes));

  kvattn::BatchDecode decode(TensorView(ws.ptr, DType::u8, {ws_bytes}, kvattn::Device::cuda(0)));
  kvattn::BatchDecodePlan plan;
  plan.num_qo_heads = c.num_qo_heads;
  plan.num_kv_heads = c.num_kv_heads;
  plan.head_dim_qk = D;
  plan.q_dtype = DType::bf16;
  plan.page_size = P;
  plan.page_table = {TensorView(indptr.data(), DType::i32, {int64_t(indptr.size())}),
                     TensorView(indices.data(), DType::i32, {pages}),
                     TensorView(last.data(), DType::i32, {int64_t(B)})};
  // Steady state: the first plans allocate the pinned staging buffers and wait behind this
  // benchmark's own setup (the memsets above), which a serving loop pays once.
  cuda_ok(cudaDeviceSynchronize(), "setup");
  for (int i = 0; i < 3; ++i) decode.plan(plan);
  cuda_ok(cudaDeviceSynchronize(), "warm-up plans");
  std::vector<double> plan_us;
  for (int i = 0; i < 20; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    decode.plan(plan);
    plan_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(plan_us.begin(), plan_us.end());
  auto cache_view = [&](int copy) {
    uint16_t* base = kv.ptr + size_t(copy) * 2 * cache_elems;
    auto dev = kvattn::Device::cuda(0);
    return kvattn::PagedKVCache::split(TensorView(base, DType::bf16, {pages, P, c.num_kv_heads, D}, dev),
                                       TensorView(base + cache_elems, DType::bf16, {pages, P, c.num_kv_heads, D}, dev),
                                       kvattn::KVLayout::NHD);
  };
  TensorView qv(q.ptr, DType::bf16, {B, c.num_qo_heads, D}, kvattn::Device::cuda(0));
  TensorView ov(out.ptr, DType::bf16, {B, c.num_qo_heads, D}, kvattn::Device::cuda(0));
  for (int i = 0; i < 3; ++i) decode.run(qv, cache_view(i % copies), ov);
  cuda_ok(cudaDeviceSynchronize(), "warm-up");
  std::vector<cudaEvent_t> ev(static_cast<size_t>(2 * iters));
  for (auto& e : ev) cuda_ok(cudaEventCreate(&e), "cudaEventCreate");
  for (int i = 0; i < iters; ++i) {
    cuda_ok(cudaEventRecord(ev[size_t(2 * i)]), "cudaEventRecord");
    decode.run(qv, cache_view(i % copies), ov);
    cuda_ok(cudaEventRecord(ev[size_t(2 * i + 1)]), "cudaEventRecord");
  }
  cuda_ok(cudaDeviceSynchronize(), "timed runs");
  std::vector<float> ms(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) cudaEventElapsedTime(&ms[size_t(i)], ev[size_t(2 * i)], ev[size_t(2 * i + 1)]);
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  const double bytes = kv_bytes + 2.0 * B * c.num_qo_heads * D * 2;
  const double gbps = bytes / (med * 1e-3) / 1e9;
  return {{"op", "decode"}, {"case", c.name}, {"heads", std::to_string(c.num_qo_heads) + "/" + std::to_string(c.num_kv_heads)},
          {"batch", B}, {"kv_tokens", tokens}, {"page_size", P}, {"ms", med}, {"GBps", gbps},
          {"pct_of_4800", 100.0 * gbps / peak_gbps}, {"plan_us", plan_us[plan_us.size() / 2]},
          {"l2_copies", copies}};
}
#endif

void bench_decode(bool quick, bool json, int iters) {
#if KVATTN_WITH_CUDA
  kvattn::cuda::require_cuda("kvattn bench decode");
  nlohmann::json rows = nlohmann::json::array();
  if (!json)
    std::printf("%-28s %6s %10s %10s %8s %9s\n", "decode (bf16, hd 128)", "heads", "time", "GB/s", "% 4.8T", "plan");
  for (const auto& c : decode_cases(quick)) {
    const double kv_gb = std::accumulate(c.lens.begin(), c.lens.end(), 0.0) * 2 * c.num_kv_heads * 128 * 2 / 1e9;
    if (kv_gb > 40) {  // 256 x 32k with 32 KV heads is 137 GB: more than the card holds
      if (!json) std::printf("%-28s %6s skipped: %.0f GB of KV\n", c.name.c_str(),
                             (std::to_string(c.num_qo_heads) + "/" + std::to_string(c.num_kv_heads)).c_str(), kv_gb);
      continue;
    }
    auto row = run_decode_case(c, iters, 4800.0);
    if (!json)
      std::printf("%-28s %6s %8.1f us %10.0f %7.1f%% %6.1f us\n", c.name.c_str(),
                  row["heads"].get<std::string>().c_str(), row["ms"].get<double>() * 1e3,
                  row["GBps"].get<double>(), row["pct_of_4800"].get<double>(), row["plan_us"].get<double>());
    std::fflush(stdout);
    rows.push_back(row);
  }
  if (json) std::cout << rows.dump(1) << "\n";
#else
  (void)quick; (void)json; (void)iters;
  throw kvattn::Error("kvattn bench decode needs the CUDA backend, and this build has none");
#endif
}

}  // namespace

void register_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "GPU benchmarks (CUDA events, cold L2, median of runs)");
  bench->require_subcommand(1);
  auto* decode = bench->add_subcommand("decode", "paged batch decode: Llama-3-8B (32/8) and MHA 32/32 heads, "
                                                  "head dim 128, page 16, bf16; uniform and skewed batches");
  static bool quick = false, json = false;
  static int iters = 30;
  decode->add_flag("--quick", quick, "a few shapes only");
  decode->add_flag("--json", json, "print the rows as JSON");
  decode->add_option("--iters", iters, "timed runs per shape (median reported)")->check(CLI::Range(1, 10000));
  decode->callback([] { bench_decode(quick, json, iters); });
}
