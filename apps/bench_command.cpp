// `kvattn bench decode`: paged batch decode on the GPU, timed with CUDA events on a cold L2
// (several copies of the KV cache in rotation), median of many runs, GB/s against the H200's
// 4.8 TB/s, plan() time on the host (page ids on the device, and on the host); a table, and JSON
// with --json. --cases picks cases by id (--list lists them); --save-io DIR exports each case's
// inputs and outputs for the side-by-side run with the peers (bench/run-peers, apps/bench_io.h).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <map>
#include <memory>
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

struct DecodeBenchCase {
  std::string id;    // stable and file-name safe: b64_l4096_h32-8, zipf64_h32-8, ... (--list)
  std::string name;  // the rows' "case"
  int num_qo_heads, num_kv_heads;
  std::vector<int32_t> lens;
  int page_size = 16;

  std::string heads() const { return std::to_string(num_qo_heads) + "/" + std::to_string(num_kv_heads); }
  int64_t kv_tokens() const { return std::accumulate(lens.begin(), lens.end(), int64_t(0)); }
  double kv_gb() const { return double(kv_tokens()) * 2 * num_kv_heads * 128 * 2 / 1e9; }  // as bf16
  bool too_big() const { return kv_gb() > 40; }  // 256 x 32k with 32 KV heads is 137 GB: more than the card holds
};

std::vector<DecodeBenchCase> decode_cases(bool quick) {
  std::vector<DecodeBenchCase> cases;
  const std::vector<int> batches = quick ? std::vector<int>{1, 64} : std::vector<int>{1, 16, 64, 256};
  const std::vector<int> lens = quick ? std::vector<int>{4096} : std::vector<int>{512, 4096, 32768};
  auto id = [](int b, int l, int hq, int hkv) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "b%d_l%d_h%d-%d", b, l, hq, hkv);
    return std::string(buf);
  };
  for (auto [hq, hkv] : {std::pair{32, 8}, std::pair{32, 32}})
    for (int b : batches)
      for (int l : lens)
        cases.push_back({id(b, l, hq, hkv), std::to_string(b) + " x " + std::to_string(l), hq, hkv,
                         std::vector<int32_t>(size_t(b), l)});
  // Skewed batches and their uniform twins with the same total KV.
  auto zipf = kvattn::detail::zipf_lengths(64, 4096.0, 1.0, 7);
  cases.push_back({"zipf64_h32-8", "64 zipf (mean 4k)", 32, 8, zipf});
  auto one_long = kvattn::detail::one_long_lengths(32768, 63, 512);
  cases.push_back({"long32k_63x512_h32-8", "1 x 32k + 63 x 512", 32, 8, one_long});
  int64_t total = std::accumulate(one_long.begin(), one_long.end(), int64_t(0));
  cases.push_back({id(64, int(total / 64), 32, 8), "64 x " + std::to_string(total / 64) + " (same total)", 32, 8,
                   std::vector<int32_t>(64, int32_t(total / 64))});
  cases.push_back({"b64_l4096_p1_h32-8", "64 x 4096, page 1", 32, 8, std::vector<int32_t>(64, 4096), 1});
  // MQA and large GQA groups (one KV head read for 32 or 64 query heads).
  if (!quick)
    for (auto [hq, hkv] : {std::pair{32, 1}, std::pair{64, 1}, std::pair{64, 8}})
      cases.push_back({id(64, 4096, hq, hkv), "64 x 4096", hq, hkv, std::vector<int32_t>(64, 4096)});
  return cases;
}

