// `kvattn bench cascade`: one decode step of B requests that share a prefix of P tokens (in pages
// shared by all of them) and each own a suffix of S tokens, computed as a two-level cascade from
// kvattn's ops, beside plain paged decode over the same pages:
//   level 0  BatchPrefill: the B queries as ONE request (qo_len B, non-causal) over the prefix
//            pages -> o0, lse0 (the prefix is read once, not B times);
//   level 1  BatchDecode over each request's suffix pages -> o1, lse1;
//   merge    merge_state(o0, lse0, o1, lse1) -> out, lse;
//   flat     BatchDecode over each request's prefix + suffix pages (what the cascade replaces).
//   api      the same two levels through kvattn::CascadeAttention (the timed "cascade"; the pieces
//            above are timed alone and together as "pieces");
//   auto     BatchDecode over the flat page table with host page ids (SharedPrefix::automatic):
//            it finds the shared prefix and picks cascade or flat by its cost model ("chose").
// Timed as `kvattn bench decode` (CUDA events, cold L2 by rotating cache copies, median), plan()
// outside the timed region; the three steps are also timed alone. GB/s counts the flat step's
// bytes (every request's prefix + suffix K/V, q, out) for both, so the two compare as times.
// --save-io DIR exports q, the cache, the level-0, level-1 and flat page tables and both outputs
// for the side-by-side run with FlashInfer's cascade (bench/run-peers, apps/bench_io.h).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_common.h"
#include "bench_io.h"
#include "commands.h"
#include "kvattn/kvattn.h"

#if KVATTN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/runtime.h"
#endif

namespace {

// Llama-3-8B attention (32 query / 8 KV heads, head dim 128), bf16, page 16, NHD.
struct CascadeBenchCase {
  std::string id;  // casc_b64_p32768_s512 (--list, --cases)
  int batch = 0, prefix = 0, suffix = 0;
  int num_qo_heads = 32, num_kv_heads = 8, head_dim = 128, page_size = 16;

