// The load-balanced planner (include/kvattn/plan.h has the model and the algorithm in words).
//
// Data flow of one plan():
//   inputs -> groups (request, query tile, visible KV range [v0, v1), packed rows)
//          -> split-size search: estimates (total cost, largest item) per candidate, then
//             longest-first schedules of a few candidates on one worker slice
//          -> the best schedule is replicated over the slices (or kept for slice 0 only, when
//             the backend repeats it: SchedulerOptions::slice_zero_only) and written out as the
//             work list, the worker ranges, the merge table and the worker costs.
// All buffers live in Planner::Scratch and the Plan, and are reused from one plan() to the next:
// after the first call a plan of the same size or smaller allocates nothing.
#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <limits>
#include <numeric>
#include <string>

#include "kvattn/error.h"
#include "kvattn/plan.h"
#include "core/request_work.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace kvattn {

namespace {

constexpr int32_t kNoSplit = std::numeric_limits<int32_t>::max();

// A (request, query tile): the unit whose KV range is split. Its heads are scheduled together.
struct Group {
  int32_t request;
  int32_t q_begin, q_end;
  int32_t v0, v1;  // visible KV range of the tile
  int32_t rows;    // packed rows: query tokens x group size
  int64_t cost;    // cost of the tile unsplit (one head)
};

// A group in the schedule's longest-first order, with what the merge of schedule() reads: stored
// in that order, the merge walks it sequentially instead of through groups[order[i]].
struct Ordered {
  int64_t cost;  // unsplit
  int32_t group;
  int32_t len;   // visible KV tokens: cut for a split size S iff len > S
};

// A group in the estimate's order (by visible length, longest first): its length and the cost of
// one of its chunks without the KV tokens. Read sequentially by every estimate.
struct Lengthwise {
  int64_t len;
  int64_t chunk_base;  // per_item + (per_query_row + per_partial_row) x rows
};

// How a group is cut for one split size: n chunks of `piece` tokens, the last one shorter.
struct Cut {
  int32_t piece;
  int32_t n;
};

// Chunks [chunk_begin, chunk_end) of a split group, all of one cost.
struct Class {
  int64_t cost;
  int32_t group;
  int32_t chunk_begin, chunk_end;
};

// One item of the slice schedule: a chunk of a group, for local head `head`, on local worker.
struct Assign {
  int32_t group;
  int32_t chunk;
  int32_t head;
  int32_t worker;
};

// x / d for 0 <= x < 2^31 (token and tile counts) by a multiply and a shift: with s = 31 +
// ceil(log2 d) and m = ceil(2^s / d) <= 2^32, x m stays below 2^63, and the rounding error
// x (m - 2^s / d) / 2^s < 2^31 / 2^s <= 1 / d cannot carry the quotient past the next integer.
// The planner's estimates cut every long request for every candidate: a division each was a
// sixth of a skewed batch's plan().
struct Divider {
  uint64_t m = 1;
  int s = 0;
  constexpr Divider() = default;
  constexpr explicit Divider(uint32_t d)
      : m(((uint64_t(1) << (31 + std::bit_width(d - 1))) + d - 1) / d), s(31 + std::bit_width(d - 1)) {}
  constexpr uint32_t operator()(uint32_t x) const { return uint32_t((x * m) >> s); }
};
// The chunk counts a balanced cut divides by are mostly small.
constexpr auto kSmallDividers = [] {
  std::array<Divider, 256> t{};
  for (uint32_t d = 1; d < t.size(); ++d) t[d] = Divider(d);
  return t;
}();

// Cuts of visible ranges of L tokens for split size S (kNoSplit: one chunk). With `balanced`, the
// n = ceil(L / S) chunks have equal size rounded up to `align`; otherwise exactly S (fixed split).
// Lengths are int32 token counts (checked on input).
//
// Balanced cuts (S a multiple of align, as the candidates are) count in KV tiles: the range is
// u = ceil(L / a) tiles and S is m tiles, so n = ceil(u / m) chunks of q = ceil(u / n) tiles, the
// last one shorter (ceil(ceil(x / y) / z) = ceil(x / (y z)) turns "ceil(L / n) rounded up to a"
// into q a). Two shortcuts: q = m when n >= m (m n - u < m <= n), and the chunk count of q-tile
// chunks, ceil(u / q), is n again ((n - 1) q <= (n - 1) m < u).
class Cutter {
 public:
  Cutter(int64_t split, int64_t align, bool balanced)
      : split_(split), a_(uint32_t(align)), balanced_(balanced) {
    if (split >= kNoSplit) return;  // nothing is cut
    if (balanced) {
      m_ = uint32_t(split / align);
      by_a_ = Divider(a_);
      by_m_ = Divider(m_);
    } else {
      by_m_ = Divider(uint32_t(split));
    }
  }
  Cut operator()(int64_t L) const {
    if (L <= split_) return {int32_t(L), 1};
    if (!balanced_) return {int32_t(split_), int32_t(by_m_(uint32_t(L - 1)) + 1)};
    const uint32_t u = by_a_(uint32_t(L - 1)) + 1;
    const uint32_t n = by_m_(u - 1) + 1;
    uint32_t q = m_;
    if (n < m_) q = (n < kSmallDividers.size() ? kSmallDividers[n](u - 1) : (u - 1) / n) + 1;
    return {int32_t(q * a_), int32_t(n)};
  }

 private:
  int64_t split_;
  uint32_t a_, m_ = 0;
  bool balanced_;
  Divider by_a_, by_m_;
};

struct Estimate {
  int64_t total = 0;    // cost of one slice (all its heads)
  int64_t largest = 0;  // largest item
  int64_t items = 0;    // items of one slice
};

// One candidate schedule of a slice.
struct Schedule {
  int32_t split = kNoSplit;
  std::vector<Cut> cuts;        // per group; set for the groups this split size cuts only
  std::vector<Class> classes;   // chunks of split groups, longest first
  std::vector<Class> classes_tmp;
  std::vector<uint64_t> class_keys;
  std::vector<int32_t> class_at;  // class index by (group, is its last chunk), for the sort
  std::vector<Assign> assigns;  // in assignment order
  std::vector<std::pair<int64_t, size_t>> runs;  // assigns in runs of equal cost: (cost, count)
  size_t num_runs = 0;                           // runs[0, num_runs) are this schedule's
  std::vector<int64_t> loads;   // per local worker
  int64_t makespan = 0;
  int64_t total = 0;
  int64_t largest = 0;
};

// What one plan() knows about the problem while it searches.
struct Problem {
  const std::vector<Group>* groups;
  const std::vector<Ordered>* order;  // groups by unsplit cost, longest first
  // Groups by visible length, longest first, with suffix sums and maxima of their unsplit costs:
  // the groups a split size S cuts are a prefix of this order.
  const std::vector<int32_t>* by_len;
  const std::vector<Lengthwise>* lengthwise;  // the groups in by_len
  const std::vector<int64_t>* suffix_cost;
  const std::vector<int64_t>* suffix_max;
  int64_t max_len;        // longest visible range: no split size at or above it cuts anything
  int64_t unsplit_total;  // sum of the groups' unsplit costs (one head)
  int64_t max_cost;       // largest unsplit cost
  int64_t align;
  int slice_heads, slice_workers;
  CostModel cm;
  int64_t max_slice_items;  // int32 indices: items of one slice x slices stay below 2^31
};

// The least-loaded worker among many (more than kWindowWorkers), kept by a tournament tree of
// packed keys (load << 20 | worker): leaves are the workers (padded to a power of two with keys
// that never win), each inner node holds the smaller key of its children, so the root is the
// least-loaded worker with the lowest index. Adding to a worker's load replays its path to the
// root: log2(workers) branch-free minimums.
constexpr int kWorkerBits = 20;
constexpr int64_t kMaxWorkers = (int64_t(1) << kWorkerBits) - 1;
constexpr int64_t kMaxLoad = (int64_t(1) << (63 - kWorkerBits)) - 1;
constexpr uint64_t kWorkerMask = (uint64_t(1) << kWorkerBits) - 1;

struct WorkerTree {
  std::vector<uint64_t> node;
  std::vector<uint64_t> idle;    // the tree of n idle workers, copied by reset
  std::vector<uint64_t> sorted;  // scratch of place_rounds
  std::vector<uint64_t> window;  // place_window's buffer (few workers, no tree)
  size_t leaves = 1, workers = 0;

