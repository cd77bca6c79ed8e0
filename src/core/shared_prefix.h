// Shared prefixes in an ordinary decode page table (what radix-tree servers produce: requests whose
// page lists begin with the same page ids) and the cost model that decides whether BatchDecode runs
// them as a two-level cascade (kvattn/cascade.h) or flat. Pure host code, tested on the CPU.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvattn/variant.h"

namespace kvattn::detail {

// What keeps a cascade from running variant v (nullptr: nothing): a feature that needs a key's
// position in the row's whole sequence (a level does not know it), or sigmoid attention (no lse
// to merge the levels with). CascadeAttention rejects such a variant; BatchDecode decodes flat.
const char* cascade_unsupported_feature(const Variant& v);

// Requests [first, first + count) whose page lists all begin with the same `shared_pages` ids (full
// pages: each member keeps at least one page of its own, so its last, possibly partial, page is
// never shared).
struct SharedPrefixGroup {
  int32_t first = 0, count = 0;
  int32_t shared_pages = 0;
  int32_t skip_pages = 0;  // the shared ids start there (pages an enclosing run already shares)
};

// Runs of consecutive requests of [first, last) (last -1: the batch) whose page lists, past their
// first skip_pages ids, begin with at least `min_shared_pages` equal ids; a run's shared length is
// the shortest common prefix of its members with its first request. O(requests) for a batch
// without sharing (only first ids are compared); otherwise O(shared ids), with memcmp.
std::vector<SharedPrefixGroup> find_shared_prefixes(std::span<const int32_t> kv_indptr,
                                                    std::span<const int32_t> kv_indices, int min_shared_pages,
                                                    int64_t first = 0, int64_t last = -1, int32_t skip_pages = 0);

// Nested prefixes (a system prompt shared by all, then few-shot blocks shared by some): level 0
// the runs of the batch, level 1 the runs inside each level-0 run past its shared pages (empty
// when none). Each level's groups are in request order.
std::vector<std::vector<SharedPrefixGroup>> find_shared_prefix_levels(std::span<const int32_t> kv_indptr,
                                                                      std::span<const int32_t> kv_indices,
                                                                      int min_shared_pages);

// Predicted times (microseconds, a model fitted to the H200's measured cascade and flat decode:
// docs/DESIGN.md, "Automatic cascade"). Flat decode reads each request's pages; a prefix that many
// requests read again comes mostly from L2. The cascade reads every page once, pays a fixed cost
// for its extra launches (level 0, merge) and level 0's matrix products.
struct CascadeCost {
  double flat_us = 0, cascade_us = 0;
  int64_t flat_tokens = 0, cascade_tokens = 0;
  bool cascade_wins() const { return cascade_us < 0.9 * flat_us; }  // a margin for the model's error
};
struct CascadeCostInputs {
  std::span<const int64_t> kv_len;  // tokens per request
  int page_size = 16;
  int num_qo_heads = 32, head_dim_qk = 128;
  int64_t bytes_per_token = 4096;  // K and V of every KV head
};
// `levels`: the shared levels' groups (a cascade of levels.size() + 1 levels); each extra shared
// level adds a launch and a merge.
CascadeCost cascade_cost(const CascadeCostInputs& in, std::span<const std::vector<SharedPrefixGroup>> levels);

}  // namespace kvattn::detail
