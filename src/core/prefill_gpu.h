// BatchPrefill on the CUDA backend: the plan/run glue between the validated AttentionPlan and
// cuda::PrefillRunner. attention.cpp validates the tensors against the plan; these add what only
// the GPU kernels need (supported shapes and dtypes, 16-byte aligned K/V rows).
#pragma once

#include "core/attention_plan.h"

namespace kvattn::detail {

// Schedules `plan` for the GPU and stages it into the workspace (a CUDA byte buffer). Reuses the
// runner of `previous` when there is one (graph mode keeps its buffers).
void plan_prefill_gpu(AttentionPlan& plan, const AttentionPlan* previous, const TensorView& workspace,
                      const SchedulerOptions& scheduler, void* stream);

// Launches a GPU-planned prefill. Exactly one of `paged` or (`k`, `v`) is given, already checked
// against the plan (shapes, dtypes, device). `who` names the wrapper in errors.
void run_prefill_gpu(const AttentionPlan& plan, const TensorView& q, const PagedKVCache* paged,
                     const TensorView* k, const TensorView* v, const TensorView& out,
                     const TensorView& lse, void* stream, const char* who = "BatchPrefill");

// The kernels copy K/V rows in 16-byte pieces (cp.async): the base address and the strides of the
// first `ndim_checked` dimensions must be multiples of 16 bytes (a dimension of size 1 excepted).
// Host-only; throws kvattn::Error naming `name`.
void check_kv_alignment(const char* name, const TensorView& t, int ndim_checked);

}  // namespace kvattn::detail
