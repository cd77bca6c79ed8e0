// The planner, kvattn::make_plan and kvattn::Planner (kvattn/plan.h).
//
// Legal inputs: 0-8 requests (sometimes 40) of 0-40 query tokens (sometimes 200; sometimes more
// than their KV, which the planner allows) over 0-300 KV tokens (sometimes 5000, sometimes near
// kMaxKVLen), 1-8 KV heads (sometimes 64) in groups of 1-8, any query and KV tile, causal and
// sliding-window ranges, and scheduler options (workers up to 2000 and sometimes the limit,
// fixed split sizes, no split, cost models, CUDA-graph capacities). The reference is the plan's
// contract, computed here independently: each (request, KV head, query tile) appears once per
// chunk, its chunks cover exactly the tile's visible KV range [v0, v1) (bottom-right causal end,
// window start; an empty range gives one empty item) in order and without overlap; split tiles
// (more than one chunk) have distinct partial slots and one merge entry listing them in KV order;
// fixed splits cut exactly fixed_split_size tokens, searched splits equal multiples of
// tile.kv_tokens; worker lists, costs (recomputed from the cost model), totals, capacities and
// padding agree; and the same inputs give the same plan (twice, and on a reused Planner).
//
// Corruptions: every input check of plan.h (lengths, heads, dims, tiles, window, workers, split
// size, cost model, graph capacity) and batches past the limits near 2^31 (kv_len past kMaxKVLen,
// query tokens past kMaxTotalTokens, a batch whose cost exceeds the planner's limit), which must
// be rejected in O(batch).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <tuple>

#include "fuzz/operations.h"