  std::string name() const {
    return std::to_string(batch) + " x (" + std::to_string(prefix) + " shared + " + std::to_string(suffix) + ")";
  }
  std::string heads() const { return std::to_string(num_qo_heads) + "/" + std::to_string(num_kv_heads); }
  int64_t prefix_pages() const { return prefix / page_size; }  // the prefix fills whole pages
  int64_t suffix_pages() const { return (suffix + page_size - 1) / page_size; }
  int64_t num_pages() const { return prefix_pages() + int64_t(batch) * suffix_pages(); }
  int64_t flat_kv_tokens() const { return int64_t(batch) * (prefix + suffix); }
  int64_t cascade_kv_tokens() const { return prefix + int64_t(batch) * suffix; }
  double kv_bytes(int64_t tokens) const { return double(tokens) * 2 * num_kv_heads * head_dim * 2; }
  double qo_bytes() const { return 2.0 * batch * num_qo_heads * head_dim * 2; }
  double flat_bytes() const { return kv_bytes(flat_kv_tokens()) + qo_bytes(); }
  // The fields a --list --json entry and an export's manifest entry share (bench/peers/README.md).
  nlohmann::json fields() const {
    return {{"op", "cascade"}, {"id", id}, {"case", name()}, {"heads", heads()}, {"num_qo_heads", num_qo_heads},
            {"num_kv_heads", num_kv_heads}, {"head_dim_qk", head_dim}, {"head_dim_vo", head_dim},
            {"page_size", page_size}, {"num_pages", num_pages()}, {"batch", batch}, {"prefix_len", prefix},
            {"suffix_len", suffix}, {"kv_lens", std::vector<int32_t>(size_t(batch), prefix + suffix)},
            {"kv_tokens", flat_kv_tokens()}, {"cascade_kv_tokens", cascade_kv_tokens()}, {"kv_layout", "NHD"},
            {"causal", false}, {"sm_scale", 1.0 / std::sqrt(double(head_dim))}, {"lse_base", 2}};
  }
};

std::vector<CascadeBenchCase> cascade_cases(bool quick) {
  std::vector<CascadeBenchCase> cases;
  auto add = [&](int b, int p, int s) {
    CascadeBenchCase c;
    c.id = "casc_b" + std::to_string(b) + "_p" + std::to_string(p) + "_s" + std::to_string(s);
    c.batch = b, c.prefix = p, c.suffix = s;
    // Level 0 is one prefill request with qo_len = batch <= kv_len = prefix; the flat page lists
    // append the suffix pages to the prefix pages, so the prefix must fill whole pages.
    if (p % c.page_size != 0 || p < b || s < 1)
      throw kvattn::Error("bench cascade: case " + c.id + " needs prefix % page_size == 0, prefix >= batch, suffix >= 1");
    cases.push_back(std::move(c));
  };
  if (quick) {
    add(64, 4096, 512);
    add(64, 32768, 512);
    return cases;
  }
  for (int b : {16, 64})
    for (int p : {4096, 32768}) add(b, p, 512);
  // ../shared/ANCHORS.md's cascade shapes (FlashInfer: 2.4x, 0.82x and 0.72x plain decode).
  add(128, 32768, 256);
  add(64, 8192, 512);
  add(256, 2048, 128);
  add(32, 1024, 77);  // suffixes ending in a partial page (13 of 16 slots)
  return cases;
}

struct CascadeBenchOptions {
  bool quick = false, json = false, list = false;
  int iters = 30;
  std::vector<std::string> cases;  // case ids to run; empty: every case
  std::string save_io;             // export directory; empty: none
  int64_t save_io_kv_mb = 256;
};

std::vector<CascadeBenchCase> selected_cases(const CascadeBenchOptions& o) {
  return kvattn_cli::pick_cases(cascade_cases(o.quick), o.cases, o.quick);
}

// --list: the cases' ids and sizes; no GPU needed.
void list_cascade_cases(const CascadeBenchOptions& o) {
  const auto cases = selected_cases(o);
  if (o.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& c : cases) rows.push_back(c.fields());
    std::cout << rows.dump(1) << "\n";
    return;
  }
  std::printf("%-24s %-28s %6s %7s %12s %12s\n", "id", "case", "heads", "pages", "flat KV GB", "casc. KV GB");
  for (const auto& c : cases)
    std::printf("%-24s %-28s %6s %7lld %12.2f %12.2f\n", c.id.c_str(), c.name().c_str(), c.heads().c_str(),
                static_cast<long long>(c.num_pages()), c.kv_bytes(c.flat_kv_tokens()) / 1e9,
                c.kv_bytes(c.cascade_kv_tokens()) / 1e9);
}

#if KVATTN_WITH_CUDA
// The three page tables of a case over one pool of num_pages() pages, shuffled (scattered, as in
// a serving cache): the prefix takes the pool's first prefix_pages(), then each request its
// suffix_pages().
struct CascadeTables {
  kvattn_cli::IoPageTable level0, level1, flat;
};

CascadeTables make_tables(const CascadeBenchCase& c) {
  std::vector<int32_t> pool(static_cast<size_t>(c.num_pages()));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), std::mt19937(1));
  const auto prefix_end = pool.begin() + c.prefix_pages();
  const int32_t B = c.batch, last = int32_t(c.suffix - (c.suffix_pages() - 1) * c.page_size);
  CascadeTables t;
  t.level0.qo_indptr = {0, B};
  t.level0.indptr = {0, int32_t(c.prefix_pages())};
  t.level0.indices.assign(pool.begin(), prefix_end);
  t.level0.last_page_len = {c.page_size};
  for (auto* level : {&t.level1, &t.flat}) {
    level->qo_indptr.resize(size_t(B) + 1);
    std::iota(level->qo_indptr.begin(), level->qo_indptr.end(), 0);
    level->indptr = {0};
  }
  for (int32_t b = 0; b < B; ++b) {
    const auto first = prefix_end + b * c.suffix_pages(), end = first + c.suffix_pages();
    t.level1.indices.insert(t.level1.indices.end(), first, end);
    t.flat.indices.insert(t.flat.indices.end(), pool.begin(), prefix_end);
    t.flat.indices.insert(t.flat.indices.end(), first, end);
    for (auto* level : {&t.level1, &t.flat}) {
      level->indptr.push_back(int32_t(level->indices.size()));
      level->last_page_len.push_back(last);
    }
  }
  return t;
}

