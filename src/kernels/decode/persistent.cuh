// The entry points of the decode family: a persistent worker loop over the planner's work list,
// and one CTA per item. Kernel is DecodeKernel<...>, DecodeMmaKernel<...>, DecodeMmaTKernel<...> or
// DecodeBulkKernel<...>. The merge of split rows is in split_fold.cuh.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/decode/params.cuh"
#include "kernels/decode/split_fold.cuh"
#include "kernels/variants/builtin.cuh"

namespace kvattn::kernels::decode {

// CTA blockIdx.x is worker w of the plan: it runs its items in the planner's order (longest
// first), so the schedule the planner balanced is the one the GPU executes.
template <class Kernel>
__device__ void run_worker(const DecodeParams& p, char* smem) {
  if (p.merge_follows) allow_dependent_launch();  // the merge may start; it waits for this grid
  const int32_t begin = p.worker_begin[blockIdx.x], end = p.worker_begin[blockIdx.x + 1];
  for (int32_t i = begin; i < end; ++i) {
    const DeviceWorkItem item = p.items[i];
    if (!item.active) continue;
    Kernel::run_item(p, smem, item);
    __syncthreads();  // shared memory is reused by the next item
  }
}

// One CTA per work item (blockIdx.x indexes the staged list; inactive padding exits): the
// hardware's block scheduler starts the next item on an SM as soon as one finishes.
template <class Kernel>
__device__ void run_one_item(const DecodeParams& p, char* smem) {
  if (p.merge_follows) allow_dependent_launch();  // the merge may start; it waits for this grid
  const DeviceWorkItem item = p.items[blockIdx.x];
  if (item.active) Kernel::run_item(p, smem, item);
}

}  // namespace kvattn::kernels::decode
