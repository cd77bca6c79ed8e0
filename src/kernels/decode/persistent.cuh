// The entry points of the decode family: a persistent worker loop over the planner's work list,
// and one CTA per item. Kernel is DecodeKernel<...>, DecodeMmaKernel<...>, DecodeMmaTKernel<...> or
// DecodeBulkKernel<...>. The merge of split rows is in split_fold.cuh.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/decode/params.cuh"
#include "kernels/decode/split_fold.cuh"
#include "kernels/variants/builtin.cuh"

namespace kvattn::kernels::decode {

// Item `index` of slice 0, moved to slice `s` (params.cuh: the host stages slice 0 only). The
// slot step is loaded together with the item, so a CTA's start waits for one load, not two in a
// row (skewed batches run many short split items).
__device__ __forceinline__ DeviceDecodeItem slice_item(const DecodeParams& p, int32_t index, int32_t s) {
  const int32_t slot_step = *p.slice_slots;
  DeviceDecodeItem item = p.items[index];
  item.kv_head = int16_t(item.kv_head + s * p.slice_heads);
  item.worker += s * p.slice_workers;
  if (item.partial_slot >= 0) item.partial_slot += s * slot_step;
  return item;
}

// CTA blockIdx.x is worker w of the plan: it runs its items in the planner's order (longest
// first), so the schedule the planner balanced is the one the GPU executes.
template <class Kernel>
__device__ void run_worker(const DecodeParams& p, char* smem) {
  if (p.merge_follows) allow_dependent_launch();  // the merge may start; it waits for this grid
  const int32_t s = int32_t(blockIdx.x) / p.slice_workers, w = int32_t(blockIdx.x) - s * p.slice_workers;
  const int32_t begin = p.worker_begin[w], end = p.worker_begin[w + 1];
  for (int32_t i = begin; i < end; ++i) {
    const DeviceDecodeItem item = slice_item(p, i, s);
    if (!item.active) continue;
    Kernel::run_item(p, smem, item);
    __syncthreads();  // shared memory is reused by the next item
  }
}

// One CTA per work item (inactive padding exits): the hardware's block scheduler starts the next
// item on an SM as soon as one finishes. Slice 0's list is in start order (its workers' lists
// round-robin, longest first), and CTAs i * slices + s run its item i for every slice s: the
// slices of one item (its request's other KV heads, the same pages) start together. Measured
// 0.5-1.5% faster than taking each round of the list for slice 0, then slice 1, ... (the order of
// a whole plan staged round-robin), on uniform and skewed batches alike.
template <class Kernel>
__device__ void run_one_item(const DecodeParams& p, char* smem) {
  if (p.merge_follows) allow_dependent_launch();  // the merge may start; it waits for this grid
  const int32_t index = int32_t(blockIdx.x) / p.slices;
  const DeviceDecodeItem item = slice_item(p, index, int32_t(blockIdx.x) - index * p.slices);
  if (item.active) Kernel::run_item(p, smem, item);
}

}  // namespace kvattn::kernels::decode