struct DecodeBenchOptions {
  bool quick = false, json = false, list = false;
  int iters = 30;
  std::vector<std::string> cases;  // case ids to run; empty: every case
  std::string save_io;  // export directory; empty: none
  int64_t save_io_kv_mb = 256;
  int workers = 0;  // SchedulerOptions::num_workers; 0: the library's default
  bool via_prefill = false;  // time BatchPrefill (one query per request) instead of BatchDecode
  bool host_table = false;   // time runs whose page ids were copied from the host at plan()
  bool no_split = false;     // SchedulerOptions::disable_split_kv
  int split_size = 0;        // SchedulerOptions::fixed_split_size; 0: the planner decides
  bool hnd = false;          // read the cache as HND ([page, head, token, dim]) instead of NHD
  std::vector<int32_t> kv_lens;  // --kv-lens: one more case, "custom_h32-8", of these lengths
  kvattn::DType kv_dtype = kvattn::DType::bf16;  // --kv-dtype: bf16, or fp8 (e4m3/e5m2) with k/v scales
  std::string variant = "plain";                 // --variant (apps/bench_variants.h)
  std::string examples = "examples/variants";    // where the user variants' sources are
};

std::vector<DecodeBenchCase> selected_cases(const DecodeBenchOptions& o) {
  auto all = decode_cases(o.quick);
  if (!o.kv_lens.empty()) {
    const auto& l = o.kv_lens;
    const bool uniform = std::all_of(l.begin(), l.end(), [&](int32_t x) { return x == l[0]; });
    const int64_t total = std::accumulate(l.begin(), l.end(), int64_t(0));
    all.push_back({"custom_h32-8",
                   uniform ? std::to_string(l.size()) + " x " + std::to_string(l[0])
                           : std::to_string(l.size()) + " custom (mean " + std::to_string(total / int64_t(l.size())) + ")",
                   32, 8, l});
  }
  return kvattn_cli::pick_cases(std::move(all), o.cases, o.quick);
}

// --list: the cases' ids and sizes; no GPU needed.
void list_decode_cases(const DecodeBenchOptions& o) {
  const auto cases = selected_cases(o);
  nlohmann::json rows = nlohmann::json::array();
  if (!o.json) std::printf("%-24s %-28s %6s %6s %10s %7s\n", "id", "case", "heads", "batch", "kv tokens", "KV GB");
  for (const auto& c : cases) {
    if (o.json)
      rows.push_back({{"id", c.id}, {"case", c.name}, {"heads", c.heads()}, {"batch", c.lens.size()},
                      {"kv_tokens", c.kv_tokens()}, {"page_size", c.page_size}, {"kv_gb", c.kv_gb()},
                      {"skipped", c.too_big()}});
    else
      std::printf("%-24s %-28s %6s %6zu %10lld %7.2f%s\n", c.id.c_str(), c.name.c_str(), c.heads().c_str(),
                  c.lens.size(), static_cast<long long>(c.kv_tokens()), c.kv_gb(), c.too_big() ? "  skipped" : "");
  }
  if (o.json) std::cout << rows.dump(1) << "\n";
}

#if KVATTN_WITH_CUDA
using kvattn_cli::cuda_ok;
using kvattn_cli::DeviceBuffer;

