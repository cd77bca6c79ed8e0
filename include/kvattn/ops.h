// Stand-alone operations: merging attention states, appending to the paged cache, RoPE.
#pragma once

#include "kvattn/formats.h"
#include "kvattn/tensor.h"
#include "kvattn/variant.h"

namespace kvattn {

// (o, lse) (+) (o_other, lse_other) for states over disjoint KV sets (SEMANTICS.md, "Merging").
// v_*: [n, H, D] f32/f16/bf16; s_*: [n, H] f32, base-2 LSE.
void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                 const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                 void* stream = nullptr);
// v <- v (+) v_other in place; rows whose mask byte ([n] u8) is 0 are left untouched.
void merge_state_in_place(const TensorView& v, const TensorView& s, const TensorView& v_other,
                          const TensorView& s_other, const TensorView& mask = {},
                          void* stream = nullptr);
// Folds k states per row in index order: v [n, k, H, D], s [n, k, H] -> v_out [n, H, D], s_out [n, H].
void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                  const TensorView& s_out, void* stream = nullptr);

// Writes row r of append_k / append_v ([nnz, Hkv, D]) at token positions[r] of request
// batch_indices[r]. The page table already describes the lengths after the append.
void append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v,
                           const TensorView& batch_indices, const TensorView& positions,
                           const PagedKVCache& cache, const PageTable& page_table,
                           void* stream = nullptr);

struct RopeOptions : RopeConfig {
  int rotary_dim = 0;  // leading dims rotated; 0: the whole head dim
};

// q [nnz, Hq, D], k [nnz, Hk, D] rotated by pos_ids [nnz] (int32) into q_out, k_out (which may
// alias the inputs).
void apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_out,
                const TensorView& k_out, const TensorView& pos_ids, const RopeOptions& options = {},
                void* stream = nullptr);

}  // namespace kvattn