namespace kvattn_fuzz {

kvattn::SchedulerOptions random_scheduler(Source& s, int64_t batch, int64_t tokens, bool allow_zero_workers) {
  kvattn::SchedulerOptions o;
  o.num_workers = allow_zero_workers && s.chance(50) ? 0 : s.chance(85) ? int(s.range(1, 8)) : int(s.range(9, 300));
  if (s.chance(25)) o.fixed_split_size = int(s.range(1, 48));
  o.disable_split_kv = s.chance(15);
  if (s.chance(10)) o.cost = {s.range(0, 100), s.range(0, 4), s.range(1, 4), s.range(0, 8)};
  if (s.chance(10) && o.fixed_split_size == 0) {  // a fixed split may need more items than a capacity has
    kvattn::GraphCapacity g;
    g.max_batch = int32_t(std::max<int64_t>(1, batch + s.range(0, 3)));
    g.max_tokens = std::max<int64_t>(1, tokens + s.range(0, 20));
    g.max_split_items = s.chance(50) ? -1 : int32_t(s.range(0, 32));
    o.cuda_graph = g;
  }
  return o;
}

void scheduler_corruptions(Ctx& ctx, std::vector<Corruption>& out, kvattn::SchedulerOptions& opt, int64_t batch,
                           int64_t tokens) {
  Source& s = ctx.src;
  kvattn::SchedulerOptions* o = &opt;
  const int w = int(s.pick<int64_t>({-1, -64, 1 << 20, std::numeric_limits<int>::max()}));
  out.push_back({cat("num_workers = ", w), "scheduler", [o, w] { o->num_workers = w; }});
  const int f = int(s.pick<int64_t>({-1, std::numeric_limits<int>::min()}));
  out.push_back({cat("fixed_split_size = ", f), "scheduler", [o, f] { o->fixed_split_size = f; }});
  const int which = int(s.range(0, 4));
  out.push_back({cat("cost model case ", which), "scheduler", [o, which] {
                   switch (which) {
                     case 0: o->cost.per_item = -1; break;
                     case 1: o->cost.per_query_row = -3; break;
                     case 2: o->cost.per_kv_token = -1; break;
                     case 3: o->cost.per_partial_row = -8; break;
                     default: o->cost.per_item = o->cost.per_query_row = o->cost.per_kv_token = 0; break;
                   }
                 }});
  const int g = int(s.range(0, 3));
  out.push_back({cat("cuda_graph capacity case ", g), "scheduler", [o, g, batch, tokens] {
                   kvattn::GraphCapacity cap;
                   cap.max_batch = int32_t(std::max<int64_t>(1, batch));
                   cap.max_tokens = std::max<int64_t>(1, tokens);
                   switch (g) {
                     case 0: cap.max_batch = int32_t(batch - 1); break;  // below the batch (or 0 / -1)
                     case 1: cap.max_tokens = tokens - 1; break;
                     case 2: cap.max_split_items = -2; break;
                     default: cap.max_batch = 0; break;
                   }
                   o->cuda_graph = cap;
                   o->fixed_split_size = 0;
                 }});
}

namespace {

constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();

struct PlanInputs {
  std::vector<int32_t> qo_indptr, kv_len;
  kvattn::PlannerInputs in;
  kvattn::SchedulerOptions opt;
  void bind() {
    in.qo_indptr = qo_indptr;
    in.kv_len = kv_len;
  }
};

int64_t item_cost(const kvattn::CostModel& c, const kvattn::WorkItem& it, int64_t group) {
  const int64_t rows = int64_t(it.q_end - it.q_begin) * group;
  return c.per_item + c.per_query_row * rows + c.per_kv_token * (int64_t(it.kv_end) - it.kv_begin) +
         (it.partial_slot >= 0 ? c.per_partial_row * rows : 0);
}

void check_plan(const PlanInputs& pi, const kvattn::Plan& plan) {
  const kvattn::PlannerInputs& in = pi.in;
  const kvattn::SchedulerOptions& opt = pi.opt;
  const int64_t B = int64_t(pi.kv_len.size()), H = in.num_kv_heads, group = in.num_qo_heads / in.num_kv_heads;
  const int64_t T = in.tile.query_tokens, W = opt.num_workers;
  if (plan.num_workers() != W) fail("plan has ", plan.num_workers(), " workers, ", W, " asked");
  if (plan.batch_size() != B) fail("plan batch_size ", plan.batch_size(), " != ", B);
  if (int64_t(plan.items().size()) != plan.num_items()) fail("items().size() != num_items()");
  if (plan.item_capacity() < plan.num_items()) fail("item_capacity < num_items");
  if (int64_t(plan.worker_begin().size()) != W + 1) fail("worker_begin has ", plan.worker_begin().size(), " entries");
  // Worker lists and costs.
  using Key = std::tuple<int32_t, int32_t, int32_t>;  // request, kv head, q_begin
  std::map<Key, std::vector<kvattn::WorkItem>> tiles;
  int64_t total = 0, max_cost = 0, count = 0;
  for (int w = 0; w < W; ++w) {
    int64_t cost = 0;
    for (const kvattn::WorkItem& it : plan.worker_items(w)) {
      ++count;
      if (!it.active || it.worker != w || it.reserved != 0) fail("item of worker ", w, " has worker ", it.worker, " active ", it.active);
      if (it.request < 0 || it.request >= B || it.kv_head < 0 || it.kv_head >= H)
        fail("item with request ", it.request, " kv_head ", it.kv_head);
      cost += item_cost(opt.cost, it, group);
      tiles[{it.request, it.kv_head, it.q_begin}].push_back(it);
    }
    if (plan.worker_costs()[size_t(w)] != cost) fail("worker ", w, " cost ", plan.worker_costs()[size_t(w)], " != ", cost);
    total += cost;
    max_cost = std::max(max_cost, cost);
  }
  if (count != plan.num_items()) fail("worker lists hold ", count, " items, num_items() ", plan.num_items());
  if (plan.total_cost() != total || plan.max_worker_cost() != max_cost)
    fail("total/max cost ", plan.total_cost(), "/", plan.max_worker_cost(), " != ", total, "/", max_cost);
  for (int64_t i = plan.num_items(); i < plan.item_capacity(); ++i) {
    const kvattn::WorkItem& it = plan.all_items()[size_t(i)];
    if (it.active || it.worker != -1) fail("padding item ", i, " is active or has a worker");
  }
  // Merge entries by (request, head, q_begin).
  std::map<Key, kvattn::MergeEntry> merges;
  for (const kvattn::MergeEntry& m : plan.merges()) {
    if (!merges.emplace(Key{m.request, m.kv_head, m.q_begin}, m).second)
      fail("two merge entries for request ", m.request, " head ", m.kv_head, " q ", m.q_begin);
  }
  if (int64_t(plan.merges().size()) != plan.num_merges()) fail("merges().size() != num_merges()");
  for (int64_t i = plan.num_merges(); i < plan.merge_capacity(); ++i)
    if (plan.merges().data()[i].request != -1) fail("unused merge entry ", i, " has a request");
  std::vector<char> slot_used(size_t(std::max<int64_t>(0, plan.num_partial_slots())), 0);
  int64_t tiles_seen = 0, slots_seen = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t qo = int64_t(pi.qo_indptr[size_t(b) + 1]) - pi.qo_indptr[size_t(b)], kv = pi.kv_len[size_t(b)];
    for (int64_t q0 = 0; q0 < qo; q0 += T) {
      const int64_t q1 = std::min(qo, q0 + T);
      int64_t v1 = in.causal ? std::min(kv, kv - qo + q1) : kv;
      int64_t v0 = in.window_left >= 0 ? std::max<int64_t>(0, kv - qo + q0 - in.window_left) : 0;
      if (v1 <= v0) v0 = v1 = 0;
      for (int64_t h = 0; h < H; ++h) {
        ++tiles_seen;
        auto f = tiles.find({int32_t(b), int32_t(h), int32_t(q0)});
        if (f == tiles.end()) fail("no item for request ", b, " head ", h, " query tile ", q0);
        auto& list = f->second;
        std::sort(list.begin(), list.end(), [](const auto& x, const auto& y) { return x.kv_begin < y.kv_begin; });
        const std::string where = cat("request ", b, " head ", h, " tile [", q0, ", ", q1, ") visible [", v0, ", ", v1, ")");
        int64_t next = v0;
        for (size_t i = 0; i < list.size(); ++i) {
          const auto& it = list[i];
          if (it.q_end != q1) fail(where, ": an item ends at query ", it.q_end);
          if (it.kv_begin != next) fail(where, ": chunk ", i, " starts at ", it.kv_begin, ", expected ", next);
          if (it.kv_end <= it.kv_begin && !(v0 == v1 && list.size() == 1)) fail(where, ": an empty chunk");
          next = it.kv_end;
        }
        if (next != v1) fail(where, ": the chunks end at ", next);
        const int64_t n = int64_t(list.size()), L = v1 - v0;
        if (opt.disable_split_kv && n != 1) fail(where, ": ", n, " chunks with disable_split_kv");
        if (opt.fixed_split_size > 0 && !opt.disable_split_kv) {
          const int64_t S = opt.fixed_split_size, want = L <= S ? 1 : (L + S - 1) / S;
          if (n != want) fail(where, ": ", n, " chunks of a fixed split ", S, ", expected ", want);
          for (int64_t i = 0; i + 1 < n; ++i)
            if (int64_t(list[size_t(i)].kv_end) - list[size_t(i)].kv_begin != S)
              fail(where, ": chunk ", i, " of a fixed split is not ", S, " tokens");
        }
        if (n > 1 && opt.fixed_split_size == 0) {
          const int64_t piece = int64_t(list[0].kv_end) - list[0].kv_begin;
          for (int64_t i = 0; i + 1 < n; ++i)
            if (int64_t(list[size_t(i)].kv_end) - list[size_t(i)].kv_begin != piece || piece % in.tile.kv_tokens != 0)
              fail(where, ": chunk ", i, " of a searched split is not ", piece, " tokens, a multiple of ", in.tile.kv_tokens);
        }
        auto m = merges.find({int32_t(b), int32_t(h), int32_t(q0)});
        if (n == 1) {
          if (list[0].partial_slot != -1) fail(where, ": an unsplit item writes partial slot ", list[0].partial_slot);
          if (m != merges.end()) fail(where, ": a merge entry for an unsplit tile");
          continue;
        }
        if (m == merges.end()) fail(where, ": split into ", n, " chunks without a merge entry");
        if (m->second.q_end != q1 || m->second.num_slots != n) fail(where, ": merge entry of ", m->second.num_slots, " slots");
        for (int64_t i = 0; i < n; ++i) {
          const int32_t slot = list[size_t(i)].partial_slot;
          if (slot != m->second.slot_begin + i) fail(where, ": chunk ", i, " writes slot ", slot, ", merge expects ", m->second.slot_begin + i);
          if (slot < 0 || slot >= plan.num_partial_slots() || slot_used[size_t(slot)]++) fail(where, ": slot ", slot, " reused or out of range");
          ++slots_seen;
        }
      }
    }
  }
  if (int64_t(tiles.size()) != tiles_seen) fail("the plan has ", tiles.size(), " (request, head, tile) groups, expected ", tiles_seen);
  if (slots_seen != plan.num_partial_slots()) fail(slots_seen, " partial slots used, num_partial_slots() ", plan.num_partial_slots());
  if (int64_t(merges.size()) != plan.num_merges()) fail("merge entries not all used");
  if (plan.num_merges() == 0 && plan.split_size() != 0) fail("split_size ", plan.split_size(), " with nothing split");
}

bool same_plan(const kvattn::Plan& a, const kvattn::Plan& b) {
  auto eq = [](auto x, auto y) {
    return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size_bytes()) == 0);
  };
  return eq(a.all_items(), b.all_items()) && eq(a.merges(), b.merges()) && eq(a.worker_begin(), b.worker_begin()) &&
         eq(a.worker_costs(), b.worker_costs()) && a.num_partial_slots() == b.num_partial_slots() &&
         a.split_size() == b.split_size();
}

}  // namespace

