// `kvattn plan`: what the load-balanced planner decides for a batch, without running anything.
// The batch is given as explicit lengths (--kv-lens, --qo-lens) or as a distribution (--dist), or
// as one of the scheduling scenarios (--scenario); the worker count defaults to an H200's
// 132 SMs times the kernel's residency. Prints the number of items, the split, max/mean worker
// cost and a compact per-worker picture; --json for tools (keys include items, split_rows and
// max_over_mean).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "core/batch_shapes.h"
#include "core/shared_prefix.h"
#include "kvattn/error.h"
#include "kvattn/plan.h"

namespace {

struct PlanArgs {
  std::vector<int32_t> kv_lens;
  std::vector<int32_t> qo_lens;
  std::string dist;
  std::string scenario;
  uint64_t seed = 1;
  int qo_heads = 32, kv_heads = 8, head_dim = 128;
  int query_tile = 0;  // 0: 1 for decode, else 128 packed rows / group size
  int kv_tile = 64;
  bool causal = false;
  int window = -1;
  int sms = 132, residency = 1, workers = -1;  // workers -1: sms x residency
  int fixed_split = 0;
  bool no_split = false;
  std::string graph;  // MAX_BATCH:MAX_TOKENS[:MAX_SPLIT_ITEMS]
  std::vector<int64_t> cost;
  std::vector<std::string> shared_prefix;  // N:TOKENS runs of requests sharing a prefix
  int page_size = 16;
  bool json = false;
  bool list_items = false;
  int width = 66;
};

// The scheduling scenarios (docs/perf/HISTORY.md, "Planner").
std::string scenario_spec(const std::string& name) {
  if (name == "a" || name == "zipf") return "zipf:64:4096";
  if (name == "b" || name == "long") return "long:32768:63:512";
  if (name == "c" || name == "uniform") return "uniform:64:512:16384";
  throw kvattn::Error("--scenario '" + name + "' is not one of a (zipf:64:4096), b " +
                      "(long:32768:63:512), c (uniform:64:512:16384)");
}

std::vector<int64_t> parse_colon_list(const std::string& what, const std::string& text) {
  std::vector<int64_t> v;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, ':');) {
    try {
      size_t used = 0;
      v.push_back(std::stoll(part, &used));
      if (used != part.size()) throw std::invalid_argument(part);
    } catch (const std::exception&) {
      throw kvattn::Error(what + " '" + text + "': '" + part + "' is not an integer");
    }
  }
  return v;
}

