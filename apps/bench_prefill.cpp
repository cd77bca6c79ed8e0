// `kvattn bench prefill`: batch prefill/append on the GPU (BatchPrefill with a CUDA workspace),
// timed with CUDA events, median of many runs; TFLOP/s with the visible (query, key) pairs counted
// exactly (causal masks aligned bottom-right), against the H200's measured 782 TFLOP/s bf16 GEMM
// rate (../shared/ANCHORS.md). Shapes follow the peers' anchors: 16k tokens as 1 x 16k, 4 x 4k and
// 16 x 1k; head dims 64/128/256 (32 heads, 16 for 256); causal and not; ragged and paged (page 1
// and 16); soft-cap; GQA; a skewed ragged batch and an append batch on a cached prefix.
// --save-io DIR exports each case's inputs and outputs for the side-by-side run with the peers
// (bench/run-peers; apps/bench_io.h, bench/peers/README.md).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_common.h"
#include "bench_io.h"
#include "bench_variants.h"
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
  bool alibi = false;  // kvattn only: the peers' runner (bench/peers) skips ALiBi cases

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
  std::string heads() const { return std::to_string(num_qo_heads) + "/" + std::to_string(num_kv_heads); }
  // The fields a --list --json entry and an export's manifest entry share (bench/peers/README.md).
  nlohmann::json fields() const {
    return {{"op", "prefill"}, {"id", id}, {"case", name}, {"heads", heads()}, {"num_qo_heads", num_qo_heads},
            {"num_kv_heads", num_kv_heads}, {"head_dim_qk", head_dim}, {"head_dim_vo", head_dim},
            {"kv", page_size > 0 ? "paged" : "ragged"}, {"kv_layout", "NHD"}, {"page_size", page_size},
            {"batch", qo_lens.size()}, {"qo_lens", qo_lens}, {"kv_lens", kv_lens},
            {"q_tokens", std::accumulate(qo_lens.begin(), qo_lens.end(), int64_t(0))},
            {"kv_tokens", std::accumulate(kv_lens.begin(), kv_lens.end(), int64_t(0))}, {"causal", causal},
            {"soft_cap", soft_cap}, {"alibi", alibi}, {"sm_scale", 1.0 / std::sqrt(double(head_dim))},
            {"lse_base", 2}};
  }
};