using kvattn_cli::cuda_ok;
using kvattn_cli::DeviceBuffer;

using kvattn_cli::median_ms;

nlohmann::json run_cascade_case(const CascadeBenchCase& c, int iters, double peak_gbps, kvattn_cli::IoExport* io) {
  using kvattn::DType;
  using kvattn::TensorView;
  const auto dev = kvattn::Device::cuda(0);
  const int D = c.head_dim, P = c.page_size, B = c.batch, Hq = c.num_qo_heads, Hkv = c.num_kv_heads;
  const CascadeTables t = make_tables(c);
  const int64_t pages = c.num_pages();
  const size_t cache_elems = size_t(pages) * P * Hkv * D, qo_elems = size_t(B) * Hq * D;
  // Enough copies of the cache that one run's data has left the 60 MB L2 before it is read again.
  const int copies = int(std::clamp<double>(std::ceil(256e6 / (2.0 * cache_elems * 2)), 1, 8));
  DeviceBuffer<uint16_t> kv(2 * cache_elems * size_t(copies)), q(qo_elems), o0(qo_elems), o1(qo_elems),
      out(qo_elems), flat_out(qo_elems), auto_out(qo_elems);
  DeviceBuffer<float> lse0(size_t(B) * Hq), lse1(size_t(B) * Hq), lse(size_t(B) * Hq), flat_lse(size_t(B) * Hq);
  // The generator's values (apps/bench_io.h), the same in every copy; with --save-io the whole
  // caches. (Before 10cb283 the timed runs used a constant fill.)
  kvattn_cli::upload_bench_values(q.ptr, qo_elems, kvattn_cli::kSeedQ, kvattn_cli::kScaleQ);
  kvattn_cli::upload_bench_kv(kv.ptr, cache_elems, copies, io != nullptr);
  // Each wrapper stages its plan in its own workspace.
  const int64_t ws_bytes = int64_t(512) << 20;
  DeviceBuffer<char> ws0{size_t(ws_bytes)}, ws1{size_t(ws_bytes)}, ws_flat{size_t(ws_bytes)}, ws_api{size_t(ws_bytes)},
      ws_auto{size_t(ws_bytes)};
  auto workspace = [&](DeviceBuffer<char>& w) { return TensorView(w.ptr, DType::u8, {ws_bytes}, dev); };
  kvattn::BatchPrefill level0(workspace(ws0));
  kvattn::BatchDecode level1(workspace(ws1)), flat(workspace(ws_flat)), automatic(workspace(ws_auto));
  kvattn::CascadeAttention cascade(workspace(ws_api));

  // Page ids: level 0's on the host (BatchPrefill reads its page table there); level 1's and the
  // flat ones on the device, read in place by the decode kernels (bench decode's default).
  DeviceBuffer<int32_t> ids1(t.level1.indices.size()), ids_flat(t.flat.indices.size());
  cuda_ok(cudaMemcpy(ids1.ptr, t.level1.indices.data(), t.level1.indices.size() * 4, cudaMemcpyHostToDevice),
          "cudaMemcpy");
  cuda_ok(cudaMemcpy(ids_flat.ptr, t.flat.indices.data(), t.flat.indices.size() * 4, cudaMemcpyHostToDevice),
          "cudaMemcpy");
  auto host_i32 = [](const std::vector<int32_t>& v) { return TensorView(v.data(), DType::i32, {int64_t(v.size())}); };
  kvattn::AttentionShape shape;  // the default variant: no mask (every query sees all its keys)
  shape.num_qo_heads = Hq;
  shape.num_kv_heads = Hkv;
  shape.head_dim_qk = D;
  shape.q_dtype = DType::bf16;
  kvattn::BatchPrefillPlan p0;
  static_cast<kvattn::AttentionShape&>(p0) = shape;
  p0.qo_indptr = host_i32(t.level0.qo_indptr);
  p0.page_table = kvattn::PageTable{host_i32(t.level0.indptr), host_i32(t.level0.indices),
                                    host_i32(t.level0.last_page_len)};
  p0.page_size = P;
  kvattn::BatchDecodePlan p1, pf;
  static_cast<kvattn::AttentionShape&>(p1) = shape;
  static_cast<kvattn::AttentionShape&>(pf) = shape;
  p1.page_size = pf.page_size = P;
  p1.page_table = {host_i32(t.level1.indptr), TensorView(ids1.ptr, DType::i32, {int64_t(t.level1.indices.size())}, dev),
                   host_i32(t.level1.last_page_len)};
  pf.page_table = {host_i32(t.flat.indptr), TensorView(ids_flat.ptr, DType::i32, {int64_t(t.flat.indices.size())}, dev),
                   host_i32(t.flat.last_page_len)};
  // The API forms: CascadeAttention over the same two levels, and BatchDecode over the flat table
  // with host page ids, left to find the shared prefix itself (SharedPrefix::automatic).
  kvattn::CascadePlan pc;
  static_cast<kvattn::AttentionShape&>(pc) = shape;
  pc.page_size = P;
  pc.levels = {{p0.qo_indptr, *p0.page_table}, {host_i32(t.level1.qo_indptr), p1.page_table}};
  kvattn::BatchDecodePlan pa = pf;
  pa.page_table.indices = host_i32(t.flat.indices);
  pa.shared_prefix = kvattn::SharedPrefix::automatic;
  cuda_ok(cudaDeviceSynchronize(), "setup");
  auto cache_view = [&](int copy) {
    uint16_t* base = kv.ptr + size_t(copy) * 2 * cache_elems;
    return kvattn::PagedKVCache::split(TensorView(base, DType::bf16, {pages, P, Hkv, D}, dev),
                                       TensorView(base + cache_elems, DType::bf16, {pages, P, Hkv, D}, dev),
                                       kvattn::KVLayout::NHD);
  };
  auto state = [&](uint16_t* o) { return TensorView(o, DType::bf16, {B, Hq, D}, dev); };
  auto lse_view = [&](float* s) { return TensorView(s, DType::f32, {B, Hq}, dev); };
  const TensorView qv = state(q.ptr);
  auto run_level0 = [&](int copy) { level0.run(qv, cache_view(copy), state(o0.ptr), lse_view(lse0.ptr)); };
  auto run_level1 = [&](int copy) { level1.run(qv, cache_view(copy), state(o1.ptr), lse_view(lse1.ptr)); };
  auto run_merge = [&](int) {
    kvattn::merge_state(state(o0.ptr), lse_view(lse0.ptr), state(o1.ptr), lse_view(lse1.ptr), state(out.ptr),
                        lse_view(lse.ptr));
  };
  auto run_pieces = [&](int copy) {
    run_level0(copy);
    run_level1(copy);
    run_merge(copy);
  };
  auto run_cascade = [&](int copy) { cascade.run(qv, cache_view(copy), state(out.ptr), lse_view(lse.ptr)); };
  auto run_auto = [&](int copy) { automatic.run(qv, cache_view(copy), state(auto_out.ptr)); };
  // plan() time as in bench decode (time_plans): each plan followed by its step and a synchronisation.
  int step = 0;
  const double plan_us = kvattn_cli::time_plans(
                             [&] { cascade.plan(pc); },
                             [&] {
                               run_cascade(step++ % copies);
                               cuda_ok(cudaDeviceSynchronize(), "a cascade step");
                             })
                             .median_us;
  const double flat_plan_us = kvattn_cli::time_plans([&] { flat.plan(pf); },
                                                     [&] {
                                                       flat.run(qv, cache_view(step++ % copies), state(flat_out.ptr));
                                                       cuda_ok(cudaDeviceSynchronize(), "a flat step");
                                                     })
                                  .median_us;
  level0.plan(p0);
  level1.plan(p1);
  const double auto_plan_us = kvattn_cli::time_plans([&] { automatic.plan(pa); },
                                                     [&] {
                                                       run_auto(step++ % copies);
                                                       cuda_ok(cudaDeviceSynchronize(), "an automatic step");
                                                     })
                                  .median_us;
  const std::string auto_family(automatic.kernel_family());
  const double ms = median_ms(run_cascade, copies, iters);
  const double pieces_ms = median_ms(run_pieces, copies, iters);
  const double auto_ms = median_ms(run_auto, copies, iters);
  const double flat_ms = median_ms([&](int copy) { flat.run(qv, cache_view(copy), state(flat_out.ptr)); }, copies, iters);
  const double level0_ms = median_ms(run_level0, copies, iters);
  const double level1_ms = median_ms(run_level1, copies, iters);
  const double merge_ms = median_ms(run_merge, 1, iters);
  level1.check_errors();
  flat.check_errors();
  cascade.check_errors();
  automatic.check_errors();

  // The three answers agree (bf16 outputs; the cascade rounds level 0's state to bf16 once more).
  auto max_diff = [&](const uint16_t* a_dev, const uint16_t* b_dev) {
    std::vector<uint16_t> a(qo_elems), b(qo_elems);
    cuda_ok(cudaMemcpy(a.data(), a_dev, qo_elems * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
    cuda_ok(cudaMemcpy(b.data(), b_dev, qo_elems * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
    auto f = [](uint16_t h) {
      const uint32_t bits = uint32_t(h) << 16;
      float x;
      std::memcpy(&x, &bits, 4);
      return x;
    };
    double worst = 0;
    for (size_t i = 0; i < qo_elems; ++i) worst = std::max(worst, double(std::fabs(f(a[i]) - f(b[i]))));
    return worst;
  };
  run_cascade(0);
  run_auto(0);
  flat.run(qv, cache_view(0), state(flat_out.ptr));
  const double cascade_diff = max_diff(out.ptr, flat_out.ptr), auto_diff = max_diff(auto_out.ptr, flat_out.ptr);
  const double gbps = c.flat_bytes() / (ms * 1e-3) / 1e9, flat_gbps = c.flat_bytes() / (flat_ms * 1e-3) / 1e9;
  nlohmann::json row = {
      {"op", "cascade"}, {"id", c.id}, {"case", c.name()}, {"heads", c.heads()}, {"batch", B},
      {"prefix_len", c.prefix}, {"suffix_len", c.suffix}, {"page_size", P}, {"kv_tokens", c.flat_kv_tokens()},
      {"cascade_kv_tokens", c.cascade_kv_tokens()}, {"ms", ms}, {"GBps", gbps}, {"pct_of_4800", 100.0 * gbps / peak_gbps},
      {"flat_ms", flat_ms}, {"flat_GBps", flat_gbps}, {"flat_pct_of_4800", 100.0 * flat_gbps / peak_gbps},
      {"speedup", flat_ms / ms}, {"pieces_ms", pieces_ms}, {"auto_ms", auto_ms}, {"auto_family", auto_family},
      {"auto_speedup", flat_ms / auto_ms}, {"auto_plan_us", auto_plan_us},
      {"max_abs_diff_cascade_vs_flat", cascade_diff}, {"max_abs_diff_auto_vs_flat", auto_diff},
      // The cascade's own traffic (prefix once, suffixes, q, out) over its time.
      {"cascade_read_GBps", (c.kv_bytes(c.cascade_kv_tokens()) + c.qo_bytes()) / (ms * 1e-3) / 1e9},
      {"level0_ms", level0_ms}, {"level1_ms", level1_ms}, {"merge_ms", merge_ms}, {"plan_us", plan_us},
      {"flat_plan_us", flat_plan_us}, {"l2_copies", copies},
      {"page_ids", "level 0 on the host; level 1 and flat on the device; automatic on the host"}};
  if (io) {  // one more run of each on copy 0, with lse, into poisoned outputs; then export everything
    cuda_ok(cudaMemset(out.ptr, 0xff, qo_elems * 2), "cudaMemset");
    cuda_ok(cudaMemset(flat_out.ptr, 0xff, qo_elems * 2), "cudaMemset");
    run_cascade(0);
    flat.run(qv, cache_view(0), state(flat_out.ptr), lse_view(flat_lse.ptr));
    cuda_ok(cudaDeviceSynchronize(), "runs with lse");
    level1.check_errors();
    flat.check_errors();
    kvattn_cli::CascadeCaseIo e;
    e.id = c.id;
    e.fields = c.fields();
    e.fields["row"] = row;
    e.batch = B, e.num_qo_heads = Hq, e.num_kv_heads = Hkv, e.head_dim = D, e.num_pages = pages, e.page_size = P;
    e.q = q.ptr, e.k_cache = kv.ptr, e.v_cache = kv.ptr + cache_elems, e.out = out.ptr, e.flat_out = flat_out.ptr;
    e.lse = lse.ptr, e.flat_lse = flat_lse.ptr;
    e.level0 = &t.level0, e.level1 = &t.level1, e.flat = &t.flat;
    kvattn_cli::export_cascade_case(*io, e);
  }
  return row;
}
#endif

void bench_cascade(const CascadeBenchOptions& o) {
  if (o.list) return list_cascade_cases(o);
  const auto cases = selected_cases(o);
#if KVATTN_WITH_CUDA
  kvattn::cuda::require_cuda("kvattn bench cascade");
  std::unique_ptr<kvattn_cli::IoExport> io;
  if (!o.save_io.empty())
    io = std::make_unique<kvattn_cli::IoExport>(o.save_io, "kvattn bench cascade", o.save_io_kv_mb << 20);
  nlohmann::json rows = nlohmann::json::array();
  if (!o.json)
    std::printf("%-30s %6s %11s %11s %8s %10s %10s %10s %9s %11s %8s %9s\n", "cascade (bf16, hd 128)", "heads",
                "cascade", "flat", "speedup", "GB/s", "flat GB/s", "level 0", "plan", "automatic", "chose", "auto/flat");
  for (const auto& c : cases) {
    auto row = run_cascade_case(c, o.iters, 4800.0, io.get());
    if (!o.json)
      std::printf("%-30s %6s %8.1f us %8.1f us %7.2fx %10.0f %10.0f %7.1f us %6.1f us %8.1f us %8s %8.2fx\n",
                  c.name().c_str(), c.heads().c_str(), row["ms"].get<double>() * 1e3,
                  row["flat_ms"].get<double>() * 1e3, row["speedup"].get<double>(), row["GBps"].get<double>(),
                  row["flat_GBps"].get<double>(), row["level0_ms"].get<double>() * 1e3,
                  row["plan_us"].get<double>(), row["auto_ms"].get<double>() * 1e3,
                  row["auto_family"].get<std::string>().c_str(), row["auto_speedup"].get<double>());
    std::fflush(stdout);
    rows.push_back(row);
  }
  if (o.json) std::cout << rows.dump(1) << "\n";
#else
  (void)cases;
  throw kvattn::Error("kvattn bench cascade needs the CUDA backend, and this build has none");
#endif
}

}  // namespace

void register_bench_cascade(CLI::App& bench) {
  auto* cmd = bench.add_subcommand(
      "cascade", "shared-prefix decode: a 2-level cascade (BatchPrefill over the shared prefix + BatchDecode over "
                 "each suffix + merge_state) beside plain BatchDecode; 32/8 heads, head dim 128, page 16, bf16");
  static CascadeBenchOptions o;
  cmd->add_flag("--quick", o.quick, "a few shapes only");
  cmd->add_flag("--json", o.json, "print the rows as JSON (with --list: the cases' shapes)");
  cmd->add_flag("--list", o.list, "list the cases (id, shape, KV size) and run nothing; no GPU needed");
  cmd->add_option("--cases", o.cases, "run only these case ids, comma-separated (see --list)")->delimiter(',');
  cmd->add_option("--iters", o.iters, "timed runs per shape (median reported)")->check(CLI::Range(1, 10000));
  cmd->add_option("--save-io", o.save_io,
                  "export each case's q, paged K/V cache, level-0, level-1 and flat page tables, out and lse of "
                  "the cascade and of plain decode (.npy) and DIR/manifest.json for bench/run-peers; q and K/V "
                  "then hold generated values")
      ->type_name("DIR");
  cmd->add_option("--save-io-kv-mb", o.save_io_kv_mb,
                  "with --save-io, write a case's K and V caches only when together at most this many MiB "
                  "(readers regenerate larger ones from the manifest's generator)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  cmd->callback([] { bench_cascade(o); });
}