  void reset(size_t n) {
    if (n == workers) {
      std::copy(idle.begin(), idle.end(), node.begin());
      return;
    }
    workers = n;
    leaves = std::bit_ceil(n);
    node.resize(2 * leaves);
    for (size_t w = 0; w < leaves; ++w) node[leaves + w] = w < n ? w : ~uint64_t(0);
    rebuild();
    idle = node;
  }
  void rebuild() {
    for (size_t i = leaves - 1; i >= 1; --i) node[i] = std::min(node[2 * i], node[2 * i + 1]);
  }
  int64_t load(size_t w) const { return int64_t(node[leaves + w] >> kWorkerBits); }
};

// A split-size candidate's lower bound on its makespan.
struct Bound {
  int64_t bound;
  int32_t k;
};

}  // namespace

struct Planner::Scratch {
  std::vector<Group> groups;
  std::vector<int32_t> order, order_tmp, by_len;
  std::vector<Ordered> ordered;  // the groups in `order`
  std::vector<Lengthwise> lengthwise;  // the groups in `by_len`
  std::vector<int64_t> suffix_cost, suffix_max;
  std::vector<uint64_t> keys, packed_keys;
  std::vector<uint32_t> radix_count;
  std::vector<std::pair<int32_t, Estimate>> estimates;  // this plan's, by split size
  std::vector<int32_t> candidates;
  std::vector<Bound> bounds;
  std::vector<int32_t> cursor;
  std::vector<int32_t> slot_base;   // per group: first slot of head 0, or -1 when not split
  std::vector<int32_t> merge_base;  // per group: first merge entry of head 0
  WorkerTree tree;
  Schedule trial, best;
};

Planner::Planner() : scratch_(std::make_unique<Scratch>()) {}
Planner::~Planner() = default;
Planner::Planner(Planner&&) noexcept = default;
Planner& Planner::operator=(Planner&&) noexcept = default;

std::span<const WorkItem> Plan::worker_items(int worker) const {
  KVATTN_CHECK(worker >= 0 && size_t(worker) + 1 < worker_begin_.size(), "worker ", worker, " of a plan with ",
               worker_begin_.size() - 1, " stored worker lists",
               slice_zero_only_ ? " (slice_zero_only: slice 0's workers only)" : "");
  return {items_.data() + worker_begin_[size_t(worker)],
          size_t(worker_begin_[size_t(worker) + 1] - worker_begin_[size_t(worker)])};
}

int64_t Plan::item_cost(const WorkItem& item) const {
  int64_t rows = int64_t(item.q_rows()) * group_size_;
  return cost_.per_item + cost_.per_query_row * rows + cost_.per_kv_token * item.kv_tokens() +
         (item.partial_slot >= 0 ? cost_.per_partial_row * rows : 0);
}

namespace {
void check_inputs(const PlannerInputs& in, const SchedulerOptions& opt) {
  KVATTN_CHECK(opt.num_workers >= 1, "num_workers = ", opt.num_workers,
               " must be >= 1 (CTAs the GPU keeps resident, or CPU threads)");
  KVATTN_CHECK(opt.num_workers <= kMaxWorkers, "num_workers = ", opt.num_workers,
               " exceeds the planner's limit of ", kMaxWorkers);
  KVATTN_CHECK(in.num_qo_heads >= 1, "num_qo_heads = ", in.num_qo_heads, " must be >= 1");
  KVATTN_CHECK(in.num_kv_heads >= 1 && in.num_kv_heads <= 32767, "num_kv_heads = ", in.num_kv_heads,
               " is out of range [1, 32767]");
  KVATTN_CHECK(in.num_qo_heads % in.num_kv_heads == 0, "num_qo_heads = ", in.num_qo_heads,
               " is not a multiple of num_kv_heads = ", in.num_kv_heads);
  KVATTN_CHECK(in.head_dim_qk >= 1, "head_dim_qk = ", in.head_dim_qk, " must be >= 1");
  KVATTN_CHECK(in.head_dim_vo >= 0, "head_dim_vo = ", in.head_dim_vo,
               " must be >= 1 (or 0 for head_dim_qk)");
  KVATTN_CHECK(in.tile.query_tokens >= 1, "tile.query_tokens = ", in.tile.query_tokens,
               " must be >= 1");
  KVATTN_CHECK(in.tile.kv_tokens >= 1, "tile.kv_tokens = ", in.tile.kv_tokens, " must be >= 1");
  KVATTN_CHECK(in.window_left >= -1, "window_left = ", in.window_left,
               " must be >= 0 (or -1 for no window)");
  KVATTN_CHECK(opt.fixed_split_size >= 0, "fixed_split_size = ", opt.fixed_split_size,
               " must be >= 0 (0: chosen by the planner)");
  const CostModel& c = opt.cost;
  KVATTN_CHECK(
      c.per_item >= 0 && c.per_query_row >= 0 && c.per_kv_token >= 0 && c.per_partial_row >= 0,
      "cost model coefficients must be >= 0 (per_item = ", c.per_item,
      ", per_query_row = ", c.per_query_row, ", per_kv_token = ", c.per_kv_token,
      ", per_partial_row = ", c.per_partial_row, ")");
  KVATTN_CHECK(c.per_item + c.per_query_row + c.per_kv_token > 0,
               "cost model: per_item, per_query_row and per_kv_token are all 0");
  KVATTN_CHECK(!in.qo_indptr.empty(), "qo_indptr is empty; it needs batch_size + 1 entries");
  const int64_t B = int64_t(in.qo_indptr.size()) - 1;
  KVATTN_CHECK(in.qo_indptr[0] == 0, "qo_indptr[0] = ", in.qo_indptr[0], " must be 0");
  KVATTN_CHECK(int64_t(in.kv_len.size()) == B, "kv_len has ", in.kv_len.size(),
               " entries but qo_indptr describes ", B, " requests");
  for (int64_t b = 0; b < B; ++b) {
    KVATTN_CHECK(in.qo_indptr[size_t(b + 1)] >= in.qo_indptr[size_t(b)], "qo_indptr[", b + 1,
                 "] = ", in.qo_indptr[size_t(b + 1)], " is less than qo_indptr[", b,
                 "] = ", in.qo_indptr[size_t(b)], " (request ", b,
                 " would have a negative query length)");
    KVATTN_CHECK(in.kv_len[size_t(b)] >= 0 && in.kv_len[size_t(b)] <= kMaxKVLen, "kv_len[", b, "] = ",
                 in.kv_len[size_t(b)], " is out of range [0, ", kMaxKVLen, "] (kvattn/plan.h)");
  }
  KVATTN_CHECK(in.qo_indptr.back() <= kMaxTotalTokens, "qo_indptr[", B, "] = ", in.qo_indptr.back(),
               " query tokens exceed the limit of ", kMaxTotalTokens, " (kvattn/plan.h)");
  if (opt.cuda_graph) {
    const GraphCapacity& g = *opt.cuda_graph;
    KVATTN_CHECK(g.max_batch >= 1, "cuda_graph.max_batch = ", g.max_batch, " must be >= 1");
    KVATTN_CHECK(g.max_tokens >= 1 && g.max_tokens <= kMaxTotalTokens, "cuda_graph.max_tokens = ", g.max_tokens,
                 " is out of range [1, ", kMaxTotalTokens, "] (kvattn/plan.h)");
    KVATTN_CHECK(g.max_split_items >= -1, "cuda_graph.max_split_items = ", g.max_split_items,
                 " must be >= 0 (or -1 for 2 x num_workers)");
    KVATTN_CHECK(B <= g.max_batch, "batch size ", B,
                 " exceeds the cuda_graph capacity max_batch = ", g.max_batch);
    KVATTN_CHECK(in.qo_indptr.back() <= g.max_tokens, "qo_indptr[", B, "] = ", in.qo_indptr.back(),
                 " query tokens exceed the cuda_graph capacity max_tokens = ", g.max_tokens);
  }
}

// sum over t in [lo, hi) of max(0, a + b t), for b in {-T, 0, T}: the positive part of a line is
// one interval of t, summed as an arithmetic series.
__int128 positive_sum(int64_t lo, int64_t hi, int64_t a, int64_t b) {
  if (lo >= hi) return 0;
  auto value = [&](int64_t t) { return __int128(a) + __int128(b) * t; };
  if (b == 0) return a > 0 ? __int128(a) * (hi - lo) : 0;
  if (b > 0) {  // positive from the first t with a + b t > 0 on
    if (value(lo) <= 0) lo += int64_t((-value(lo)) / b) + 1;
  } else {  // positive up to the last t with a + b t > 0
    if (value(hi - 1) <= 0) hi -= int64_t((-value(hi - 1)) / (-b)) + 1;
  }
  if (lo >= hi) return 0;
  const __int128 n = hi - lo;
  return (value(lo) + value(hi - 1)) * n / 2;  // an integer: the two ends have the parity of n - 1 steps
}
}  // namespace

