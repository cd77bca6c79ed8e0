// `kvattn bench prefill`: batch prefill/append on the GPU (BatchPrefill with a CUDA workspace),
// timed with CUDA events, median of many runs; TFLOP/s with the visible (query, key) pairs counted
// exactly (causal masks aligned bottom-right), against the H200's measured 782 TFLOP/s bf16 GEMM
// rate (../shared/ANCHORS.md). Shapes follow the peers' anchors: 16k tokens as 1 x 16k, 4 x 4k and
// 16 x 1k; head dims 64/128/256 (32 heads, 16 for 256); causal and not; ragged and paged (page 1
// and 16); soft-cap; GQA; a skewed ragged batch and an append batch on a cached prefix.
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

struct PrefillBenchCase {
  std::string id;    // file-name safe, for --cases
  std::string name;  // the rows' "case"
  int num_qo_heads = 32, num_kv_heads = 32, head_dim = 128;
  std::vector<int32_t> qo_lens, kv_lens;
  bool causal = true;
  float soft_cap = 0.0f;
  int page_size = 0;  // 0: ragged KV

  // Visible (query, key) pairs: query i of a request sits at kv_len - qo_len + i.
  double visible_pairs() const {
    double pairs = 0;
    for (size_t b = 0; b < qo_lens.size(); ++b) {
      const double q = qo_lens[b], k = kv_lens[b];
      pairs += causal ? q * (k - q) + q * (q + 1) / 2 : q * k;
    }
    return pairs;
  }
  double flops() const { return 4.0 * visible_pairs() * num_qo_heads * head_dim; }
};

std::vector<PrefillBenchCase> prefill_cases(bool quick) {
  std::vector<PrefillBenchCase> cases;
  auto add = [&](std::string id, std::string name, int hq, int hkv, int d, std::vector<int32_t> qo,
                 std::vector<int32_t> kv, bool causal, float cap = 0.0f, int page = 0) {
    cases.push_back({std::move(id), std::move(name), hq, hkv, d, std::move(qo), std::move(kv), causal, cap, page});
  };
  auto same = [](int b, int32_t len) { return std::vector<int32_t>(size_t(b), len); };
  const std::vector<int> dims = quick ? std::vector<int>{128} : std::vector<int>{64, 128, 256};
  const std::vector<int> batches = quick ? std::vector<int>{1} : std::vector<int>{1, 4, 16};
  for (int d : dims)
    for (bool causal : {true, false})
      for (int b : batches) {
        const int32_t len = 16384 / b;
        const int heads = d == 256 ? 16 : 32;
        add("hd" + std::to_string(d) + (causal ? "_causal_" : "_full_") + std::to_string(b) + "x" + std::to_string(len),
            std::to_string(b) + " x " + std::to_string(len) + (causal ? " causal" : ""), heads, heads, d, same(b, len),
            same(b, len), causal);
      }
  // Paged KV (the same 1 x 16k causal), soft-cap, GQA.
  add("hd128_causal_1x16384_p16", "1 x 16384 causal, page 16", 32, 32, 128, same(1, 16384), same(1, 16384), true, 0, 16);
  add("hd128_causal_1x16384_p1", "1 x 16384 causal, page 1", 32, 32, 128, same(1, 16384), same(1, 16384), true, 0, 1);
  add("hd128_causal_1x16384_softcap", "1 x 16384 causal, soft-cap 30", 32, 32, 128, same(1, 16384), same(1, 16384), true, 30.0f);
  add("hd128_causal_1x16384_gqa", "1 x 16384 causal, 32/8 heads", 32, 8, 128, same(1, 16384), same(1, 16384), true);
  if (!quick) {
    // A skewed ragged batch with 16k tokens (Zipf lengths) beside its uniform twin (16 x 1k above).
    auto zipf = kvattn::detail::zipf_lengths(16, 1024.0, 1.0, 11);
    add("hd128_causal_zipf16", "16 zipf (mean 1k) causal", 32, 32, 128, zipf, zipf, true);
    // Append (chunked prefill): 16 requests x 512 new tokens on 4k cached tokens, paged.
    add("hd128_append_16x512_on_4k_p16", "append 16 x 512 on 4k, page 16", 32, 8, 128, same(16, 512),
        same(16, 4096 + 512), true, 0, 16);
  }
  return cases;
}

#if KVATTN_WITH_CUDA
void cuda_ok(cudaError_t e, const char* what) { kvattn::cuda::check(e, what); }

