// The load-balanced planner ("plan once, run many", DESIGN.md). plan() is pure host code: from the
// per-request query and KV lengths it builds a work list of (request, kv head, query tile, kv
// chunk) items, splits long KV ranges into chunks, assigns the items to a fixed number of workers
// (CTAs on the GPU, threads on the CPU) so that the most loaded worker is close to the mean, and
// writes the merge table that reduces the partial (o, lse) states of split rows into the output.
//
// Cost model (integer, in "KV-token equivalents"; see CostModel): one item of `rows` packed query
// rows (query tokens x GQA group size) over `kv` KV tokens costs
//
//     per_item + per_query_row * rows + per_kv_token * kv (+ per_partial_row * rows if split)
//
// A worker's load is the sum of its items' costs. Scheduling:
//   1. every request is cut into query tiles of `tile.query_tokens` rows; each tile's visible KV
//      range is shrunk by the causal mask and the sliding window (bottom-right alignment: query i
//      sits at position kv_len - qo_len + i);
//   2. a split size S (KV tokens per chunk, a multiple of tile.kv_tokens; candidates grow by
//      ~sqrt(2)) is chosen by search. A tile's range of L tokens is cut into n = ceil(L / S)
//      chunks of equal size rounded up to tile.kv_tokens. The first candidate is the largest S
//      whose largest item is at most half the mean load (binary search on the estimates: total
//      cost T(S), largest item C(S)); if its schedule is more than 1/24 above its own mean, the
//      other candidates are tried in order of their lower bound max(C, T / workers) (branch and
//      bound, within a budget). The objective is the most loaded worker's cost (makespan); a
//      candidate must be 1/256 better to replace the best;
//   3. items are assigned longest-first to the least-loaded worker (ties: lowest worker index),
//      so max load <= mean load + largest item. Heads with identical work are scheduled once:
//      with g = gcd(workers, kv heads) the workers form g slices of workers / g, each serving
//      kv_heads / g heads with the same schedule.
// Everything is integer arithmetic with fixed tie-breaks: the same inputs give the same plan.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace kvattn {

// Limits of one batch; plan() rejects more with kvattn::Error. Positions and token counts are
// int32 in the kernels and the work items, and the kernels step through them in tiles of up to
// 2^16 tokens, so no tile end may pass 2^31 - 1.
inline constexpr int64_t kMaxKVLen = (int64_t(1) << 31) - (int64_t(1) << 16);  // KV tokens of a request
inline constexpr int64_t kMaxTotalTokens = kMaxKVLen;  // query tokens of a batch (and ragged KV tokens)
// Work items of one plan (2 GB of items): what the planner builds is bounded, so a legal but
// absurd request (fixed_split_size 1 over 2^31 keys) is an error from its lengths, not an
// allocation failure. Graph mode's capacity counts against it too.
inline constexpr int64_t kMaxWorkItems = int64_t(1) << 26;

// Cost coefficients of the scheduling model, in KV-token equivalents. The defaults model a
// memory-bound kernel with bf16 K/V: a packed query row (q loaded, o stored) costs about as much as
// one KV token of one head; a split row also writes an f32 partial state (o and lse) that the merge
// reads back (about 4 tokens' worth); every item pays a fixed prologue/epilogue (pipeline fill,
// about a microsecond of an SM, ~64 tokens).
struct CostModel {
  int64_t per_item = 64;
  int64_t per_query_row = 1;
  int64_t per_kv_token = 1;
  int64_t per_partial_row = 4;
};

// The kernel's tile: query tokens per item (all heads of one KV head's group) and the KV step.
// Chunks the planner chooses are multiples of kv_tokens long (for a paged cache, pass a multiple of
// the page size) and start at the tile's first visible token: token 0, so whole pages, unless a
// sliding window cuts the range (fixed_split_size chunks are exactly that size, from the same
// start).
struct TileShape {
  int query_tokens = 16;
  int kv_tokens = 64;
};

// CUDA-graph mode: a capacity given once. The work list, the merge table and the partial-state
// slots then have fixed sizes: items = kv_heads x (most query tiles max_batch requests of
// max_tokens tokens can have) + max_split_items, merge entries = max_split_items, partial slots
// = 2 x max_split_items. Padding items are inactive (worker -1), unused merge entries have
// request -1, and a re-plan with new lengths rewrites the same buffers (a Planner's data pointers
// stay put); a batch over the capacity is an error, and the split search keeps within it. A
// captured run() also replays the kernel and the variant's values it captured, so the attention
// wrappers refuse a graph-mode re-plan that changes the shape (heads, head dims, dtypes) or the
// variant (features, scales, soft-cap, window, RoPE constants): plan on a new object for that.
struct GraphCapacity {
  int32_t max_batch = 0;         // requests
  int64_t max_tokens = 0;        // query tokens, all requests together
  int32_t max_split_items = -1;  // items that splitting may add; -1: 2 x num_workers
};