void fuzz_planner(Ctx& ctx) {
  Source& s = ctx.src;
  PlanInputs pi;
  const bool huge = s.chance(5);  // KV near kMaxKVLen
  const int64_t B = huge ? s.range(1, 2) : s.range(0, s.chance(10) ? 40 : 8);
  pi.qo_indptr = {0};
  for (int64_t b = 0; b < B; ++b) {
    const int64_t kv = huge ? s.range(int64_t(1) << 30, kvattn::kMaxKVLen) : s.range(0, s.chance(15) ? 5000 : 300);
    const int64_t qo = huge ? s.range(1, 4) : s.chance(20) ? s.range(0, s.chance(20) ? 200 : 40) : s.range(0, std::min<int64_t>(kv, 40));
    pi.kv_len.push_back(int32_t(kv));
    pi.qo_indptr.push_back(int32_t(pi.qo_indptr.back() + qo));
  }
  kvattn::PlannerInputs& in = pi.in;
  in.num_kv_heads = int(huge ? s.range(1, 4) : s.chance(10) && B <= 8 ? s.range(9, 32) : s.range(1, 8));
  in.num_qo_heads = in.num_kv_heads * int(s.range(1, 8));
  in.head_dim_qk = int(s.range(1, 256));
  in.head_dim_vo = s.coin() ? 0 : int(s.range(1, 256));
  in.tile.query_tokens = int(s.chance(30) ? 16 : s.range(1, 64));
  in.tile.kv_tokens = int(s.chance(30) ? 64 : s.range(1, 256));
  in.causal = s.chance(40);
  in.window_left = s.chance(25) ? int(s.range(0, 100)) : -1;
  pi.opt = random_scheduler(s, B, pi.qo_indptr.back(), false);
  if (s.chance(3)) pi.opt.num_workers = s.chance(50) ? int(s.range(300, 2000)) : (1 << 20) - 1;
  // Keep the work list small: a fixed split of at least 1/4096 of the longest KV range.
  int64_t max_kv = 0;
  for (int32_t kv : pi.kv_len) max_kv = std::max<int64_t>(max_kv, kv);
  if (pi.opt.fixed_split_size > 0 && pi.opt.fixed_split_size < max_kv / 4096)
    pi.opt.fixed_split_size = int(max_kv / 4096 + s.range(0, 100));
  pi.bind();
  {
    std::ostringstream os;
    os << "make_plan: qo_indptr [";
    for (int32_t x : pi.qo_indptr) os << x << " ";
    os << "] kv_len [";
    for (int32_t x : pi.kv_len) os << x << " ";
    os << "] heads " << in.num_qo_heads << "/" << in.num_kv_heads << " dims " << in.head_dim_qk << "/" << in.head_dim_vo
       << " tile " << in.tile.query_tokens << "x" << in.tile.kv_tokens << (in.causal ? " causal" : "") << " window "
       << in.window_left << " workers " << pi.opt.num_workers << " fixed_split " << pi.opt.fixed_split_size
       << (pi.opt.disable_split_kv ? " no-split" : "") << (pi.opt.cuda_graph ? " graph" : "") << " cost "
       << pi.opt.cost.per_item << "/" << pi.opt.cost.per_query_row << "/" << pi.opt.cost.per_kv_token << "/"
       << pi.opt.cost.per_partial_row;
    ctx.note(os.str());
  }

  if (!ctx.corrupt) {
    kvattn::Plan plan;
    expect_success(ctx, "make_plan", [&] { plan = kvattn::make_plan(pi.in, pi.opt); });
    check_plan(pi, plan);
    kvattn::Planner planner;
    const kvattn::Plan* p1 = nullptr;
    expect_success(ctx, "Planner::plan", [&] { p1 = &planner.plan(pi.in, pi.opt); });
    if (!same_plan(plan, *p1)) fail("Planner::plan and make_plan differ on the same inputs");
    const kvattn::WorkItem* items = p1->all_items().data();
    expect_success(ctx, "Planner::plan again", [&] { p1 = &planner.plan(pi.in, pi.opt); });
    if (!same_plan(plan, *p1)) fail("a reused Planner gave another plan for the same inputs");
    if (pi.opt.cuda_graph && p1->all_items().data() != items) fail("graph mode: the work list moved between plans");
    return;
  }

  PlanInputs bad = pi;
  PlanInputs* P = &bad;
  std::vector<Corruption> c;
  if (B >= 1) {
    const int64_t i = s.range(1, B);
    c.push_back({cat("qo_indptr decreasing at ", i), "lengths", [P, i] { P->qo_indptr[size_t(i)] = P->qo_indptr[size_t(i - 1)] - 1; }});
    c.push_back({"qo_indptr[-1] = INT32_MAX", "lengths", [P] { P->qo_indptr.back() = kI32Max; }});
    const int64_t b = s.range(0, B - 1);
    const int32_t kv = int32_t(s.pick<int64_t>({-1, kvattn::kMaxKVLen + 1, kI32Max, std::numeric_limits<int32_t>::min()}));
    c.push_back({cat("kv_len[", b, "] = ", kv), "lengths", [P, b, kv] { P->kv_len[size_t(b)] = kv; }});
  }
  c.push_back({"qo_indptr empty", "lengths", [P] { P->qo_indptr.clear(); P->kv_len.clear(); }});
  const int32_t first = int32_t(s.pick<int64_t>({1, -1}));
  c.push_back({cat("qo_indptr[0] = ", first), "lengths", [P, first] { P->qo_indptr[0] = first; }});
  const bool longer = s.coin();
  c.push_back({longer ? "kv_len one entry long" : "kv_len one entry short", "lengths", [P, longer] {
                 if (longer || P->kv_len.empty()) P->kv_len.push_back(1);
                 else P->kv_len.pop_back();
               }});
  const int batch_case = int(s.range(0, 2));
  c.push_back({cat("a batch past the planner's limits, case ", batch_case), "lengths", [P, batch_case] {
                 // One request of kMaxTotalTokens queries over kMaxKVLen keys (its cost is past
                 // kMaxLoad with any mask), or more than kMaxTotalTokens queries over two requests.
                 P->qo_indptr = {0, int32_t(kvattn::kMaxTotalTokens)};
                 P->kv_len = {int32_t(kvattn::kMaxKVLen)};
                 P->in.window_left = -1;
                 P->in.tile = {};
                 P->opt.cost = {};
                 if (batch_case == 1) P->in.causal = true;
                 if (batch_case == 2) {
                   P->qo_indptr = {0, int32_t(kvattn::kMaxTotalTokens), kI32Max};
                   P->kv_len = {int32_t(kvattn::kMaxKVLen), int32_t(kvattn::kMaxKVLen)};
                 }
               }});
  const int heads_case = int(s.range(0, 4));
  c.push_back({cat("heads case ", heads_case), "heads", [P, heads_case] {
                 switch (heads_case) {
                   case 0: P->in.num_qo_heads = 0; break;
                   case 1: P->in.num_kv_heads = 0; break;
                   case 2: P->in.num_kv_heads = 32768; P->in.num_qo_heads = 32768; break;
                   case 3: P->in.num_qo_heads = P->in.num_kv_heads * 2 + (P->in.num_kv_heads > 1 ? 1 : -3); break;
                   default: P->in.num_qo_heads = -P->in.num_qo_heads; break;
                 }
               }});
  const int dim_case = int(s.range(0, 2));
  c.push_back({cat("head dims case ", dim_case), "dims", [P, dim_case] {
                 if (dim_case == 0) P->in.head_dim_qk = 0;
                 else if (dim_case == 1) P->in.head_dim_qk = -64;
                 else P->in.head_dim_vo = -1;
               }});
  const int tile_case = int(s.range(0, 3));
  c.push_back({cat("tile case ", tile_case), "tile", [P, tile_case] {
                 if (tile_case == 0) P->in.tile.query_tokens = 0;
                 else if (tile_case == 1) P->in.tile.query_tokens = -16;
                 else if (tile_case == 2) P->in.tile.kv_tokens = 0;
                 else P->in.tile.kv_tokens = std::numeric_limits<int>::min();
               }});
  const int w = int(s.pick<int64_t>({-2, -100, std::numeric_limits<int>::min()}));
  c.push_back({cat("window_left = ", w), "window", [P, w] { P->in.window_left = w; }});
  c.push_back({"num_workers = 0", "scheduler", [P] { P->opt.num_workers = 0; }});
  scheduler_corruptions(ctx, c, bad.opt, B, pi.qo_indptr.back());
  const auto t0 = std::chrono::steady_clock::now();
  expect_rejection(ctx, [&] {
    ctx.apply_corruptions(c);
    bad.bind();
    kvattn::Planner planner;
    (void)planner.plan(bad.in, bad.opt);
  });
  // Rejections are O(batch): never anywhere near work proportional to 2^31 tokens.
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (seconds > 2.0) fail("a rejected plan took ", seconds, " s");
}

}  // namespace kvattn_fuzz
