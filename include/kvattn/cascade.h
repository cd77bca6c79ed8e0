// Cascade attention (composable formats, SEMANTICS.md "Cascade"): the KV of a query row is the
// union of one page list per level, e.g. level 0 a prefix shared by many requests (read once for
// all of their queries), the last level each request's own pages. Each level is attended on its
// own and the levels' states are merged (merge_state_in_place), so the result equals attention
// over the concatenated page lists, up to the rounding of one o_dtype state per level.
#pragma once

#include <memory>
#include <vector>

#include "kvattn/attention.h"

namespace kvattn {

// One level: groups of consecutive query rows, each attending to one page list of the level's
// table. Group g owns rows [qo_indptr[g], qo_indptr[g + 1]); every level covers the same rows
// (the same qo_indptr[-1]). int32 arrays on the host; with a CUDA workspace, indices may be on
// the device (as BatchPrefill's) for a level whose groups all have 1 <= rows <= kv_len.
struct CascadeLevel {
  TensorView qo_indptr;  // [G + 1]
  PageTable page_table;  // G page lists
};

// Levels from the most shared (level 0) to each request's own KV (the last). The last level's
// groups need rows <= kv_len (its queries are its last positions, as in BatchPrefill); an earlier
// level's group may have any number of rows, and no pages at all (those rows take nothing from
// that level).
//
// The variant applies to every level, except that causal masks the last level only (a row's
// earlier levels lie wholly before its own position). Position-dependent variants (sliding
// window, ALiBi, fused RoPE), custom masks, sigmoid attention (no lse to merge with) and user
// variants are rejected: a level does not know where its keys sit in a row's whole sequence.
struct CascadePlan : AttentionShape {
  std::vector<CascadeLevel> levels;
  int page_size = 0;
};

namespace detail {
struct CascadeState;  // src/api/cascade.cpp
}

class CascadeAttention {
 public:
  // The workspace: as BatchPrefill's (a CUDA byte buffer runs the levels on that device; none, or
  // a host one, runs them on the CPU). On a GPU it holds one level's state and an lse of
  // qo_indptr[-1] x num_qo_heads (GraphCapacity::max_tokens in graph mode), the merge masks, and
  // each level's plan in an equal share of the rest.
  explicit CascadeAttention(TensorView workspace = {}, KVLayout kv_layout = KVLayout::NHD);
  ~CascadeAttention();
  CascadeAttention(CascadeAttention&&) noexcept;
  CascadeAttention& operator=(CascadeAttention&&) noexcept;

  // Validates every level (errors say which: "level 1: kv_indptr ..."), then plans each one.
  void plan(const CascadePlan& params, void* stream = nullptr);
  // q [rows, Hq, Dqk] over the one paged cache all levels index; out [rows, Hq, Dvo], lse
  // optional ([rows, Hq] f32, base 2). On a GPU it only launches kernels (graph-capturable).
  void run(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
           const TensorView& lse = {}, void* stream = nullptr) const;
  // As BatchPrefill::check_errors(), over every level.
  void check_errors(void* stream = nullptr) const;

  int num_levels() const;
  // Level l's schedule (null before plan()).
  const Plan* schedule(int level) const;

 private:
  TensorView workspace_;
  KVLayout kv_layout_;
  std::unique_ptr<detail::CascadeState> state_;
};

}  // namespace kvattn