struct SchedulerOptions {
  int num_workers = 0;  // 0: the backend's default (CPU: its threads; GPU: SMs x resident CTAs)
  int fixed_split_size = 0;       // > 0: KV chunks of exactly this many tokens (batch-invariant)
  bool disable_split_kv = false;  // one chunk per (request, head, query tile) (batch-invariant)
  std::optional<GraphCapacity> cuda_graph;
  CostModel cost{};
  // For backends that repeat the plan's slices themselves (Plan::num_slices(); the CUDA decode
  // runner): the plan stores slice 0's items and worker ranges only, which saves writing the
  // other slices (7/8 of the items at 32/8 heads on 264 workers). Each backend sets it for itself.
  bool slice_zero_only = false;
};

// What the planner needs to know about a batch. The spans must stay valid during plan() only.
struct PlannerInputs {
  std::span<const int32_t> qo_indptr;  // [B+1]: query rows of request b are [qo_indptr[b], [b+1])
  std::span<const int32_t> kv_len;     // [B]: KV tokens per request
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int head_dim_qk = 0;
  int head_dim_vo = 0;  // 0: head_dim_qk
  TileShape tile{};
  // Masks that shrink the KV range each query tile can see (positions aligned bottom-right). Leave
  // them off when KV indices are not positions (block-sparse) or the mask is arbitrary (custom).
  bool causal = false;
  int window_left = -1;  // -1: no sliding window
};

// One piece of work: query rows [q_begin, q_end) of `request` (for the query heads of kv_head)
// against the request's KV tokens [kv_begin, kv_end). An empty KV range still produces its rows
// (o = 0, lse = -inf). partial_slot < 0: the item writes the output; otherwise it writes its
// partial state to that slot and a merge entry reduces it.
struct WorkItem {
  int32_t request = 0;
  int16_t kv_head = 0;
  bool active = false;
  uint8_t reserved = 0;  // zero (keeps the record free of undefined padding)
  int32_t q_begin = 0, q_end = 0;
  int32_t kv_begin = 0, kv_end = 0;
  int32_t worker = -1;  // -1 for inactive padding
  int32_t partial_slot = -1;

  int32_t q_rows() const { return q_end - q_begin; }
  int32_t kv_tokens() const { return kv_end - kv_begin; }
};
static_assert(sizeof(WorkItem) == 32, "WorkItem is one 32-byte record (host and device)");

// One split row group: the partial states in slots [slot_begin, slot_begin + num_slots) (in KV
// order) fold, in that order, into query rows [q_begin, q_end) of `request`, heads of kv_head.
// request = -1 (and num_slots = 0) marks an unused entry of a CUDA-graph plan's fixed table.
struct MergeEntry {
  int32_t request = -1;
  int32_t kv_head = 0;
  int32_t q_begin = 0, q_end = 0;
  int32_t slot_begin = 0;
  int32_t num_slots = 0;
};

class Planner;

class Plan {
 public:
  // Active items grouped by worker, each worker's list in execution order (longest first). With
  // SchedulerOptions::slice_zero_only, the items, worker ranges and padding below are slice 0's
  // (workers [0, slice_workers())); num_items() still counts every slice's.
  std::span<const WorkItem> items() const { return {items_.data(), size_t(stored_items())}; }
  // Every slot of the work list: items() followed by inactive padding (graph mode).
  std::span<const WorkItem> all_items() const { return items_; }
  // worker < num_workers(); with slice_zero_only, < slice_workers() (kvattn::Error otherwise:
  // the other slices' lists are not stored).
  std::span<const WorkItem> worker_items(int worker) const;
  // The merge table of split rows (active entries; graph mode keeps a fixed-capacity buffer).
  std::span<const MergeEntry> merges() const { return {merges_.data(), size_t(num_merges_)}; }
  // [workers + 1] (slice_workers() + 1 with slice_zero_only): worker w's items are
  // [worker_begin()[w], worker_begin()[w + 1]) of all_items()
  // (int32, ready to copy to the device as the CTAs' work ranges).
  std::span<const int32_t> worker_begin() const { return worker_begin_; }
  // Cost of each worker's items under the plan's cost model.
  std::span<const int64_t> worker_costs() const { return worker_cost_; }