struct PrefillBenchOptions {
  bool quick = false, json = false, list = false;
  bool device_table = false;  // paged cases: page ids on the device, read in place by the kernels
  int iters = 20;
  std::vector<std::string> cases;  // case ids to run; empty: every case
  std::string save_io;              // export directory; empty: none
  int64_t save_io_kv_mb = 256;
  std::string variant = "plain";               // --variant (apps/bench_variants.h), on top of the case's
  std::string examples = "examples/variants";  // where the user variants' sources are
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
    // ALiBi beside its twin above (GQA group 4, where its kernel used to spill).
    add("hd128_causal_1x16384_gqa_alibi", "1 x 16384 causal, 32/8, ALiBi", 32, 8, 128, same(1, 16384), same(1, 16384),
        true);
    cases.back().alibi = true;
    // Soft-cap beside the plain twins of the other head dims (hd 256 with Gemma 2's cap 50) and of
    // GQA-packed CTAs.
    add("hd64_causal_1x16384_softcap", "1 x 16384 causal, soft-cap 30", 32, 32, 64, same(1, 16384), same(1, 16384),
        true, 30.0f);
    add("hd256_causal_1x16384_softcap", "1 x 16384 causal, soft-cap 50", 16, 16, 256, same(1, 16384),
        same(1, 16384), true, 50.0f);
    add("hd128_causal_1x16384_gqa_softcap", "1 x 16384 causal, 32/8, soft-cap 30", 32, 8, 128, same(1, 16384),
        same(1, 16384), true, 30.0f);
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
using kvattn_cli::cuda_ok;
struct DeviceBytes {
  void* ptr = nullptr;
  explicit DeviceBytes(size_t n) { cuda_ok(cudaMalloc(&ptr, std::max<size_t>(n, 1)), "cudaMalloc"); }
  ~DeviceBytes() { cudaFree(ptr); }
  DeviceBytes(const DeviceBytes&) = delete;
};

nlohmann::json run_prefill_case(const PrefillBenchCase& c, int iters, bool device_table, double peak_tflops,
                                kvattn_cli::IoExport* io, const PrefillBenchOptions& o) {
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
  // The generator's values (apps/bench_io.h), with or without --save-io; paged: every slot of
  // every page. Not a constant fill: with equal values the row maxima never move (no O rescale)
  // and the tensor cores draw less power, which measured hd 128 causal 1 x 16k 7% faster (H200,
  // 2026-11-30 at 29ac2ce) than on the values the peers get.
  kvattn_cli::upload_bench_values(static_cast<uint16_t*>(q.ptr), q_bytes / 2, kvattn_cli::kSeedQ, kvattn_cli::kScaleQ);
  kvattn_cli::upload_bench_values(static_cast<uint16_t*>(k.ptr), kv_bytes / 2, kvattn_cli::kSeedK, kvattn_cli::kScaleKV);
  kvattn_cli::upload_bench_values(static_cast<uint16_t*>(v.ptr), kv_bytes / 2, kvattn_cli::kSeedV, kvattn_cli::kScaleKV);
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
  if (c.alibi) plan.variant = plan.variant.with_alibi();
  const kvattn_cli::BenchVariant bench_variant = kvattn_cli::make_bench_variant(
      o.variant, plan.variant, c.num_qo_heads, *std::max_element(c.kv_lens.begin(), c.kv_lens.end()), B, o.examples);
  plan.variant = bench_variant.variant;
  plan.qo_indptr = TensorView(qo_indptr.data(), DType::i32, {int64_t(qo_indptr.size())});
  if (P > 0) {
    plan.page_table = kvattn::PageTable{TensorView(page_indptr.data(), DType::i32, {int64_t(page_indptr.size())}),
                                        TensorView(page_ids.data(), DType::i32, {pages}),
                                        TensorView(last.data(), DType::i32, {int64_t(B)})};
    plan.page_size = P;
  } else {
    plan.kv_indptr = TensorView(kv_indptr.data(), DType::i32, {int64_t(kv_indptr.size())});
  }
  DeviceBytes device_ids(size_t(pages) * 4);
  if (P > 0 && device_table) {  // plan() then reads only indptr and last_page_len
    cuda_ok(cudaMemcpy(device_ids.ptr, page_ids.data(), size_t(pages) * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    plan.page_table->indices = TensorView(device_ids.ptr, DType::i32, {pages}, dev);
  }
  cuda_ok(cudaDeviceSynchronize(), "setup");
  double first_plan_us = 0;  // the process's first plan() of the case: its kernels compiled or loaded
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    prefill.plan(plan);
    if (i == 0) first_plan_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
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
  auto run = [&](const TensorView& lse = {}) {
    if (P > 0) {
      const auto cache = kvattn::PagedKVCache::split(TensorView(k.ptr, DType::bf16, {pages, P, c.num_kv_heads, D}, dev),
                                                     TensorView(v.ptr, DType::bf16, {pages, P, c.num_kv_heads, D}, dev),
                                                     kvattn::KVLayout::NHD);
      prefill.run(qv, cache, ov, lse);
    } else {
      prefill.run(qv, TensorView(k.ptr, DType::bf16, {nkv, c.num_kv_heads, D}, dev),
                  TensorView(v.ptr, DType::bf16, {nkv, c.num_kv_heads, D}, dev), ov, lse);
    }
  };
  const double med = kvattn_cli::median_ms([&](int) { run(); }, 1, iters);
  prefill.check_errors();
  // TFLOP/s over the pairs the variant leaves visible (document masking: those within documents).
  const double tflops = c.flops() * bench_variant.visible_fraction / (med * 1e-3) / 1e12;
  nlohmann::json row = {{"op", "prefill"}, {"id", c.id}, {"case", c.name}, {"heads", c.heads()},
          {"head_dim", D}, {"causal", c.causal}, {"soft_cap", c.soft_cap}, {"alibi", c.alibi},
          {"variant", o.variant}, {"visible_fraction", bench_variant.visible_fraction},
          {"kv", P > 0 ? "paged, page " + std::to_string(P) : std::string("ragged")},
          {"page_ids", P > 0 ? (device_table ? "device" : "host") : "-"},
          {"batch", B}, {"q_tokens", nq}, {"kv_tokens", nkv}, {"qo_lens", c.qo_lens}, {"kv_lens", c.kv_lens},
          {"visible_pairs", c.visible_pairs()},
          {"ms", med}, {"TFLOPs", tflops}, {"pct_of_782", 100.0 * tflops / peak_tflops},
          {"plan_us", plan_us[plan_us.size() / 2]}, {"first_plan_ms", first_plan_us / 1e3},
          {"kernel", prefill.kernel_name()}};
  if (io) {  // one more run, with lse, into a poisoned out (0xffff: NaN); then export everything
    DeviceBytes lse(size_t(nq) * c.num_qo_heads * 4);
    cuda_ok(cudaMemset(out.ptr, 0xff, q_bytes), "cudaMemset");
    run(TensorView(lse.ptr, DType::f32, {nq, c.num_qo_heads}, dev));
    cuda_ok(cudaDeviceSynchronize(), "run with lse");
    kvattn_cli::PrefillCaseIo e;
    e.id = c.id;
    e.fields = c.fields();
    e.fields["num_pages"] = pages;
    e.fields["row"] = row;
    e.nnz_q = nq, e.nnz_kv = nkv, e.num_qo_heads = c.num_qo_heads, e.num_kv_heads = c.num_kv_heads;
    e.head_dim_qk = D, e.head_dim_vo = D, e.num_pages = pages, e.page_size = P;
    e.q = static_cast<const uint16_t*>(q.ptr), e.k = static_cast<const uint16_t*>(k.ptr);
    e.v = static_cast<const uint16_t*>(v.ptr), e.out = static_cast<const uint16_t*>(out.ptr);
    e.lse = static_cast<const float*>(lse.ptr);
    e.qo_indptr = &qo_indptr, e.kv_indptr = &kv_indptr, e.page_indptr = &page_indptr, e.page_ids = &page_ids;
    e.last_page_len = &last;
    kvattn_cli::export_prefill_case(*io, e);
  }
  return row;
}
#endif

std::vector<PrefillBenchCase> selected_cases(const PrefillBenchOptions& o) {
  return kvattn_cli::pick_cases(prefill_cases(o.quick), o.cases, o.quick);
}

void bench_prefill(const PrefillBenchOptions& o) {
  const auto cases = selected_cases(o);
  if (o.list) {  // no GPU needed
    if (o.json) {
      nlohmann::json rows = nlohmann::json::array();
      for (const auto& c : cases) rows.push_back(c.fields());
      std::cout << rows.dump(1) << "\n";
      return;
    }
    for (const auto& c : cases)
      std::printf("%-36s %s (%s heads, hd %d)\n", c.id.c_str(), c.name.c_str(), c.heads().c_str(), c.head_dim);
    return;
  }
#if KVATTN_WITH_CUDA
  kvattn::cuda::require_cuda("kvattn bench prefill");
  std::unique_ptr<kvattn_cli::IoExport> io;
  if (!o.save_io.empty())
    io = std::make_unique<kvattn_cli::IoExport>(o.save_io, "kvattn bench prefill", o.save_io_kv_mb << 20);
  nlohmann::json rows = nlohmann::json::array();
  if (!o.json)
    std::printf("%-34s %6s %4s %10s %9s %8s %9s  %s\n", "prefill (bf16)", "heads", "hd", "time", "TFLOP/s", "% 782",
                "plan", "kernel");
  for (const auto& c : cases) {
    auto row = run_prefill_case(c, o.iters, o.device_table, 782.0, io.get(), o);
    if (!o.json)
      std::printf("%-34s %6s %4d %7.3f ms %9.1f %7.1f%% %6.1f us  %s\n", c.name.c_str(),
                  row["heads"].get<std::string>().c_str(), c.head_dim, row["ms"].get<double>(),
                  row["TFLOPs"].get<double>(), row["pct_of_782"].get<double>(), row["plan_us"].get<double>(),
                  row["kernel"].get<std::string>().c_str());
    std::fflush(stdout);
    rows.push_back(row);
  }
  if (o.json) std::cout << rows.dump(1) << "\n";
#else
  throw kvattn::Error("kvattn bench prefill needs the CUDA backend, and this build has none");
#endif
}

}  // namespace

void register_bench_prefill(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("prefill", "batch prefill/append: head dims 64/128/256, 16k tokens as 1 x 16k, "
                                              "4 x 4k, 16 x 1k, causal or not, ragged and paged, bf16");
  static PrefillBenchOptions o;
  cmd->add_flag("--quick", o.quick, "a few shapes only");
  cmd->add_flag("--json", o.json, "print the rows as JSON (with --list: the cases' shapes and per-request lengths)");
  cmd->add_flag("--list", o.list, "list the cases (id, shape) and run nothing; no GPU needed");
  cmd->add_option("--cases", o.cases, "run only these case ids, comma-separated (see --list)")->delimiter(',');
  cmd->add_option("--iters", o.iters, "timed runs per shape (median reported)")->check(CLI::Range(1, 10000));
  cmd->add_option("--variant", o.variant,
                  std::string("the variant, on top of the case's causal mask: ") + kvattn_cli::bench_variant_names());
  cmd->add_option("--examples", o.examples, "the directory of the user variants' sources (examples/variants)");
  cmd->add_flag("--device-table", o.device_table,
                "paged cases: give plan() the page ids on the device (read in place by the kernels, as serving "
                "frameworks keep them); by default they are host ids, copied into the workspace");
  cmd->add_option("--save-io", o.save_io,
                  "export each case's q, K/V (ragged, or the paged cache and page table), indptrs, out and lse "
                  "(.npy) and DIR/manifest.json for bench/run-peers; q and K/V then hold generated values")
      ->type_name("DIR");
  cmd->add_option("--save-io-kv-mb", o.save_io_kv_mb,
                  "with --save-io, write a case's K and V only when together at most this many MiB, and q only "
                  "when at most this many (readers regenerate larger ones from the manifest's generator)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  cmd->callback([] { bench_prefill(o); });
}