struct DeviceBytes {
  void* ptr = nullptr;
  explicit DeviceBytes(size_t n) { cuda_ok(cudaMalloc(&ptr, std::max<size_t>(n, 1)), "cudaMalloc"); }
  ~DeviceBytes() { cudaFree(ptr); }
  DeviceBytes(const DeviceBytes&) = delete;
};

nlohmann::json run_prefill_case(const PrefillBenchCase& c, int iters, double peak_tflops) {
  using kvattn::DType;
  using kvattn::TensorView;
  const auto dev = kvattn::Device::cuda(0);
  const int D = c.head_dim, B = int(c.qo_lens.size()), P = c.page_size;
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0}, page_indptr{0}, last;
  for (int b = 0; b < B; ++b) {
    qo_indptr.push_back(qo_indptr.back() + c.qo_lens[size_t(b)]);
    kv_indptr.push_back(kv_indptr.back() + c.kv_lens[size_t(b)]);
    if (P > 0) {
      const int32_t pages = (c.kv_lens[size_t(b)] + P - 1) / P;
      page_indptr.push_back(page_indptr.back() + pages);
      last.push_back(pages ? c.kv_lens[size_t(b)] - (pages - 1) * P : 0);
    }
  }
  const int64_t nq = qo_indptr.back(), nkv = kv_indptr.back();
  const int64_t pages = P > 0 ? page_indptr.back() : 0;
  std::vector<int32_t> page_ids(static_cast<size_t>(pages));
  std::iota(page_ids.begin(), page_ids.end(), 0);
  std::shuffle(page_ids.begin(), page_ids.end(), std::mt19937(1));  // scattered pages
  const int64_t kv_rows = P > 0 ? pages * P : nkv;

  const size_t q_bytes = size_t(nq) * c.num_qo_heads * D * 2, kv_bytes = size_t(kv_rows) * c.num_kv_heads * D * 2;
  DeviceBytes q(q_bytes), out(q_bytes), k(kv_bytes), v(kv_bytes);
  // bf16 0x3c3c ~ 0.0115 everywhere: timing does not depend on the values.
  for (auto* buf : {&q, &k, &v}) cuda_ok(cudaMemset(buf->ptr, 0x3c, buf == &q ? q_bytes : kv_bytes), "cudaMemset");
  const int64_t ws_bytes = int64_t(1) << 30;
  DeviceBytes ws(static_cast<size_t>(ws_bytes));

  kvattn::BatchPrefill prefill(TensorView(ws.ptr, DType::u8, {ws_bytes}, dev));
  kvattn::BatchPrefillPlan plan;
  plan.num_qo_heads = c.num_qo_heads;
  plan.num_kv_heads = c.num_kv_heads;
  plan.head_dim_qk = D;
  plan.q_dtype = DType::bf16;
  plan.variant = c.causal ? kvattn::variants::causal() : kvattn::Variant{};
  if (c.soft_cap > 0) plan.variant = plan.variant.with_soft_cap(c.soft_cap);
  plan.qo_indptr = TensorView(qo_indptr.data(), DType::i32, {int64_t(qo_indptr.size())});
  if (P > 0) {
    plan.page_table = kvattn::PageTable{TensorView(page_indptr.data(), DType::i32, {int64_t(page_indptr.size())}),
                                        TensorView(page_ids.data(), DType::i32, {pages}),
                                        TensorView(last.data(), DType::i32, {int64_t(B)})};
    plan.page_size = P;
  } else {
    plan.kv_indptr = TensorView(kv_indptr.data(), DType::i32, {int64_t(kv_indptr.size())});
  }
  cuda_ok(cudaDeviceSynchronize(), "setup");
  for (int i = 0; i < 3; ++i) prefill.plan(plan);
  cuda_ok(cudaDeviceSynchronize(), "warm-up plans");
  std::vector<double> plan_us;
  for (int i = 0; i < 10; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    prefill.plan(plan);
    plan_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(plan_us.begin(), plan_us.end());

  TensorView qv(q.ptr, DType::bf16, {nq, c.num_qo_heads, D}, dev);
  TensorView ov(out.ptr, DType::bf16, {nq, c.num_qo_heads, D}, dev);
  auto run = [&] {
    if (P > 0) {
      const auto cache = kvattn::PagedKVCache::split(TensorView(k.ptr, DType::bf16, {pages, P, c.num_kv_heads, D}, dev),
                                                     TensorView(v.ptr, DType::bf16, {pages, P, c.num_kv_heads, D}, dev),
                                                     kvattn::KVLayout::NHD);
      prefill.run(qv, cache, ov);
    } else {
      prefill.run(qv, TensorView(k.ptr, DType::bf16, {nkv, c.num_kv_heads, D}, dev),
                  TensorView(v.ptr, DType::bf16, {nkv, c.num_kv_heads, D}, dev), ov);
    }
  };
  for (int i = 0; i < 3; ++i) run();
  cuda_ok(cudaDeviceSynchronize(), "warm-up");
  std::vector<cudaEvent_t> ev(static_cast<size_t>(2 * iters));
  for (auto& e : ev) cuda_ok(cudaEventCreate(&e), "cudaEventCreate");
  for (int i = 0; i < iters; ++i) {
    cuda_ok(cudaEventRecord(ev[size_t(2 * i)]), "cudaEventRecord");
    run();
    cuda_ok(cudaEventRecord(ev[size_t(2 * i + 1)]), "cudaEventRecord");
  }
  cuda_ok(cudaDeviceSynchronize(), "timed runs");
  std::vector<float> ms(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) cudaEventElapsedTime(&ms[size_t(i)], ev[size_t(2 * i)], ev[size_t(2 * i + 1)]);
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  const double tflops = c.flops() / (med * 1e-3) / 1e12;
  return {{"op", "prefill"}, {"id", c.id}, {"case", c.name},
          {"heads", std::to_string(c.num_qo_heads) + "/" + std::to_string(c.num_kv_heads)},
          {"head_dim", D}, {"causal", c.causal}, {"soft_cap", c.soft_cap},
          {"kv", P > 0 ? "paged, page " + std::to_string(P) : std::string("ragged")},
          {"batch", B}, {"q_tokens", nq}, {"kv_tokens", nkv}, {"visible_pairs", c.visible_pairs()},
          {"ms", med}, {"TFLOPs", tflops}, {"pct_of_782", 100.0 * tflops / peak_tflops},
          {"plan_us", plan_us[plan_us.size() / 2]}};
}
#endif