  int num_workers() const { return int(worker_cost_.size()); }
  int64_t num_items() const { return num_items_; }
  int64_t num_merges() const { return num_merges_; }
  int64_t num_partial_slots() const { return num_slots_; }
  // all_items().size(): num_items() or, in graph mode, GraphCapacity's item count (its share
  // per slice, rounded up, with slice_zero_only).
  int64_t item_capacity() const { return int64_t(items_.size()); }
  int64_t merge_capacity() const { return int64_t(merges_.size()); }
  int64_t slot_capacity() const { return slot_capacity_; }
  bool graph_mode() const { return graph_mode_; }
  // KV tokens per chunk of the chosen split (0: nothing was split).
  int32_t split_size() const { return split_size_; }
  int64_t batch_size() const { return batch_size_; }
  int num_kv_heads() const { return num_kv_heads_; }
  int group_size() const { return group_size_; }
  int head_dim_vo() const { return head_dim_vo_; }
  int query_tile() const { return query_tile_; }
  // A partial slot holds query_tile() x group_size() rows, each head_dim_vo() floats of o and one
  // lse: the scratch a backend needs for the split rows is partial_state_floats().
  int64_t partial_slot_rows() const { return int64_t(query_tile_) * group_size_; }
  int64_t partial_state_floats() const {
    return slot_capacity_ * partial_slot_rows() * (int64_t(head_dim_vo_) + 1);
  }
  // Query rows x heads whose KV was split: sum over merge entries of rows x group size.
  int64_t split_rows() const { return split_rows_; }
  // The most partial slots one merge entry folds (0 when nothing was split).
  int32_t max_merge_slots() const {
    int32_t most = 0;
    for (const MergeEntry& m : merges()) most = m.num_slots > most ? m.num_slots : most;
    return most;
  }

  // Cost statistics.
  int64_t total_cost() const { return total_cost_; }
  int64_t max_worker_cost() const { return max_cost_; }
  int64_t largest_item_cost() const { return largest_item_; }
  double mean_worker_cost() const {
    return worker_cost_.empty() ? 0.0 : double(total_cost_) / double(worker_cost_.size());
  }
  // The most loaded worker's cost over the mean (1.0 is perfect balance; 1.0 for an empty plan).
  double max_over_mean() const {
    double m = mean_worker_cost();
    return m > 0 ? double(max_cost_) / m : 1.0;
  }
  // Cost of one item under the plan's model (the planner's own accounting).
  int64_t item_cost(const WorkItem& item) const;

  // Slices: heads with identical work share one schedule. Workers and KV heads are cut into
  // num_slices() equal slices; slice s's items (workers [s W', (s + 1) W'), W' = slice_workers())
  // are slice 0's with kv_head + s slice_heads(), worker + s W' and partial_slot (where >= 0)
  // + s slice_slots(), in the same order. A backend may stage slice 0 only and shift on the device.
  int num_slices() const { return slices_; }
  int slice_heads() const { return slice_heads_; }
  int slice_workers() const { return slice_workers_; }
  int64_t slice_slots() const { return slice_slots_; }
  // Slice 0's active items: the first num_items() / num_slices() of items().
  std::span<const WorkItem> slice_items() const { return {items_.data(), size_t(num_items_ / slices_)}; }
  bool slice_zero_only() const { return slice_zero_only_; }

 private:
  friend class Planner;
  std::vector<WorkItem> items_;
  std::vector<int32_t> worker_begin_;  // [workers + 1] into items_
  std::vector<int64_t> worker_cost_;
  std::vector<MergeEntry> merges_;
  int64_t num_items_ = 0, num_merges_ = 0, num_slots_ = 0, slot_capacity_ = 0;
  int64_t total_cost_ = 0, max_cost_ = 0, largest_item_ = 0, split_rows_ = 0;
  int64_t batch_size_ = 0;
  int32_t split_size_ = 0;
  int num_kv_heads_ = 0, group_size_ = 1, head_dim_vo_ = 0, query_tile_ = 1;
  int slices_ = 1, slice_heads_ = 0, slice_workers_ = 0;
  int64_t slice_slots_ = 0;
  bool slice_zero_only_ = false;
  int64_t stored_items() const { return slice_zero_only_ ? num_items_ / slices_ : num_items_; }
  bool graph_mode_ = false;
  CostModel cost_{};
};

// Builds plans, reusing its buffers: in graph mode, every plan() rewrites the same work list,
// merge table and worker arrays (their data pointers never change for a given capacity).
class Planner {
 public:
  Planner();
  ~Planner();
  Planner(Planner&&) noexcept;
  Planner& operator=(Planner&&) noexcept;

  // Throws kvattn::Error naming the argument and value for bad inputs (negative lengths, zero
  // workers, capacity exceeded, ...). The returned reference stays valid until the next plan().
  const Plan& plan(const PlannerInputs& inputs, const SchedulerOptions& options);
  const Plan& current() const { return plan_; }

 private:
  struct Scratch;
  Plan plan_;
  std::unique_ptr<Scratch> scratch_;
};

// One-shot convenience.
Plan make_plan(const PlannerInputs& inputs, const SchedulerOptions& options);

// Request KV lengths from the formats' host-side int32 arrays (validated; errors name the array).
// Paged: page_size * (pages - 1) + last_page_len, 0 for a request without pages.
std::vector<int32_t> kv_lengths_paged(std::span<const int32_t> indptr,
                                      std::span<const int32_t> last_page_len, int page_size);
// Ragged: indptr[b + 1] - indptr[b].
std::vector<int32_t> kv_lengths_ragged(std::span<const int32_t> indptr);
// Block-sparse rows of C-wide column blocks: (indptr[r + 1] - indptr[r]) * C.
std::vector<int32_t> kv_lengths_bsr(std::span<const int32_t> indptr, int block_cols);

}  // namespace kvattn