RequestWork request_work(int64_t qo, int64_t kv, int query_tile, bool causal, int window_left) {
  RequestWork w;
  if (qo <= 0) return w;
  const int64_t T = query_tile, n = (qo + T - 1) / T, off = kv - qo;
  w.tiles = n;
  // The tiles' visible ranges, as the planner builds them: [v0, v1) with
  // v1 = causal ? min(kv, off + q1) : kv and v0 = window ? max(0, off + q0 - w) : 0.
  auto visible = [&](int64_t q0, int64_t q1) -> int64_t {
    const int64_t v1 = causal ? std::min(kv, off + q1) : kv;
    const int64_t v0 = window_left >= 0 ? std::max<int64_t>(0, off + q0 - window_left) : 0;
    return v1 > v0 ? v1 - v0 : 0;
  };
  w.visible = visible((n - 1) * T, qo);  // the last tile (maybe partial)
  // Full tiles t in [0, n - 1): q0 = t T, q1 = (t + 1) T <= qo - 1, so off + q1 < kv: the causal
  // end is off + (t + 1) T. The window's start is 0 below t0 and off + t T - w from t0 on.
  const int64_t full = n - 1;
  const int64_t start = window_left >= 0 ? off - window_left : 0;  // v0 = max(0, start + t T)
  int64_t t0 = window_left >= 0 ? (start >= 0 ? 0 : (-start + T - 1) / T) : full;
  t0 = std::min(t0, full);
  const int64_t end_a = causal ? off + T : kv, end_b = causal ? T : 0;  // v1 = end_a + end_b t
  w.visible += positive_sum(0, t0, end_a, end_b);                        // v0 = 0
  w.visible += positive_sum(t0, full, end_a - start, end_b - T);         // v0 = start + t T
  return w;
}

namespace {
// Limits a batch must meet whatever the split: computed in O(batch) from the lengths, before any
// allocation proportional to the work. Every schedule has at least one item per (query tile, KV
// head), and splitting only adds cost, so a batch over either limit unsplit fails every schedule.
void check_batch_size(const PlannerInputs& in, const SchedulerOptions& opt) {
  const int64_t B = int64_t(in.qo_indptr.size()) - 1;
  const int64_t H = in.num_kv_heads, group = in.num_qo_heads / in.num_kv_heads;
  const CostModel& c = opt.cost;
  int64_t tiles = 0;
  __int128 visible = 0, cost = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t qo = int64_t(in.qo_indptr[size_t(b + 1)]) - in.qo_indptr[size_t(b)];
    const RequestWork w = request_work(qo, in.kv_len[size_t(b)], in.tile.query_tokens, in.causal,
                                       in.window_left);
    tiles += w.tiles;
    visible += w.visible;
    cost += __int128(c.per_item) * w.tiles + __int128(c.per_query_row) * qo * group +
            __int128(c.per_kv_token) * w.visible;
  }
  const int64_t slice_heads = H / std::gcd(int64_t(opt.num_workers), H);
  const __int128 total = cost * slice_heads;
  KVATTN_CHECK(total <= kMaxLoad, "the batch's total cost (",
               total > std::numeric_limits<int64_t>::max() ? std::string("more than 2^63")
                                                           : std::to_string(int64_t(total)),
               " under the cost model) exceeds the planner's limit of ", kMaxLoad);
  KVATTN_CHECK(tiles * H <= kMaxWorkItems, "the batch needs at least ", tiles, " query tiles x ", H,
               " KV heads = ", tiles * H, " work items, more than the planner's limit of ", kMaxWorkItems,
               " (kvattn/plan.h)");
  if (opt.fixed_split_size > 0 && !opt.disable_split_kv) {
    const __int128 chunks = visible / opt.fixed_split_size;  // a lower bound of the chunks
    KVATTN_CHECK(chunks * H <= kMaxWorkItems, "fixed_split_size = ", opt.fixed_split_size, " cuts the batch's ",
                 int64_t(visible), " visible KV tokens into at least ", int64_t(chunks), " chunks x ", H,
                 " KV heads, more work items than the planner's limit of ", kMaxWorkItems, " (kvattn/plan.h)");
  }
}

// Indices 0..n-1 ordered by keys[i] ascending, ties by index: a stable LSD radix sort in the
// fewest passes of at most 11 bits (std::sort for short lists, of packed (key, index) integers
// when they fit: several times faster than sorting indices with a comparison through the keys).
void radix_order(std::vector<int32_t>& order, std::vector<int32_t>& tmp,
                 const std::vector<uint64_t>& keys, std::vector<uint32_t>& count,
                 std::vector<uint64_t>& packed) {
  const size_t n = keys.size();
  order.resize(n);
  std::iota(order.begin(), order.end(), 0);
  uint64_t max_key = 0;
  for (uint64_t k : keys) max_key = std::max(max_key, k);
  if (n < 2 || max_key == 0) return;
  if (n < 256) {
    constexpr int kIndexBits = 8;  // n < 256
    if (std::bit_width(max_key) <= 64 - kIndexBits) {
      packed.resize(n);
      for (size_t i = 0; i < n; ++i) packed[i] = keys[i] << kIndexBits | i;
      std::sort(packed.begin(), packed.end());
      for (size_t i = 0; i < n; ++i) order[i] = int32_t(packed[i] & ((1u << kIndexBits) - 1));
      return;
    }
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return keys[size_t(a)] < keys[size_t(b)] || (keys[size_t(a)] == keys[size_t(b)] && a < b);
    });
    return;
  }
  const int key_bits = std::bit_width(max_key);
  const int passes = (key_bits + 10) / 11;
  const int bits = (key_bits + passes - 1) / passes;
  const size_t buckets = size_t(1) << bits;
  const uint64_t mask = buckets - 1;
  // Every pass's histogram in one sweep (counts do not depend on the order), then offsets.
  count.assign(buckets * size_t(passes), 0u);
  for (uint64_t k : keys)
    for (int p = 0; p < passes; ++p) ++count[size_t(p) * buckets + ((k >> (p * bits)) & mask)];
  for (int p = 0; p < passes; ++p) {
    uint32_t sum = 0;
    for (size_t b = 0; b < buckets; ++b) {
      uint32_t& c = count[size_t(p) * buckets + b];
      const uint32_t x = c;
      c = sum;
      sum += x;
    }
  }
  tmp.resize(n);
  for (int p = 0; p < passes; ++p) {
    uint32_t* offset = count.data() + size_t(p) * buckets;
    for (size_t i = 0; i < n; ++i) {
      const int32_t g = order[i];
      tmp[offset[(keys[size_t(g)] >> (p * bits)) & mask]++] = g;
    }
    order.swap(tmp);
  }
}

// Placement of s.assigns (longest first, their costs in s.runs) on n workers by list scheduling: each
// item to the least-loaded worker, the lowest index on ties. Both placements below give the same
// assignment; they return the largest key (load << 20 | worker) written, and stop as soon as one
// reaches give_up_key (the schedule is then unusable). On completion s.loads holds the loads.

// Few workers: their keys sorted in a window q[h, h + n) of a buffer that slides right (copied
// back to the start when it reaches the end). The least-loaded worker is q[h]; its new key goes
// back by insertion, from the nearer end. In the common rounds of list scheduling (the loads
// spread less than the item) it is the largest key and lands at the back at once, and one
// placement hardly waits for the previous one: 3-14 cycles per item on the bench batches against
// a tree's 20, whose every placement waits for the previous one's root path.
constexpr size_t kWindowWorkers = 64;