// Load of each worker as one character of a bar chart (eighths of the most loaded worker).
std::string picture(std::span<const int64_t> loads, int64_t max_load, int width) {
  static const char* kLevels[] = {" ", "▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  std::string out;
  for (size_t w = 0; w < loads.size(); ++w) {
    if (w % size_t(width) == 0) {
      char head[32];
      std::snprintf(head, sizeof head, "  %5zu |", w);
      out += head;
    }
    int level = max_load > 0 ? int((loads[w] * 8 + max_load / 2) / max_load) : 0;
    if (loads[w] > 0 && level == 0) level = 1;
    out += kLevels[std::clamp(level, 0, 8)];
    if ((w + 1) % size_t(width) == 0 || w + 1 == loads.size()) out += "|\n";
  }
  return out;
}

void run_plan_command(const PlanArgs& a) {
  // ---- the batch ----
  int sources = !a.kv_lens.empty() + !a.dist.empty() + !a.scenario.empty();
  KVATTN_CHECK(sources == 1, "give exactly one of --kv-lens, --dist and --scenario (got ", sources,
               ")");
  std::vector<int32_t> kv =
      !a.kv_lens.empty() ? a.kv_lens
      : !a.dist.empty()  ? kvattn::detail::lengths_from_spec(a.dist, a.seed)
                         : kvattn::detail::lengths_from_spec(scenario_spec(a.scenario), a.seed);
  const size_t B = kv.size();
  std::vector<int32_t> qo_lens = a.qo_lens.empty() ? std::vector<int32_t>{1} : a.qo_lens;
  if (qo_lens.size() == 1) qo_lens.assign(B, qo_lens[0]);
  KVATTN_CHECK(qo_lens.size() == B, "--qo-lens has ", qo_lens.size(), " values but the batch has ",
               B, " requests (give one value, or one per request)");
  std::vector<int32_t> qo_indptr(B + 1, 0);
  for (size_t b = 0; b < B; ++b) {
    KVATTN_CHECK(qo_lens[b] >= 0, "--qo-lens[", b, "] = ", qo_lens[b], " is negative");
    qo_indptr[b + 1] = qo_indptr[b] + qo_lens[b];
  }
  const bool decode = std::all_of(qo_lens.begin(), qo_lens.end(), [](int32_t q) { return q <= 1; });

  kvattn::PlannerInputs in;
  in.qo_indptr = qo_indptr;
  in.kv_len = kv;
  in.num_qo_heads = a.qo_heads;
  in.num_kv_heads = a.kv_heads;
  in.head_dim_qk = a.head_dim;
  const int group = a.kv_heads > 0 && a.qo_heads % a.kv_heads == 0 ? a.qo_heads / a.kv_heads : 1;
  in.tile.query_tokens = a.query_tile > 0 ? a.query_tile : decode ? 1 : std::max(1, 128 / group);
  in.tile.kv_tokens = a.kv_tile;
  in.causal = a.causal;
  in.window_left = a.window;

  kvattn::SchedulerOptions opt;
  KVATTN_CHECK(a.sms >= 1 && a.residency >= 1, "--sms = ", a.sms,
               " and --residency = ", a.residency, " must be >= 1");
  opt.num_workers = a.workers >= 0 ? a.workers : a.sms * a.residency;
  opt.fixed_split_size = a.fixed_split;
  opt.disable_split_kv = a.no_split;
  if (!a.graph.empty()) {
    auto g = parse_colon_list("--graph", a.graph);
    KVATTN_CHECK(g.size() == 2 || g.size() == 3, "--graph '", a.graph,
                 "' must be MAX_BATCH:MAX_TOKENS[:MAX_SPLIT_ITEMS]");
    opt.cuda_graph = kvattn::GraphCapacity{int32_t(g[0]), g[1], g.size() == 3 ? int32_t(g[2]) : -1};
  }
  if (!a.cost.empty()) {
    KVATTN_CHECK(a.cost.size() == 4, "--cost needs 4 values (per_item, per_query_row, ",
                 "per_kv_token, per_partial_row), got ", a.cost.size());
    opt.cost = {a.cost[0], a.cost[1], a.cost[2], a.cost[3]};
  }

  const kvattn::Plan plan = kvattn::make_plan(in, opt);

  // ---- shared prefixes: what BatchDecode's cost model (SharedPrefix::automatic) would choose ----
  std::vector<kvattn::detail::SharedPrefixGroup> runs;
  nlohmann::json shared_json;
  std::string shared_text;
  if (!a.shared_prefix.empty()) {
    KVATTN_CHECK(decode, "--shared-prefix describes a decode batch (every --qo-lens value <= 1)");
    KVATTN_CHECK(a.page_size >= 1, "--page-size = ", a.page_size, " must be >= 1");
    int32_t next = 0;
    for (const std::string& spec : a.shared_prefix) {
      auto v = parse_colon_list("--shared-prefix", spec);
      KVATTN_CHECK(v.size() == 2 && v[0] >= 2 && v[1] >= 1, "--shared-prefix '", spec,
                   "' must be N:TOKENS with N >= 2 requests sharing TOKENS >= 1 leading tokens");
      KVATTN_CHECK(next + v[0] <= int64_t(B), "--shared-prefix runs cover ", next + v[0], " requests but the batch has ", B);
      const int32_t pages = int32_t(v[1] / a.page_size);
      for (int32_t b = next; b < next + int32_t(v[0]); ++b)
        KVATTN_CHECK(int64_t(pages) * a.page_size < kv[size_t(b)], "--shared-prefix '", spec, "': request ", b,
                     " has kv_len ", kv[size_t(b)], ", not more than the ", int64_t(pages) * a.page_size,
                     " shared tokens (a request keeps its last page)");
      runs.push_back({next, int32_t(v[0]), pages});
      next += int32_t(v[0]);
    }
    std::vector<int64_t> kv64(kv.begin(), kv.end());
    kvattn::detail::CascadeCostInputs ci;
    ci.kv_len = kv64;
    ci.page_size = a.page_size;
    ci.num_qo_heads = a.qo_heads;
    ci.head_dim_qk = a.head_dim;
    ci.bytes_per_token = int64_t(a.kv_heads) * 2 * a.head_dim * 2;  // bf16 K and V
    const std::vector<std::vector<kvattn::detail::SharedPrefixGroup>> levels{runs};
    const auto cost = kvattn::detail::cascade_cost(ci, levels);
    shared_json = {{"runs", a.shared_prefix}, {"flat_us", cost.flat_us}, {"cascade_us", cost.cascade_us},
                   {"flat_tokens", cost.flat_tokens}, {"cascade_tokens", cost.cascade_tokens},
                   {"choice", cost.cascade_wins() ? "cascade" : "flat"}};
    std::ostringstream t;
    t << "cascade    " << runs.size() << " run(s) sharing whole pages of " << a.page_size
      << " tokens; model (bf16, H200): flat " << cost.flat_us << " us over " << cost.flat_tokens
      << " tokens, cascade " << cost.cascade_us << " us over " << cost.cascade_tokens << " -> "
      << (cost.cascade_wins() ? "cascade: level 0 one group per run (+ unshared stretches), level 1 each request's own pages"
                              : "flat")
      << "\n";
    shared_text = t.str();
  }

  // ---- per-worker summaries ----
  const int W = plan.num_workers();
  std::vector<int64_t> worker_items(static_cast<size_t>(W)),
      worker_split_items(static_cast<size_t>(W));
  for (int w = 0; w < W; ++w) {
    auto list = plan.worker_items(w);
    worker_items[size_t(w)] = int64_t(list.size());
    for (const auto& it : list) worker_split_items[size_t(w)] += it.partial_slot >= 0;
  }
  int64_t total_kv = 0, min_kv = B ? kv[0] : 0, max_kv = 0, q_tokens = qo_indptr.back();
  for (int32_t x : kv) {
    total_kv += x;
    min_kv = std::min<int64_t>(min_kv, x);
    max_kv = std::max<int64_t>(max_kv, x);
  }
  const int64_t idle = std::count(worker_items.begin(), worker_items.end(), 0);
  const auto [min_items, max_items] = std::minmax_element(worker_items.begin(), worker_items.end());

  if (a.json) {
    nlohmann::json j;
    j["requests"] = B;
    j["kind"] = decode ? "decode" : "prefill";
    j["query_tokens"] = q_tokens;
    j["kv_tokens"] = total_kv;
    j["num_qo_heads"] = a.qo_heads;
    j["num_kv_heads"] = a.kv_heads;
    j["tile"] = {{"query_tokens", in.tile.query_tokens}, {"kv_tokens", in.tile.kv_tokens}};
    j["causal"] = a.causal;
    j["window_left"] = a.window;
    j["workers"] = W;
    j["slices"] = {{"count", plan.num_slices()}, {"heads", plan.slice_heads()}, {"workers", plan.slice_workers()}};
    j["items"] = plan.num_items();
    j["item_capacity"] = plan.item_capacity();
    j["split_size"] = plan.split_size();
    j["merges"] = plan.num_merges();
    j["partial_slots"] = plan.num_partial_slots();
    j["split_rows"] = plan.split_rows();
    j["total_cost"] = plan.total_cost();
    j["max_worker_cost"] = plan.max_worker_cost();
    j["mean_worker_cost"] = plan.mean_worker_cost();
    j["largest_item_cost"] = plan.largest_item_cost();
    j["max_over_mean"] = plan.max_over_mean();
    j["idle_workers"] = idle;
    j["cost_model"] = {{"per_item", opt.cost.per_item},
                       {"per_query_row", opt.cost.per_query_row},
                       {"per_kv_token", opt.cost.per_kv_token},
                       {"per_partial_row", opt.cost.per_partial_row}};
    j["worker_costs"] =
        std::vector<int64_t>(plan.worker_costs().begin(), plan.worker_costs().end());
    j["worker_items"] = worker_items;
    if (!shared_json.is_null()) j["shared_prefix"] = shared_json;
    if (a.list_items) {
      nlohmann::json items = nlohmann::json::array();
      for (const auto& it : plan.items())
        items.push_back({{"request", it.request},
                         {"kv_head", it.kv_head},
                         {"q_begin", it.q_begin},
                         {"q_end", it.q_end},
                         {"kv_begin", it.kv_begin},
                         {"kv_end", it.kv_end},
                         {"worker", it.worker},
                         {"partial_slot", it.partial_slot},
                         {"cost", plan.item_cost(it)}});
      j["item_list"] = items;
    }
    std::cout << j.dump(2) << "\n";
    return;
  }

  std::printf(
      "batch      %zu requests (%s), %lld query tokens; KV tokens total %lld, "
      "min %lld, mean %.0f, max %lld\n",
      B, decode ? "decode" : "prefill", (long long)q_tokens, (long long)total_kv, (long long)min_kv,
      B ? double(total_kv) / double(B) : 0.0, (long long)max_kv);
  std::printf("shape      %d query / %d KV heads; tile %d x %d (query tokens x KV tokens)%s%s\n",
              a.qo_heads, a.kv_heads, in.tile.query_tokens, in.tile.kv_tokens,
              a.causal ? ", causal" : "",
              a.window >= 0 ? (", window " + std::to_string(a.window)).c_str() : "");
  std::printf("workers    %d%s\n", W,
              a.workers >= 0 ? ""
                            : (" (" + std::to_string(a.sms) + " SMs x residency " +
                               std::to_string(a.residency) + ")")
                                  .c_str());
  std::printf(
      "cost model per_item %lld + per_query_row %lld x rows + per_kv_token %lld x tokens "
      "(+ per_partial_row %lld x rows when split)\n",
      (long long)opt.cost.per_item, (long long)opt.cost.per_query_row,
      (long long)opt.cost.per_kv_token, (long long)opt.cost.per_partial_row);
  std::fputs(shared_text.c_str(), stdout);
  std::printf("plan       %lld items", (long long)plan.num_items());
  if (plan.graph_mode())
    std::printf(" (capacity %lld, graph mode)", (long long)plan.item_capacity());
  if (plan.split_size() > 0)
    std::printf(
        "; KV split into chunks of %d tokens: %lld merge entries, %lld partial slots, "
        "%lld split rows\n",
        plan.split_size(), (long long)plan.num_merges(), (long long)plan.num_partial_slots(),
        (long long)plan.split_rows());
  else
    std::printf("; no KV split\n");
  std::printf("slices     %d, each %d KV head(s) on %d workers: one schedule, repeated (the GPU decode path stages "
              "slice 0 only)\n",
              plan.num_slices(), plan.slice_heads(), plan.slice_workers());
  std::printf("balance    max worker cost %lld, mean %.1f, max/mean %.4f; largest item %lld\n",
              (long long)plan.max_worker_cost(), plan.mean_worker_cost(), plan.max_over_mean(),
              (long long)plan.largest_item_cost());
  std::printf("           items per worker %lld to %lld; idle workers %lld\n",
              W ? (long long)*min_items : 0LL, W ? (long long)*max_items : 0LL, (long long)idle);
  std::printf("workers    load of each worker, eighths of the most loaded (%d per line):\n",
              a.width);
  std::cout << picture(plan.worker_costs(), plan.max_worker_cost(), std::max(1, a.width));
  if (a.list_items) {
    std::printf("items      worker: request/head q[begin,end) kv[begin,end) slot cost\n");
    for (int w = 0; w < W; ++w)
      for (const auto& it : plan.worker_items(w))
        std::printf("  %5d: %d/%d q[%d,%d) kv[%d,%d) %d %lld\n", w, it.request, it.kv_head,
                    it.q_begin, it.q_end, it.kv_begin, it.kv_end, it.partial_slot,
                    (long long)plan.item_cost(it));
  }
}

}  // namespace

