// The entry points of the decode family: a persistent worker loop over the planner's work list,
// and one CTA per item. Kernel is DecodeKernel<...>, DecodeMmaKernel<...>, DecodeMmaTKernel<...> or
// DecodeBulkKernel<...>. The merge of split rows is in split_fold.cuh.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/decode/params.cuh"
#include "kernels/decode/split_fold.cuh"
#include "kernels/variants/builtin.cuh"

namespace kvattn::kernels::decode {

// Item `index` of slice 0, moved to slice `s` (params.cuh: the host stages slice 0 only).
__device__ __forceinline__ DeviceWorkItem slice_item(const DecodeParams& p, int32_t index, int32_t s) {
  DeviceWorkItem item = p.items[index];
  item.kv_head = int16_t(item.kv_head + s * p.slice_heads);
  item.worker += s * p.slice_workers;
  if (item.partial_slot >= 0) item.partial_slot += s * *p.slice_slots;
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
    const DeviceWorkItem item = slice_item(p, i, s);
    if (!item.active) continue;
    Kernel::run_item(p, smem, item);
    __syncthreads();  // shared memory is reused by the next item
  }
}

// One CTA per work item (inactive padding exits): the hardware's block scheduler starts the next
// item on an SM as soon as one finishes. Slice 0's list is in start order (its workers' lists
// round-robin, longest first); the CTAs take it in blocks of slice_block items (slice_workers:
// one round), each block for slice 0, then slice 1, ...: for uniform lists this is the round-robin
// order of the whole plan. (slice_block 1, item by item for every slice, i.e. the same request's
// pages read by `slices` CTAs at once: KVATTN_DECODE_SLICE_BLOCK=1, for measurements.)
template <class Kernel>
__device__ void run_one_item(const DecodeParams& p, char* smem) {
  if (p.merge_follows) allow_dependent_launch();  // the merge may start; it waits for this grid
  const int32_t per_block = p.slice_block * p.slices;
  const int32_t block = int32_t(blockIdx.x) / per_block, k = int32_t(blockIdx.x) - block * per_block;
  const int32_t first = block * p.slice_block, width = min(p.slice_block, p.slice_capacity - first);
  const int32_t s = k / width;
  const DeviceWorkItem item = slice_item(p, first + k - s * width, s);
  if (item.active) Kernel::run_item(p, smem, item);
}

}  // namespace kvattn::kernels::decode