uint64_t place_window(Schedule& s, std::vector<uint64_t>& buffer, size_t n, uint64_t give_up_key) {
  buffer.resize(4 * n + 4);
  uint64_t* const q = buffer.data();
  const size_t cap = buffer.size();
  // Round one: while a worker is idle, an item of positive cost goes to the idle worker of lowest
  // index (an idle worker's key is its index, below every loaded key), so item k to worker k. Its
  // keys are written as they come, then sorted into the window at once: the insertions cost up to
  // n / 2 moves an item (a new load is below the earlier ones, above the idle workers').
  uint64_t* const loaded = q + 2 * n + 2;  // scratch past the window's first 2n + 2 slots
  size_t first = 0, ri = 0, used = 0;      // items placed; runs fully placed; items of runs[ri] placed
  Assign* a = s.assigns.data();
  while (first < n && ri < s.num_runs && s.runs[ri].first > 0) {
    const uint64_t c = uint64_t(s.runs[ri].first) << kWorkerBits;
    const size_t take = std::min(s.runs[ri].second - used, n - first);
    for (size_t k = first; k < first + take; ++k) {
      a[k].worker = int32_t(k);
      loaded[k] = c | k;
      if (loaded[k] >= give_up_key) return loaded[k];
    }
    first += take;
    used += take;
    if (used == s.runs[ri].second) ++ri, used = 0;
  }
  a += first;
  // The window: the idle workers, then the loaded ones by key. Their loads fall with the index,
  // equal loads ordered by index: blocks of equal load, from the last block to the first.
  for (size_t w = first; w < n; ++w) q[1 + w - first] = w;  // slot 0 stays free for a front insertion
  for (size_t end = first, out = 1 + n - first; end > 0;) {
    size_t begin = end - 1;
    while (begin > 0 && (loaded[begin - 1] >> kWorkerBits) == (loaded[end - 1] >> kWorkerBits)) --begin;
    std::copy(loaded + begin, loaded + end, q + out);
    out += end - begin;
    end = begin;
  }
  size_t h = 1;
  for (; ri < s.num_runs; ++ri, used = 0) {
    const int64_t cost = s.runs[ri].first;
    const size_t run = s.runs[ri].second - used;  // the rest of a run that round one began
    const uint64_t c = uint64_t(cost) << kWorkerBits;
    // A run of equal costs, at least one per worker, over loads that spread less than the cost
    // goes round the workers in key order (as place_tree's place_rounds argues): the workers
    // that take one item more move to the back, in order, and the window rotates.
    if (run >= n && (q[h + n - 1] >> kWorkerBits) - (q[h] >> kWorkerBits) < uint64_t(cost)) {
      for (size_t i = 0, r = 0; i < run; ++i, r = r + 1 == n ? 0 : r + 1)
        a[i].worker = int32_t(q[h + r] & kWorkerMask);
      a += run;
      const size_t rounds = run / n, rest = run % n;
      if (h + 2 * n > cap) {
        std::copy(q + h, q + h + n, q + 1);
        h = 1;
      }
      for (size_t r = 0; r < n; ++r) q[h + r] += (rounds + (r < rest ? 1 : 0)) * c;
      std::copy(q + h, q + h + rest, q + h + n);
      h += rest;
      if (q[h + n - 1] >= give_up_key) return q[h + n - 1];
      continue;
    }
    for (const Assign* end = a + run; a != end; ++a) {
      const uint64_t key = q[h];
      a->worker = int32_t(key & kWorkerMask);
      const uint64_t nk = key + c;
      if (nk >= give_up_key) return nk;
      ++h;
      if (h + n - 1 >= cap) {  // slide back (keeping slot 0 free)
        std::copy(q + h, q + h + n - 1, q + 1);
        h = 1;
      }
      size_t j = h + n - 1;  // the free slot at the back
      if (n > 1 && nk < q[j - 1]) {
        if (nk < q[h + (n - 1) / 2]) {  // front half: move the smaller keys one slot down
          size_t i = --h;
          for (; q[i + 1] < nk; ++i) q[i] = q[i + 1];
          q[i] = nk;
          continue;
        }
        for (; q[j - 1] > nk; --j) q[j] = q[j - 1];
      }
      q[j] = nk;
    }
  }
  for (size_t i = h; i < h + n; ++i) s.loads[size_t(q[i] & kWorkerMask)] = int64_t(q[i] >> kWorkerBits);
  return q[h + n - 1];
}

// Many workers: the tournament tree (O(log n) a placement where the window's insertion is O(n)).
uint64_t place_tree(Schedule& s, WorkerTree& tree, size_t n, uint64_t give_up_key) {
  tree.reset(n);
  uint64_t* const node = tree.node.data();
  const size_t leaves = tree.leaves;
  uint64_t root = node[1];
  uint64_t high = 0;  // the largest key written
  // One item to the least-loaded worker (the root is kept in a register).
  auto place_one = [&](int64_t cost) {
    const int32_t w = int32_t(root & kWorkerMask);
    size_t i = leaves + size_t(w);
    uint64_t v = root + (uint64_t(cost) << kWorkerBits);
    high = std::max(high, v);
    node[i] = v;
    for (; i > 1; i >>= 1) {
      v = std::min(v, node[i ^ 1]);
      node[i >> 1] = v;
    }
    root = v;
    return w;
  };
  // `count` items of one cost when the loads spread less than that cost: greedy then takes the
  // workers in (load, index) order, and after each round every load has grown by the cost with
  // the order unchanged, so the items go round that order; the same assignment as place_one's, in
  // O(workers log workers + count) instead of O(count log workers).
  auto place_rounds = [&](Assign* a, size_t count, int64_t cost) {
    uint64_t lo = ~uint64_t(0), hi = 0;
    for (size_t w = 0; w < n; ++w) {
      lo = std::min(lo, node[leaves + w] >> kWorkerBits);
      hi = std::max(hi, node[leaves + w] >> kWorkerBits);
    }
    if (hi - lo >= uint64_t(cost)) return false;
    tree.sorted.assign(node + leaves, node + leaves + n);
    std::sort(tree.sorted.begin(), tree.sorted.end());
    for (size_t k = 0, r = 0; k < count; ++k, r = r + 1 == n ? 0 : r + 1)
      a[k].worker = int32_t(tree.sorted[r] & kWorkerMask);
    const uint64_t rounds = count / n, rest = count % n;
    for (size_t r = 0; r < n; ++r) {
      const size_t w = size_t(tree.sorted[r] & kWorkerMask);
      node[leaves + w] += ((rounds + (r < rest ? 1 : 0)) * uint64_t(cost)) << kWorkerBits;
      high = std::max(high, node[leaves + w]);
    }
    tree.rebuild();
    root = node[1];
    return true;
  };
  // Runs of equal cost (the longest-first order makes them long in uniform batches) go together.
  Assign* a = s.assigns.data();
  for (size_t ri = 0; ri < s.num_runs; ++ri) {
    const auto [cost, run] = s.runs[ri];
    if (high >= give_up_key) break;
    if (run < n || !place_rounds(a, run, cost))
      for (size_t k = 0; k < run; ++k) a[k].worker = place_one(cost);
    a += run;
  }
  for (size_t w = 0; w < n; ++w) s.loads[w] = tree.load(w);
  return high;
}