void bench_prefill(bool quick, bool json, bool list, int iters, const std::vector<std::string>& only) {
  const auto cases = prefill_cases(quick);
  if (list) {
    for (const auto& c : cases) std::printf("%-36s %s (%s heads, hd %d)\n", c.id.c_str(), c.name.c_str(),
                                            (std::to_string(c.num_qo_heads) + "/" + std::to_string(c.num_kv_heads)).c_str(),
                                            c.head_dim);
    return;
  }
#if KVATTN_WITH_CUDA
  kvattn::cuda::require_cuda("kvattn bench prefill");
  nlohmann::json rows = nlohmann::json::array();
  if (!json)
    std::printf("%-34s %6s %4s %10s %9s %8s %9s\n", "prefill (bf16)", "heads", "hd", "time", "TFLOP/s", "% 782",
                "plan");
  for (const auto& c : cases) {
    if (!only.empty() && std::find(only.begin(), only.end(), c.id) == only.end()) continue;
    auto row = run_prefill_case(c, iters, 782.0);
    if (!json)
      std::printf("%-34s %6s %4d %7.3f ms %9.1f %7.1f%% %6.1f us\n", c.name.c_str(),
                  row["heads"].get<std::string>().c_str(), c.head_dim, row["ms"].get<double>(),
                  row["TFLOPs"].get<double>(), row["pct_of_782"].get<double>(), row["plan_us"].get<double>());
    std::fflush(stdout);
    rows.push_back(row);
  }
  if (json) std::cout << rows.dump(1) << "\n";
#else
  (void)json; (void)iters; (void)only;
  throw kvattn::Error("kvattn bench prefill needs the CUDA backend, and this build has none");
#endif
}

}  // namespace

void register_bench_prefill(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("prefill", "batch prefill/append: head dims 64/128/256, 16k tokens as 1 x 16k, "
                                              "4 x 4k, 16 x 1k, causal or not, ragged and paged, bf16");
  static bool quick = false, json = false, list = false;
  static int iters = 20;
  static std::vector<std::string> only;
  cmd->add_flag("--quick", quick, "a few shapes only");
  cmd->add_flag("--json", json, "print the rows as JSON");
  cmd->add_flag("--list", list, "list the cases (id, shape) and exit");
  cmd->add_option("--cases", only, "run only these case ids (see --list)")->delimiter(',');
  cmd->add_option("--iters", iters, "timed runs per shape (median reported)")->check(CLI::Range(1, 10000));
  cmd->callback([] { bench_prefill(quick, json, list, iters, only); });
}