void register_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  auto* cmd = app.add_subcommand(
      "plan", "Show what the load-balanced planner decides for a batch (no attention is run)");
  cmd->footer(
      "Examples:\n"
      "  kvattn plan --scenario b                      1 x 32k + 63 x 512 decode on 132 workers\n"
      "  kvattn plan --dist zipf:64:4096 --json         Zipf lengths averaging 4k\n"
      "  kvattn plan --kv-lens 4096,300,70000 --qo-lens 1\n"
      "  kvattn plan --dist uniform:256:512:2048 --qo-lens 128 --causal   append/prefill\n"
      "Distributions: uniform:N:LO:HI, zipf:N:MEAN[:EXPONENT] (rank i has length ~ 1/i^EXPONENT, "
      "default 1), long:LONG:N_SHORT:SHORT.");
  cmd->add_option("--kv-lens", args->kv_lens, "KV lengths of the requests, comma-separated")
      ->delimiter(',');
  cmd->add_option("--qo-lens", args->qo_lens,
                  "query lengths: one value for every request, or one per request (default 1: "
                  "decode)")
      ->delimiter(',');
  cmd->add_option("--dist", args->dist, "KV lengths from a distribution (see below)");
  cmd->add_option("--scenario", args->scenario,
                  "one of the issue's scheduling scenarios: a (Zipf, 64 requests, mean 4k), "
                  "b (1 x 32k + 63 x 512), c (64 uniform in [512, 16k])");
  cmd->add_option("--seed", args->seed, "seed of --dist and --scenario")->capture_default_str();
  cmd->add_option("--qo-heads", args->qo_heads, "query heads")->capture_default_str();
  cmd->add_option("--kv-heads", args->kv_heads, "KV heads")->capture_default_str();
  cmd->add_option("--head-dim", args->head_dim, "head dim")->capture_default_str();
  cmd->add_option("--query-tile", args->query_tile,
                  "query tokens per item (default: 1 for decode, else 128 / group size)");
  cmd->add_option("--kv-tile", args->kv_tile, "KV tokens per kernel step; chunks are multiples")
      ->capture_default_str();
  cmd->add_flag("--causal", args->causal,
                "causal mask (bottom-right aligned): shrinks the KV work");
  cmd->add_option("--window", args->window, "sliding window (window_left), -1 off")
      ->capture_default_str();
  cmd->add_option("--sms", args->sms, "SMs of the GPU (H200: 132)")->capture_default_str();
  cmd->add_option("--residency", args->residency, "CTAs of the kernel resident per SM")
      ->capture_default_str();
  cmd->add_option("--workers", args->workers, "workers (overrides --sms x --residency)");
  cmd->add_option("--fixed-split", args->fixed_split, "KV chunks of exactly this many tokens");
  cmd->add_flag("--no-split", args->no_split, "disable split-KV");
  cmd->add_option("--graph", args->graph,
                  "CUDA-graph capacity MAX_BATCH:MAX_TOKENS[:MAX_SPLIT_ITEMS]");
  cmd->add_option("--cost", args->cost,
                  "cost model per_item,per_query_row,per_kv_token,per_partial_row")
      ->delimiter(',');
  cmd->add_option("--shared-prefix", args->shared_prefix,
                  "decode: runs of N consecutive requests (from request 0) sharing TOKENS leading tokens, "
                  "N:TOKENS comma-separated; prints what BatchDecode's shared-prefix cost model chooses")
      ->delimiter(',');
  cmd->add_option("--page-size", args->page_size, "page size for --shared-prefix")->capture_default_str();
  cmd->add_flag("--items", args->list_items, "list every work item");
  cmd->add_option("--width", args->width, "workers per line of the picture")->capture_default_str();
  cmd->add_flag("--json", args->json, "print the plan summary as JSON");
  cmd->callback([args] { run_plan_command(*args); });
}