// Longest-first list scheduling of one slice for split size `split`: every item goes to the
// least-loaded worker (lowest index on ties). Items: unsplit groups in `order`, merged with the
// chunks of split groups (sorted here), each repeated for the slice's heads.
// A trial that only matters if it beats another schedule passes `give_up`: loads only grow, so as
// soon as one reaches it the makespan will too, and the schedule stops there (returns false; s then
// holds no usable schedule, only s.makespan >= give_up).
bool schedule(Schedule& s, WorkerTree& workers, const Problem& pb, int32_t split, bool balanced,
              int64_t give_up = std::numeric_limits<int64_t>::max()) {
  const std::vector<Group>& groups = *pb.groups;
  const CostModel& cm = pb.cm;
  s.split = split;
  s.cuts.resize(groups.size());
  s.classes.clear();
  s.total = pb.unsplit_total;
  s.largest = pb.max_cost;
  int64_t num_items = int64_t(groups.size());
  // The groups this split size cuts are the longest: a prefix of by_len (built by the caller when
  // split < max_len); the others count through by_len's suffix sums, without a visit.
  size_t num_cut = 0;
  if (split < pb.max_len) {
    const auto& lw = *pb.lengthwise;
    num_cut = size_t(std::partition_point(lw.begin(), lw.end(),
                                          [&](const Lengthwise& g) { return g.len > split; }) -
                     lw.begin());
    // The rest, by_len[num_cut, G), unsplit (num_cut >= 1: the longest group is cut).
    s.total = (*pb.suffix_cost)[num_cut];
    s.largest = (*pb.suffix_max)[num_cut];
  }
  const Cutter cut_range(split, pb.align, balanced);
  int64_t memo_len = -1;
  Cut memo_cut{};
  for (size_t i = 0; i < num_cut; ++i) {
    const int64_t L = (*pb.lengthwise)[i].len, sbase = (*pb.lengthwise)[i].chunk_base;
    const size_t gi = size_t((*pb.by_len)[i]);
    if (L != memo_len) {  // requests of one length are adjacent and cut alike: divide once
      memo_len = L;
      memo_cut = cut_range(L);
    }
    const Cut c = memo_cut;
    s.cuts[gi] = c;
    num_items += c.n - 1;
    const int64_t last = L - int64_t(c.n - 1) * c.piece;
    const int64_t big = sbase + cm.per_kv_token * c.piece, small = sbase + cm.per_kv_token * last;
    if (last == c.piece) {
      s.classes.push_back({big, int32_t(gi), 0, c.n});
    } else {
      s.classes.push_back({big, int32_t(gi), 0, c.n - 1});
      s.classes.push_back({small, int32_t(gi), c.n - 1, c.n});
    }
    s.total += big * (c.n - 1) + small;
    s.largest = std::max(s.largest, big);
  }
  s.total *= pb.slice_heads;
  KVATTN_CHECK(s.total <= kMaxLoad, "the batch's total cost (", s.total,
               " under the cost model) exceeds the planner's limit of ", kMaxLoad);
  auto longer = [](const Class& a, const Class& b) {
    if (a.cost != b.cost) return a.cost > b.cost;
    if (a.group != b.group) return a.group < b.group;
    return a.chunk_begin < b.chunk_begin;
  };
  // Built in length order, stable in group order, so batches of equal lengths arrive sorted: check
  // before sorting.
  if (!std::is_sorted(s.classes.begin(), s.classes.end(), longer)) {
    // A group has at most two classes, its last chunk's second, so one integer key sorts them:
    // the cost below the longest, then (group, is the last chunk). std::sort on integers is
    // several times faster than on the three-field comparison (a skewed batch sorts its classes
    // for every candidate it schedules); class_at maps a key's low bits back to its class.
    const size_t C = s.classes.size();
    int64_t lo = s.classes[0].cost, hi = lo;
    for (const Class& c : s.classes) {
      lo = std::min(lo, c.cost);
      hi = std::max(hi, c.cost);
    }
    const int index_bits = std::bit_width(2 * groups.size() - 1);
    if (std::bit_width(uint64_t(hi - lo)) + index_bits <= 64) {
      s.class_keys.resize(C);
      if (s.class_at.size() < 2 * groups.size()) s.class_at.resize(2 * groups.size());
      for (size_t i = 0; i < C; ++i) {
        const Class& c = s.classes[i];
        const uint64_t at = uint64_t(c.group) << 1 | (c.chunk_begin > 0 ? 1 : 0);
        s.class_at[at] = int32_t(i);
        s.class_keys[i] = uint64_t(hi - c.cost) << index_bits | at;
      }
      std::sort(s.class_keys.begin(), s.class_keys.end());
      s.classes_tmp.resize(C);
      const uint64_t index_mask = (uint64_t(1) << index_bits) - 1;
      for (size_t i = 0; i < C; ++i)
        s.classes_tmp[i] = s.classes[size_t(s.class_at[s.class_keys[i] & index_mask])];
      s.classes.swap(s.classes_tmp);
    } else {
      std::sort(s.classes.begin(), s.classes.end(), longer);
    }
  }

  // Items longest first, each repeated for the slice's heads: the unsplit groups (already in
  // order) merged with the split chunks; on equal cost the lower group index goes first.
  KVATTN_CHECK(num_items * pb.slice_heads <= pb.max_slice_items, "the plan needs ", num_items * pb.slice_heads,
               " work items per slice of KV heads (split size ", split, "), more than the planner's limit of ",
               pb.max_slice_items, " per slice (kvattn/plan.h: kMaxWorkItems)");
  const size_t num_assigns = size_t(num_items) * size_t(pb.slice_heads);
  s.assigns.resize(num_assigns);
  // At most one run an item; the buffer only grows (s.num_runs says how much of it is this one's).
  if (s.runs.size() < size_t(num_items)) s.runs.resize(size_t(num_items));
  // Plain pointers and locals: stores through `out` could alias the vectors' own fields, which
  // made the compiler reload them (and recompute sizes) on every item.
  Assign* out = s.assigns.data();
  Assign* run_begin = out;
  std::pair<int64_t, size_t>* runs = s.runs.data();
  std::pair<int64_t, size_t>* run = runs;
  int64_t run_cost = -1;
  const int heads = pb.slice_heads;
  // Chunks [begin, end) of a group, all of one cost, each for the slice's heads.
  auto emit = [&](int32_t group, int32_t begin, int32_t end, int64_t cost) {
    if (cost != run_cost) {
      if (out != run_begin) *run++ = {run_cost, size_t(out - run_begin)};
      run_begin = out;
      run_cost = cost;
    }
    if (heads == 1) {  // every GQA bench batch: the loop over heads took ~16 instructions an item
      for (int32_t chunk = begin; chunk < end; ++chunk) *out++ = {group, chunk, 0, -1};
      return;
    }
    for (int32_t chunk = begin; chunk < end; ++chunk)
      for (int h = 0; h < heads; ++h) *out++ = {group, chunk, h, -1};
  };
  const Ordered* main = pb.order->data();
  const Ordered* const main_end = main + pb.order->size();
  const Class* cls = s.classes.data();
  const Class* const cls_end = cls + s.classes.size();
  for (;;) {
    while (main != main_end && main->len > split) ++main;  // split: its chunks are classes
    const bool have_main = main != main_end, have_split = cls != cls_end;
    if (!have_main && !have_split) break;
    const bool take_main =
        have_main && (!have_split || main->cost > cls->cost ||
                      (main->cost == cls->cost && main->group < cls->group));
    if (take_main) {
      emit(main->group, 0, 1, main->cost);
      ++main;
    } else {
      emit(cls->group, cls->chunk_begin, cls->chunk_end, cls->cost);
      ++cls;
    }
  }
  if (out != run_begin) *run++ = {run_cost, size_t(out - run_begin)};
  s.num_runs = size_t(run - runs);
  const size_t n = size_t(pb.slice_workers);
  s.loads.resize(n);
  const uint64_t give_up_key = give_up > kMaxLoad ? ~uint64_t(0) : uint64_t(give_up) << kWorkerBits;
  const uint64_t high = n <= kWindowWorkers ? place_window(s, workers.window, n, give_up_key)
                                            : place_tree(s, workers, n, give_up_key);
  s.makespan = int64_t(high >> kWorkerBits);
  return high < give_up_key;
}

// Cost estimate of one slice for a split size (no scheduling): the cut groups one by one, the
// others from the suffix sums.
Estimate estimate(const Problem& pb, int32_t split) {
  Estimate e;
  const CostModel& cm = pb.cm;
  const std::vector<Lengthwise>& by_len = *pb.lengthwise;
  const Cutter cut_range(split, pb.align, true);
  size_t i = 0;
  // Runs of equal (length, chunk base) cut alike: one cut per run (a uniform batch is one run).
  int64_t run_len = -1, run_base = -1, run_total = 0, run_largest = 0, run_items = 0;
  for (; i < by_len.size(); ++i) {
    const int64_t L = by_len[i].len, sbase = by_len[i].chunk_base;
    if (L <= split) break;
    if (L != run_len || sbase != run_base) {
      run_len = L;
      run_base = sbase;
      const Cut c = cut_range(L);
      run_total = sbase * c.n + cm.per_kv_token * L;
      run_largest = sbase + cm.per_kv_token * c.piece;
      run_items = c.n;
    }
    e.total += run_total;
    e.largest = std::max(e.largest, run_largest);
    e.items += run_items;
  }
  e.total += (*pb.suffix_cost)[i];
  e.largest = std::max(e.largest, (*pb.suffix_max)[i]);
  e.items += int64_t(by_len.size() - i);
  e.total *= pb.slice_heads;
  e.items *= pb.slice_heads;
  return e;
}