nlohmann::json run_decode_case(const DecodeBenchCase& c, const DecodeBenchOptions& o, double peak_gbps,
                               kvattn_cli::IoExport* io) {
  const int iters = o.iters;
  const bool via_prefill = o.via_prefill;
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
  const DType kv_dtype = o.kv_dtype;
  const size_t kv_es = kvattn::dtype_size(kv_dtype);
  const double kv_bytes = double(tokens) * 2 * c.num_kv_heads * D * double(kv_es);
  // Enough copies of the cache that one run's data has left the 60 MB L2 before it is read again.
  const int copies = int(std::clamp<double>(std::ceil(256e6 / (2.0 * cache_elems * kv_es)), 1, 8));
  DeviceBuffer<char> kv(2 * cache_elems * kv_es * size_t(copies));
  DeviceBuffer<uint16_t> q(size_t(B) * c.num_qo_heads * D), out(size_t(B) * c.num_qo_heads * D);
  {
    // The generator's values (apps/bench_io.h), the same in every copy. (Before 370aabc the
    // timed runs used a constant fill: every score equal, no softmax maximum ever moving.)
    kvattn_cli::upload_bench_values(q.ptr, size_t(B) * c.num_qo_heads * D, kvattn_cli::kSeedQ, kvattn_cli::kScaleQ);
    if (kv_es == 2)
      kvattn_cli::upload_bench_kv(reinterpret_cast<uint16_t*>(kv.ptr), cache_elems, copies, io != nullptr);
    else
      kvattn_cli::upload_bench_kv_fp8(reinterpret_cast<uint8_t*>(kv.ptr), cache_elems, copies,
                                      kv_dtype == DType::e5m2);
  }
  const int64_t ws_bytes = int64_t(512) << 20;
  DeviceBuffer<char> ws(static_cast<size_t>(ws_bytes));

  kvattn::BatchDecode decode(TensorView(ws.ptr, DType::u8, {ws_bytes}, kvattn::Device::cuda(0)),
                            o.hnd ? kvattn::KVLayout::HND : kvattn::KVLayout::NHD);
  kvattn::BatchDecodePlan plan;
  plan.num_qo_heads = c.num_qo_heads;
  plan.num_kv_heads = c.num_kv_heads;
  plan.head_dim_qk = D;
  plan.q_dtype = DType::bf16;
  plan.kv_dtype = kv_dtype;
  // fp8: the generator's values times 16 stored (bench_io.h, fill_bench_fp8), 1/16 back in the scales.
  if (kv_es == 1) plan.variant = kvattn::Variant{}.with_scales(1.0f, kvattn_cli::kFp8KVScale, kvattn_cli::kFp8KVScale);
  const kvattn_cli::BenchVariant bench_variant = kvattn_cli::make_bench_variant(
      o.variant, plan.variant, c.num_qo_heads, *std::max_element(c.lens.begin(), c.lens.end()), B, o.examples);
  plan.variant = bench_variant.variant;
  plan.page_size = P;
  plan.scheduler.num_workers = o.workers;
  plan.scheduler.disable_split_kv = o.no_split;
  plan.scheduler.fixed_split_size = o.split_size;
  plan.page_table = {TensorView(indptr.data(), DType::i32, {int64_t(indptr.size())}),
                     TensorView(indices.data(), DType::i32, {pages}),
                     TensorView(last.data(), DType::i32, {int64_t(B)})};
  auto cache_view = [&](int copy) {
    char* base = kv.ptr + size_t(copy) * 2 * cache_elems * kv_es;
    auto dev = kvattn::Device::cuda(0);
    if (o.hnd)
      return kvattn::PagedKVCache::split(TensorView(base, kv_dtype, {pages, c.num_kv_heads, P, D}, dev),
                                         TensorView(base + cache_elems * kv_es, kv_dtype, {pages, c.num_kv_heads, P, D}, dev),
                                         kvattn::KVLayout::HND);
    return kvattn::PagedKVCache::split(TensorView(base, kv_dtype, {pages, P, c.num_kv_heads, D}, dev),
                                       TensorView(base + cache_elems * kv_es, kv_dtype, {pages, P, c.num_kv_heads, D}, dev),
                                       kvattn::KVLayout::NHD);
  };
  TensorView qv(q.ptr, DType::bf16, {B, c.num_qo_heads, D}, kvattn::Device::cuda(0));
  TensorView ov(out.ptr, DType::bf16, {B, c.num_qo_heads, D}, kvattn::Device::cuda(0));
  // plan() time (time_plans: median and 90th percentile of 200, each plan followed by its run and
  // a synchronisation, as in a serving step) with the page ids on the host (copied each plan) and
  // on the device (read in place; what the timed runs below use, as serving frameworks keep the
  // page table on the GPU).
  DeviceBuffer<int32_t> device_indices(static_cast<size_t>(pages));
  cuda_ok(cudaMemcpy(device_indices.ptr, indices.data(), size_t(pages) * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  cuda_ok(cudaDeviceSynchronize(), "setup");
  auto plan_times_of = [&] {
    int step = 0;
    return kvattn_cli::time_plans([&] { decode.plan(plan); },
                                  [&] {
                                    decode.run(qv, cache_view(step++ % copies), ov);
                                    cuda_ok(cudaDeviceSynchronize(), "a step's run");
                                  });
  };
  const kvattn_cli::PlanTimes plan_host_table = plan_times_of();
  plan.page_table.indices = TensorView(device_indices.ptr, DType::i32, {pages}, kvattn::Device::cuda(0));
  const kvattn_cli::PlanTimes plan_times = plan_times_of();
  const double plan_us = plan_times.median_us, plan_host_table_us = plan_host_table.median_us;
  if (o.host_table) {  // --host-table: the timed runs read the workspace's copy of the page ids
    plan.page_table.indices = TensorView(indices.data(), DType::i32, {pages});
    decode.plan(plan);
  }
  // --via-prefill: the same step on the prefill kernels (one query token per request), for the
  // decode-on-prefill heuristic of the prefill issue; page ids as for BatchDecode (device unless
  // --host-table).
  std::vector<int32_t> qo_indptr(size_t(B) + 1);
  std::iota(qo_indptr.begin(), qo_indptr.end(), 0);
  kvattn::BatchPrefill prefill(TensorView(ws.ptr, DType::u8, {ws_bytes}, kvattn::Device::cuda(0)),
                                o.hnd ? kvattn::KVLayout::HND : kvattn::KVLayout::NHD);
  if (via_prefill) {
    kvattn::BatchPrefillPlan pp;
    static_cast<kvattn::AttentionShape&>(pp) = plan;
    pp.qo_indptr = TensorView(qo_indptr.data(), DType::i32, {int64_t(B) + 1});
    pp.page_table = plan.page_table;
    pp.page_size = P;
    prefill.plan(pp);
  }
  auto run_once = [&](int copy) {
    if (via_prefill)
      prefill.run(qv, cache_view(copy), ov);
    else
      decode.run(qv, cache_view(copy), ov);
  };
  const double med = kvattn_cli::median_ms(run_once, copies, iters);
  // (the plan that ran last owns the workspace's error record)
  via_prefill ? prefill.check_errors() : decode.check_errors();
  const double bytes = kv_bytes + 2.0 * B * c.num_qo_heads * D * 2;
  const kvattn::Plan* timed_plan = via_prefill ? prefill.schedule() : decode.schedule();  // what ran
  const double gbps = bytes / (med * 1e-3) / 1e9;
  nlohmann::json row = {{"op", "decode"}, {"id", c.id}, {"case", c.name}, {"heads", c.heads()},
          {"kv_dtype", kvattn::dtype_name(kv_dtype)}, {"variant", o.variant},
          {"batch", B}, {"kv_tokens", tokens}, {"page_size", P}, {"ms", med}, {"GBps", gbps},
          {"pct_of_4800", 100.0 * gbps / peak_gbps}, {"plan_us", plan_us}, {"plan_p90_us", plan_times.p90_us},
          {"plan_host_table_us", plan_host_table_us}, {"plan_host_table_p90_us", plan_host_table.p90_us},
          {"first_plan_ms", plan_host_table.first_us / 1e3},
          {"l2_copies", copies}, {"workers", timed_plan ? timed_plan->num_workers() : 0},
          {"kernels", via_prefill ? "prefill" : std::string(decode.kernel_family())},
          {"kernel", via_prefill ? prefill.kernel_name() : decode.kernel_name()},
          {"page_ids", o.host_table ? "host" : "device"},
          {"items", timed_plan ? timed_plan->num_items() : 0},
          {"merges", timed_plan ? timed_plan->num_merges() : 0}};
  if (io) {  // one more run on copy 0, with lse, into a poisoned out; then export everything
    DeviceBuffer<float> lse(size_t(B) * c.num_qo_heads);
    cuda_ok(cudaMemset(out.ptr, 0xff, size_t(B) * c.num_qo_heads * D * 2), "cudaMemset");
    decode.run(qv, cache_view(0), ov, TensorView(lse.ptr, DType::f32, {B, c.num_qo_heads}, kvattn::Device::cuda(0)));
    cuda_ok(cudaDeviceSynchronize(), "run with lse");
    decode.check_errors();
    kvattn_cli::DecodeCaseIo e;
    e.id = c.id;
    e.fields = {{"op", "decode"}, {"case", c.name}, {"heads", c.heads()}, {"num_qo_heads", c.num_qo_heads},
                {"num_kv_heads", c.num_kv_heads}, {"head_dim_qk", D}, {"head_dim_vo", D}, {"page_size", P},
                {"num_pages", pages}, {"batch", B}, {"kv_lens", c.lens}, {"kv_tokens", tokens},
                {"kv_layout", "NHD"}, {"causal", false}, {"sm_scale", 1.0 / std::sqrt(double(D))},
                {"lse_base", 2}, {"row", row}};
    e.batch = B, e.num_qo_heads = c.num_qo_heads, e.num_kv_heads = c.num_kv_heads, e.head_dim = D;
    e.num_pages = pages, e.page_size = P;
    e.q = q.ptr, e.k_cache = reinterpret_cast<uint16_t*>(kv.ptr), e.v_cache = reinterpret_cast<uint16_t*>(kv.ptr) + cache_elems;
    e.out = out.ptr, e.lse = lse.ptr;
    e.indptr = &indptr, e.indices = &indices, e.last_page_len = &last;
    kvattn_cli::export_decode_case(*io, e);
  }
  return row;
}
#endif

void bench_decode(const DecodeBenchOptions& o) {
  if (o.list) return list_decode_cases(o);
  const bool json = o.json;
  const auto cases = selected_cases(o);
#if KVATTN_WITH_CUDA
  kvattn::cuda::require_cuda("kvattn bench decode");
  if (o.via_prefill && !o.save_io.empty())
    throw kvattn::Error("kvattn bench decode: --via-prefill and --save-io do not combine");
  if (o.hnd && !o.save_io.empty())
    throw kvattn::Error("kvattn bench decode: --hnd and --save-io do not combine (the export is NHD)");
  if (o.kv_dtype != kvattn::DType::bf16 && !o.save_io.empty())
    throw kvattn::Error("kvattn bench decode: --kv-dtype " + std::string(kvattn::dtype_name(o.kv_dtype)) +
                        " and --save-io do not combine (the export is bf16)");
  std::unique_ptr<kvattn_cli::IoExport> io;
  if (!o.save_io.empty())
    io = std::make_unique<kvattn_cli::IoExport>(o.save_io, "kvattn bench decode", o.save_io_kv_mb << 20);
  nlohmann::json rows = nlohmann::json::array();
  if (!json)
    std::printf("%-28s %6s %10s %10s %8s %9s %9s %10s\n",
                ("decode (" + std::string(kvattn::dtype_name(o.kv_dtype)) + " KV, hd 128)").c_str(), "heads", "time",
                "GB/s", "% 4.8T", "plan", "plan p90", "plan(host)");
  for (const auto& c : cases) {
    if (c.too_big()) {
      if (!json) std::printf("%-28s %6s skipped: %.0f GB of KV\n", c.name.c_str(), c.heads().c_str(), c.kv_gb());
      continue;
    }
    auto row = run_decode_case(c, o, 4800.0, io.get());
    if (!json)
      std::printf("%-28s %6s %8.1f us %10.0f %7.1f%% %6.1f us %6.1f us %7.1f us\n", c.name.c_str(),
                  row["heads"].get<std::string>().c_str(), row["ms"].get<double>() * 1e3,
                  row["GBps"].get<double>(), row["pct_of_4800"].get<double>(), row["plan_us"].get<double>(),
                  row["plan_p90_us"].get<double>(), row["plan_host_table_us"].get<double>());
    std::fflush(stdout);
    rows.push_back(row);
  }
  if (json) std::cout << rows.dump(1) << "\n";
#else
  (void)json;
  throw kvattn::Error("kvattn bench decode needs the CUDA backend, and this build has none");
#endif
}

}  // namespace

void register_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "GPU benchmarks (CUDA events, cold L2, median of runs)");
  bench->require_subcommand(1);
  register_bench_prefill(*bench);  // apps/bench_prefill.cpp
  register_bench_cascade(*bench);  // apps/bench_cascade.cpp
  register_bench_rope(*bench);     // apps/bench_rope.cpp
  auto* decode = bench->add_subcommand("decode", "paged batch decode: Llama-3-8B (32/8) and MHA 32/32 heads, "
                                                  "head dim 128, page 16, bf16; uniform and skewed batches");
  static DecodeBenchOptions o;
  decode->add_flag("--quick", o.quick, "a few shapes only");
  decode->add_flag("--json", o.json, "print the rows as JSON");
  decode->add_option("--iters", o.iters, "timed runs per shape (median reported)")->check(CLI::Range(1, 10000));
  decode->add_flag("--via-prefill", o.via_prefill,
                   "run each step on the prefill kernels (BatchPrefill, one query per request; no --save-io)");
  decode->add_flag("--host-table", o.host_table,
                   "time runs with the page ids given on the host (copied into the workspace by plan()); "
                   "by default they stay on the device, as serving frameworks keep them");
  decode->add_flag("--hnd", o.hnd, "read the paged cache as HND (page, head, token, dim) instead of NHD; not with --save-io");
  decode->add_option("--kv-dtype", o.kv_dtype, "KV cache dtype: bf16, or e4m3/e5m2 (fp8 with k/v scales; GB/s count fp8 bytes); not with --save-io")
      ->transform(CLI::CheckedTransformer(std::map<std::string, kvattn::DType>{
          {"bf16", kvattn::DType::bf16}, {"e4m3", kvattn::DType::e4m3}, {"e5m2", kvattn::DType::e5m2}}));
  decode->add_option("--variant", o.variant, std::string("the variant: ") + kvattn_cli::bench_variant_names());
  decode->add_option("--examples", o.examples, "the directory of the user variants' sources (examples/variants)");
  decode->add_flag("--no-split", o.no_split, "planner: one chunk per (request, KV head), no split-KV");
  decode->add_option("--split-size", o.split_size, "planner: KV chunks of exactly this many tokens")
      ->check(CLI::Range(0, 1 << 30));
  decode->add_option("--workers", o.workers, "planner workers (default: SMs x resident CTAs of the kernel)")
      ->check(CLI::Range(0, 1 << 20));
  decode->add_flag("--list", o.list, "list the cases (id, shape, KV size) and run nothing; no GPU needed");
  decode->add_option("--cases", o.cases, "run only these case ids, comma-separated (see --list)")
      ->delimiter(',');
  decode->add_option("--kv-lens", o.kv_lens,
                     "add a case of these KV lengths, comma-separated (32/8 heads, page 16; id custom_h32-8: "
                     "--cases custom_h32-8 runs it alone)")
      ->delimiter(',')
      ->check(CLI::Range(0, 1 << 24));
  decode->add_option("--save-io", o.save_io,
                     "export each case's q, paged K/V cache, page table, out and lse (.npy) and "
                     "DIR/manifest.json for bench/run-peers; q and K/V then hold generated values")
      ->type_name("DIR");
  decode->add_option("--save-io-kv-mb", o.save_io_kv_mb,
                     "with --save-io, write a case's K and V caches only when together at most this many MiB "
                     "(readers regenerate larger ones from the manifest's generator)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  decode->callback([] { bench_decode(o); });
}
