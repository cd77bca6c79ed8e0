// BlockSparseAttention on the CUDA backend, lowered onto the GPU paged prefill (core/prefill_gpu.*):
// block row r is a request whose queries are rows [r R, (r + 1) R) and whose pages are the column
// blocks indices[indptr[r] .. indptr[r+1]), each a full page of C tokens of k and v viewed as a
// paged cache [N / C, C, Hkv, D] (NHD). The kernels place a key at its index in the request's
// gathered pages, not at its absolute index j (and a query at kv_len - qo_len + i), so variants that
// read positions (causal, sliding window, ALiBi, fused RoPE) are rejected at plan(); the others
// compute exactly what the CPU backend computes.
#pragma once

#include "core/attention_plan.h"

namespace kvattn::detail {

// Throws kvattn::Error naming each position-dependent switch of the variant. Host-only: makes no
// CUDA call, so it runs (and is tested) on any machine.
void check_block_sparse_gpu_variant(const ResolvedShape& shape);

// Completes a validated block-sparse plan (qo_indptr, kv_indptr, kv_indices, kv_len filled by
// BlockSparseAttention::plan) as a paged one and stages it into the CUDA workspace.
void plan_block_sparse_gpu(AttentionPlan& plan, const AttentionPlan* previous, const TensorView& workspace,
                           const SchedulerOptions& scheduler, void* stream);

// Launches a GPU-planned block-sparse plan. q, out, lse, k and v are already checked against the
// plan (shapes, dtypes, same device as q); this checks q's device against the workspace's and the
// 16-byte alignment of the K/V rows.
void run_block_sparse_gpu(const AttentionPlan& plan, Device workspace_device, const TensorView& q,
                          const TensorView& k, const TensorView& v, const TensorView& out,
                          const TensorView& lse, void* stream);

}  // namespace kvattn::detail