// dst[i] = src[i] moved by dh heads, dw workers and ds partial slots (slots only where present).
void replicate_slice(WorkItem* dst, const WorkItem* src, int64_t n, int16_t dh, int32_t dw,
                     int32_t ds) {
#if defined(__SSE2__)
  // A WorkItem is two 16-byte halves: [request, kv_head|active|reserved, q_begin, q_end] and
  // [kv_begin, kv_end, worker, partial_slot]. kv_head is the low half of its 32-bit lane and stays
  // below 2^15, so adding dh to the lane never carries into `active`.
  static_assert(offsetof(WorkItem, kv_head) == 4 && offsetof(WorkItem, worker) == 24 &&
                offsetof(WorkItem, partial_slot) == 28);
  const __m128i add_lo = _mm_set_epi32(0, 0, dh, 0);
  const __m128i add_w = _mm_set_epi32(0, dw, 0, 0);
  const __m128i add_s = _mm_set_epi32(ds, 0, 0, 0);
  const __m128i minus1 = _mm_set1_epi32(-1);
  for (int64_t i = 0; i < n; ++i) {
    const __m128i* in = reinterpret_cast<const __m128i*>(src + i);
    __m128i lo = _mm_loadu_si128(in), hi = _mm_loadu_si128(in + 1);
    lo = _mm_add_epi32(lo, add_lo);
    hi = _mm_add_epi32(_mm_add_epi32(hi, add_w), _mm_and_si128(add_s, _mm_cmpgt_epi32(hi, minus1)));
    __m128i* out = reinterpret_cast<__m128i*>(dst + i);
    _mm_storeu_si128(out, lo);
    _mm_storeu_si128(out + 1, hi);
  }
#else
  for (int64_t i = 0; i < n; ++i) {
    WorkItem it = src[i];
    it.kv_head = int16_t(it.kv_head + dh);
    it.worker += dw;
    if (it.partial_slot >= 0) it.partial_slot += ds;
    dst[i] = it;
  }
#endif
}

}  // namespace

const Plan& Planner::plan(const PlannerInputs& in, const SchedulerOptions& opt) {
  check_inputs(in, opt);
  check_batch_size(in, opt);
  Scratch& sc = *scratch_;
  Plan& p = plan_;
  const int64_t B = int64_t(in.qo_indptr.size()) - 1;
  const int H = in.num_kv_heads;
  const int group_size = in.num_qo_heads / in.num_kv_heads;
  const int W = opt.num_workers;
  const int T = in.tile.query_tokens;
  const int64_t align = in.tile.kv_tokens;
  const CostModel& cm = opt.cost;

  // ---- groups: (request, query tile) with its visible KV range --------------------------------
  sc.groups.clear();
  int64_t max_len = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t qo = int64_t(in.qo_indptr[size_t(b + 1)]) - in.qo_indptr[size_t(b)];
    const int64_t kv = in.kv_len[size_t(b)];
    for (int64_t q0 = 0; q0 < qo; q0 += T) {
      const int64_t q1 = std::min<int64_t>(qo, q0 + T);
      int64_t v0 = 0, v1 = kv;
      if (in.causal) v1 = std::min<int64_t>(kv, kv - qo + q1);  // last row sees < p + 1
      if (in.window_left >= 0) v0 = std::max<int64_t>(0, kv - qo + q0 - in.window_left);
      if (v1 <= v0) v0 = v1 = 0;  // nothing visible
      const int64_t rows = (q1 - q0) * group_size;
      const int64_t cost = cm.per_item + cm.per_query_row * rows + cm.per_kv_token * (v1 - v0);
      sc.groups.push_back(
          {int32_t(b), int32_t(q0), int32_t(q1), int32_t(v0), int32_t(v1), int32_t(rows), cost});
      max_len = std::max(max_len, v1 - v0);
    }
  }
  // Longest first by unsplit cost (the schedule's order) and by visible length (the estimate's).
  // With equal rows everywhere (decode, or tiles all full) and a per-token cost, the two agree.
  const size_t G = sc.groups.size();
  int64_t max_cost = 0;
  bool same_rows = true;
  for (const Group& g : sc.groups) {
    max_cost = std::max(max_cost, g.cost);
    same_rows = same_rows && g.rows == sc.groups[0].rows;
  }
  sc.keys.resize(G);
  for (size_t i = 0; i < G; ++i) sc.keys[i] = uint64_t(max_cost - sc.groups[i].cost);
  radix_order(sc.order, sc.order_tmp, sc.keys, sc.radix_count, sc.packed_keys);
  sc.ordered.resize(G);
  for (size_t i = 0; i < G; ++i) {
    const Group& g = sc.groups[size_t(sc.order[i])];
    sc.ordered[i] = {g.cost, sc.order[i], g.v1 - g.v0};
  }
  // The estimate's order and suffix sums are built on first use (a batch that needs no split
  // never builds them).
  bool have_by_len = false;
  auto build_by_len = [&] {
    if (same_rows && cm.per_kv_token > 0) {
      sc.by_len.assign(sc.order.begin(), sc.order.end());
    } else {
      for (size_t i = 0; i < G; ++i)
        sc.keys[i] = uint64_t(max_len - (int64_t(sc.groups[i].v1) - sc.groups[i].v0));
      radix_order(sc.by_len, sc.order_tmp, sc.keys, sc.radix_count, sc.packed_keys);
    }
    sc.lengthwise.resize(G);
    for (size_t i = 0; i < G; ++i) {
      const Group& g = sc.groups[size_t(sc.by_len[i])];
      sc.lengthwise[i] = {int64_t(g.v1) - g.v0, cm.per_item + (cm.per_query_row + cm.per_partial_row) * g.rows};
    }
    sc.suffix_cost.resize(G + 1);
    sc.suffix_max.resize(G + 1);
    sc.suffix_cost[G] = sc.suffix_max[G] = 0;
    for (size_t i = G; i-- > 0;) {
      const int64_t c = sc.groups[size_t(sc.by_len[i])].cost;
      sc.suffix_cost[i] = sc.suffix_cost[i + 1] + c;
      sc.suffix_max[i] = std::max(sc.suffix_max[i + 1], c);
    }
    have_by_len = true;
  };
  int64_t unsplit_total = 0;
  for (const Group& g : sc.groups) unsplit_total += g.cost;

  // ---- worker slices: heads with identical work share one schedule ----------------------------
  const int slices = std::gcd(W, H);
  const int slice_workers = W / slices, slice_heads = H / slices;

  // ---- capacity (graph mode) ------------------------------------------------------------------
  int64_t item_cap = -1, split_budget = -1;
  if (opt.cuda_graph) {
    const GraphCapacity& g = *opt.cuda_graph;
    // Query tiles: each has >= 1 token, and sum ceil(q_b / T) <= (tokens + batch (T - 1)) / T.
    int64_t max_tiles =
        std::min<int64_t>(g.max_tokens, (g.max_tokens + int64_t(g.max_batch) * (T - 1)) / T);
    split_budget = g.max_split_items < 0 ? 2 * int64_t(W) : g.max_split_items;
    item_cap = int64_t(H) * max_tiles + split_budget;
    KVATTN_CHECK(item_cap <= kMaxWorkItems, "the cuda_graph capacity (max_batch = ", g.max_batch, ", max_tokens = ",
                 g.max_tokens, ", max_split_items = ", g.max_split_items, ") needs ", item_cap,
                 " work items, more than the planner's limit of ", kMaxWorkItems, " (kvattn/plan.h)");
  }
  const int64_t unsplit_items = int64_t(sc.groups.size()) * H;

  // ---- split size ----------------------------------------------------------------------------
  const Problem pb{&sc.groups,     &sc.ordered, &sc.by_len,   &sc.lengthwise, &sc.suffix_cost,
                   &sc.suffix_max, max_len,     unsplit_total, max_cost,       align,
                   slice_heads,    slice_workers, cm, kMaxWorkItems / slices};
  // schedule() finds the groups a split size cuts through by_len.
  auto schedule_split = [&](Schedule& s, int32_t split, bool balanced,
                            int64_t give_up = std::numeric_limits<int64_t>::max()) {
    if (split < max_len && !have_by_len) build_by_len();
    return schedule(s, sc.tree, pb, split, balanced, give_up);
  };
  // Estimates are memoised per split size: the binary search and the bounds ask for the same ones.
  sc.estimates.clear();
  auto est = [&](int32_t split) {
    if (split >= max_len)
      return Estimate{unsplit_total * slice_heads, max_cost, int64_t(G) * slice_heads};
    for (const auto& [size, e] : sc.estimates)
      if (size == split) return e;
    if (!have_by_len) build_by_len();
    const Estimate e = estimate(pb, split);
    sc.estimates.push_back({split, e});
    return e;
  };
  // A split size fits when its items stay within int32 indices and (graph mode) the split budget.
  auto fits = [&](int64_t slice_items) {
    if (slice_items * slices > kMaxWorkItems) return false;
    return split_budget < 0 || slice_items * slices - unsplit_items <= split_budget;
  };
  if (opt.disable_split_kv || max_len == 0) {
    schedule_split(sc.best, kNoSplit, true);
  } else if (opt.fixed_split_size > 0) {
    schedule_split(sc.best, opt.fixed_split_size, false);
    KVATTN_CHECK(
        fits(int64_t(sc.best.assigns.size())), "fixed_split_size = ", opt.fixed_split_size,
        " adds ", int64_t(sc.best.assigns.size()) * slices - unsplit_items,
        " split items, more than the cuda_graph capacity max_split_items = ", split_budget);
  } else {
    // Candidates: multiples of the KV tile growing by ~sqrt(2) (1, 2, 3, 4, 6, 8, 12, ...), then
    // no split at all.
    sc.candidates.clear();
    for (int64_t m = 1; m * align < max_len;) {
      sc.candidates.push_back(int32_t(m * align));
      bool pow2 = (m & (m - 1)) == 0;
      m = m == 1 ? 2 : pow2 ? m / 2 * 3 : m / 3 * 4;
    }
    sc.candidates.push_back(kNoSplit);
    const int K = int(sc.candidates.size());
    // Start with the largest split size whose largest item is at most half the mean load (longest
    // first then fills every worker to within about one small item of the mean). The largest item
    // grows with S and the total shrinks, so this is a binary search.
    auto small_items = [&](int k) {
      Estimate e = est(sc.candidates[size_t(k)]);
      return 2 * e.largest * slice_workers <= e.total;
    };
    int k0 = K - 1;
    if (!small_items(K - 1)) {
      int lo = 0, hi = K - 2;  // find the largest k in [0, K - 2] with small items, else 0
      if (!small_items(0)) {
        hi = 0;
      } else {
        while (lo < hi) {
          int mid = (lo + hi + 1) / 2;
          if (small_items(mid))
            lo = mid;
          else
            hi = mid - 1;
        }
      }
      k0 = hi;
    }
    // Graph mode: the first candidate that fits the split budget (no split always fits).
    while (k0 < K - 1 && !fits(est(sc.candidates[size_t(k0)]).items)) ++k0;
    schedule_split(sc.best, sc.candidates[size_t(k0)], true);
    // Branch and bound over the other candidates, only when the first schedule is more than 1/24
    // above its own mean, or when its mean is more than twice the batch's unsplit mean (splitting
    // only adds cost: short chunks can balance well around a mean inflated by their per-item and
    // partial-state costs, e.g. 16 queries x 4096 tokens cut into 64-token chunks, makespan 896
    // where 128-token chunks reach 512). Each candidate's lower bound is max(largest item, mean
    // load); they are scheduled in order of that bound (ties: larger S first) until the next bound
    // cannot beat the best makespan by 1/256, or a budget of placements (the first schedule's, at
    // least 512: plan() runs on the serving loop's critical path) is spent. A candidate replaces
    // the best only if it is 1/256 better.
    const int64_t first_mean = (sc.best.total + slice_workers - 1) / slice_workers;
    const int64_t unsplit_mean = (unsplit_total * slice_heads + slice_workers - 1) / slice_workers;
    if (sc.best.makespan * 24 > first_mean * 25 || first_mean > 2 * unsplit_mean) {
      // Only candidates whose bound is below the first schedule's makespan (x 255/256) can be
      // tried (the best makespan only falls), so two exact shortcuts skip most estimates: the
      // total never falls as S shrinks (finer cuts only add items), so scanning S downwards
      // stops at the first mean at or above that threshold; and the largest item is at least
      // the longest group's largest chunk, known without an estimate.
      if (!have_by_len) build_by_len();
      const int64_t threshold = sc.best.makespan;
      auto can_beat = [&](int64_t bound) { return bound * 256 < threshold * 255; };
      const Group& longest = sc.groups[size_t(sc.by_len[0])];
      const int64_t longest_len = int64_t(longest.v1) - longest.v0;
      const int64_t longest_base = cm.per_item + (cm.per_query_row + cm.per_partial_row) * longest.rows;
      sc.bounds.clear();
      for (int k = K - 1; k >= 0; --k) {
        if (k == k0) continue;
        const int32_t split = sc.candidates[size_t(k)];
        if (split < longest_len &&
            !can_beat(longest_base + cm.per_kv_token * Cutter(split, align, true)(longest_len).piece))
          continue;
        const Estimate e = est(split);
        const int64_t mean = (e.total + slice_workers - 1) / slice_workers;
        if (!can_beat(mean)) break;
        if (fits(e.items) && can_beat(e.largest)) sc.bounds.push_back({std::max(e.largest, mean), int32_t(k)});
      }
      std::sort(sc.bounds.begin(), sc.bounds.end(), [](const Bound& x, const Bound& y) {
        return x.bound < y.bound || (x.bound == y.bound && x.k > y.k);
      });
      const int64_t budget = std::max<int64_t>(512, int64_t(sc.best.assigns.size()));
      int64_t spent = 0;
      for (const Bound& c : sc.bounds) {
        if (c.bound * 256 >= sc.best.makespan * 255 || spent >= budget) break;
        // The trial replaces the best only below best x 255/256: it gives up at that load.
        const int64_t give_up = (sc.best.makespan * 255 + 255) / 256;
        const bool done = schedule_split(sc.trial, sc.candidates[size_t(c.k)], true, give_up);
        spent += int64_t(sc.trial.assigns.size());
        if (done && sc.trial.makespan * 256 < sc.best.makespan * 255) std::swap(sc.trial, sc.best);
      }
    }
    // No split at all, when it can beat the split schedule: a uniform batch of about two items
    // per worker balances as well unsplit (64 x 4096 on 264 workers: makespan 2 items against
    // 8528 split), and an unsplit plan also saves the partial states and the merge launch, which
    // the cost model does not price (measured 4% faster on the H200, docs/NOTES.md).
    if (sc.best.split != kNoSplit) {
      const Estimate e = est(kNoSplit);
      const int64_t bound = std::max(e.largest, (e.total + slice_workers - 1) / slice_workers);
      if (bound * 256 < sc.best.makespan * 255) {
        if (schedule_split(sc.trial, kNoSplit, true, sc.best.makespan + 1))
          std::swap(sc.trial, sc.best);
      }
    }
  }
  const Schedule& best = sc.best;

  // ---- merge table and partial slots ----------------------------------------------------------
  sc.slot_base.assign(sc.groups.size(), -1);
  sc.merge_base.assign(sc.groups.size(), -1);
  // Head-major numbering: head h's slots are [h * head_slots, (h + 1) * head_slots), a split group
  // gi's chunks at slot_base[gi] inside; likewise merge entries with head_merges per head.
  int64_t head_merges = 0, head_slots = 0, split_rows = 0;
  for (size_t gi = 0; gi < sc.groups.size(); ++gi) {
    if (sc.groups[gi].v1 - sc.groups[gi].v0 <= best.split) continue;  // not cut (no cuts[gi])
    const Cut& c = best.cuts[gi];
    sc.slot_base[gi] = int32_t(head_slots);
    sc.merge_base[gi] = int32_t(head_merges);
    head_slots += c.n;
    head_merges += 1;
    split_rows += int64_t(sc.groups[gi].rows) * H;
  }
  const bool any_split = head_merges > 0;
  const int64_t num_slots = head_slots * H, num_merges = head_merges * H;
  const int64_t num_items = int64_t(best.assigns.size()) * slices;
  KVATTN_CHECK(std::max(num_items, item_cap) <= kMaxWorkItems &&
                   num_slots <= std::numeric_limits<int32_t>::max(),
               "the plan needs ", std::max(num_items, item_cap), " work items and ", num_slots,
               " partial slots, more than int32 indices can address");
  if (item_cap >= 0) {
    // Guaranteed by construction (capacity checks above); kept as an invariant check.
    KVATTN_CHECK(num_items <= item_cap && num_slots <= 2 * split_budget, "internal: plan of ",
                 num_items, " items exceeds the graph capacity ", item_cap);
  }

  p.graph_mode_ = bool(opt.cuda_graph);
  p.cost_ = cm;
  p.batch_size_ = B;
  p.num_kv_heads_ = H;
  p.group_size_ = group_size;
  p.head_dim_vo_ = in.head_dim_vo > 0 ? in.head_dim_vo : in.head_dim_qk;
  p.query_tile_ = T;
  p.slices_ = slices;
  p.slice_heads_ = slice_heads;
  p.slice_workers_ = slice_workers;
  p.slice_slots_ = int64_t(slice_heads) * head_slots;
  p.slice_zero_only_ = opt.slice_zero_only;
  // What the plan stores: every slice, or slice 0 only (its share of the graph-mode padding too).
  const int stored_slices = opt.slice_zero_only ? 1 : slices;
  const int64_t stored_items = num_items / slices * stored_slices;
  p.split_size_ = any_split ? (best.split == kNoSplit ? 0 : best.split) : 0;
  p.num_items_ = num_items;
  p.num_merges_ = num_merges;
  p.num_slots_ = num_slots;
  p.split_rows_ = split_rows;  // packed rows: query tokens x query heads
  p.slot_capacity_ = p.graph_mode_ ? 2 * split_budget : num_slots;
  p.items_.resize(size_t(!p.graph_mode_              ? stored_items
                         : opt.slice_zero_only ? (item_cap + slices - 1) / slices
                                               : item_cap));
  p.merges_.resize(size_t(p.graph_mode_ ? split_budget : num_merges));

  // Worker ranges: local worker w of slice s is global worker s * slice_workers + w.
  p.worker_begin_.resize(size_t(stored_slices) * slice_workers + 1);
  sc.cursor.assign(size_t(slice_workers), 0);
  for (const Assign& a : best.assigns) ++sc.cursor[size_t(a.worker)];
  p.worker_begin_[0] = 0;
  for (int s = 0, gw = 0; s < stored_slices; ++s)
    for (int w = 0; w < slice_workers; ++w, ++gw)
      p.worker_begin_[size_t(gw) + 1] = p.worker_begin_[size_t(gw)] + sc.cursor[size_t(w)];
  p.worker_cost_.resize(size_t(W));
  for (int s = 0; s < slices; ++s)
    for (int w = 0; w < slice_workers; ++w)
      p.worker_cost_[size_t(s * slice_workers + w)] = best.loads[size_t(w)];
  p.total_cost_ = best.total * slices;
  p.max_cost_ = best.makespan;
  p.largest_item_ = best.largest;

  // Items, in each worker's assignment order. Slice 0 is written from the schedule; every other
  // slice is the same list shifted by whole slices of workers, heads and slots.
  const int64_t A = int64_t(best.assigns.size());
  WorkItem* items = p.items_.data();
  for (int w = 0; w < slice_workers; ++w) sc.cursor[size_t(w)] = p.worker_begin_[size_t(w)];
  for (const Assign& a : best.assigns) {
    const Group& g = sc.groups[size_t(a.group)];
    WorkItem it;
    it.request = g.request;
    it.kv_head = int16_t(a.head);
    it.active = true;
    it.q_begin = g.q_begin;
    it.q_end = g.q_end;
    it.kv_begin = g.v0;
    it.kv_end = g.v1;
    it.worker = a.worker;
    const int32_t slot0 = sc.slot_base[size_t(a.group)];
    it.partial_slot = -1;
    if (slot0 >= 0) {  // a chunk of a cut group (only those have best.cuts)
      const Cut& cut = best.cuts[size_t(a.group)];
      it.kv_begin = int32_t(g.v0 + int64_t(a.chunk) * cut.piece);
      it.kv_end = int32_t(std::min<int64_t>(g.v1, int64_t(it.kv_begin) + cut.piece));
      it.partial_slot = int32_t(a.head * head_slots + slot0 + a.chunk);
    }
    items[sc.cursor[size_t(a.worker)]++] = it;
  }
  for (int s = 1; s < stored_slices; ++s)
    replicate_slice(items + s * A, items, A, int16_t(s * slice_heads), s * slice_workers,
                    int32_t(s * slice_heads * head_slots));
  for (int64_t i = stored_items; i < int64_t(p.items_.size()); ++i) items[i] = WorkItem{};

  // Merge table: per head, the split groups in order.
  MergeEntry* merges = p.merges_.data();
  for (size_t gi = 0; gi < sc.groups.size(); ++gi) {
    if (sc.merge_base[gi] < 0) continue;
    const Group& g = sc.groups[gi];
    const Cut& cut = best.cuts[gi];
    for (int h = 0; h < H; ++h)
      merges[h * head_merges + sc.merge_base[gi]] = {
          g.request, h, g.q_begin, g.q_end, int32_t(h * head_slots + sc.slot_base[gi]), cut.n};
  }
  for (int64_t i = num_merges; i < int64_t(p.merges_.size()); ++i) merges[i] = MergeEntry{};
  return p;
}

Plan make_plan(const PlannerInputs& inputs, const SchedulerOptions& options) {
  Planner planner;
  planner.plan(inputs, options);
  return planner.current();
}

// ---- KV lengths from the formats ----------------------------------------------------------------
namespace {
void check_indptr(const char* name, std::span<const int32_t> indptr) {
  KVATTN_CHECK(!indptr.empty(), name, " is empty; it needs batch_size + 1 entries");
  KVATTN_CHECK(indptr[0] == 0, name, "[0] = ", indptr[0], " must be 0");
  for (size_t i = 1; i < indptr.size(); ++i)
    KVATTN_CHECK(indptr[i] >= indptr[i - 1], name, "[", i, "] = ", indptr[i], " is less than ",
                 name, "[", i - 1, "] = ", indptr[i - 1]);
}
}  // namespace

std::vector<int32_t> kv_lengths_paged(std::span<const int32_t> indptr,
                                      std::span<const int32_t> last_page_len, int page_size) {
  check_indptr("kv_indptr", indptr);
  KVATTN_CHECK(page_size >= 1, "page_size = ", page_size, " must be >= 1");
  const size_t B = indptr.size() - 1;
  KVATTN_CHECK(last_page_len.size() == B, "kv_last_page_len has ", last_page_len.size(),
               " entries but kv_indptr describes ", B, " requests");
  std::vector<int32_t> len(B);
  for (size_t b = 0; b < B; ++b) {
    int64_t pages = int64_t(indptr[b + 1]) - indptr[b];
    int32_t last = last_page_len[b];
    if (pages == 0) {
      KVATTN_CHECK(last >= 0 && last <= page_size, "kv_last_page_len[", b, "] = ", last,
                   " is out of range [0, ", page_size, "]");
      len[b] = 0;
      continue;
    }
    KVATTN_CHECK(last >= 1 && last <= page_size, "kv_last_page_len[", b, "] = ", last,
                 " is out of range [1, ", page_size, "]");
    int64_t L = int64_t(page_size) * (pages - 1) + last;
    KVATTN_CHECK(L <= std::numeric_limits<int32_t>::max(), "request ", b, " has ", L,
                 " KV tokens, more than int32 can hold");
    len[b] = int32_t(L);
  }
  return len;
}

std::vector<int32_t> kv_lengths_ragged(std::span<const int32_t> indptr) {
  check_indptr("kv_indptr", indptr);
  std::vector<int32_t> len(indptr.size() - 1);
  for (size_t b = 0; b < len.size(); ++b) len[b] = indptr[b + 1] - indptr[b];
  return len;
}

std::vector<int32_t> kv_lengths_bsr(std::span<const int32_t> indptr, int block_cols) {
  check_indptr("bsr indptr", indptr);
  KVATTN_CHECK(block_cols >= 1, "bsr C = ", block_cols, " must be >= 1");
  std::vector<int32_t> len(indptr.size() - 1);
  for (size_t r = 0; r < len.size(); ++r) {
    int64_t L = (int64_t(indptr[r + 1]) - indptr[r]) * block_cols;
    KVATTN_CHECK(L <= std::numeric_limits<int32_t>::max(), "bsr block row ", r, " has ", L,
                 " KV tokens, more than int32 can hold");
    len[r] = int32_t(L);
  }
  return len;
}

}  // namespace kvattn
