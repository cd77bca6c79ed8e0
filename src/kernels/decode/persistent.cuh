// The entry points of the decode family: a persistent worker loop over the planner's work list,
// and the merge of split rows. Kernel is DecodeKernel<...> or DecodeMmaKernel<...>.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/decode/params.cuh"
#include "kernels/variants/builtin.cuh"

namespace kvattn::kernels::decode {

// CTA blockIdx.x is worker w of the plan: it runs its items in the planner's order (longest
// first), so the schedule the planner balanced is the one the GPU executes.
template <class Kernel>
__device__ void run_worker(const DecodeParams& p, char* smem) {
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
  const DeviceWorkItem item = p.items[blockIdx.x];
  if (item.active) Kernel::run_item(p, smem, item);
}

// Folds the partial states of split rows (SEMANTICS.md merge rule, in slot = KV order; sigmoid
// attention: plain sum). One CTA per merge entry, threads over (head in group, dim).
template <int ODT, int DVO, uint32_t FEATURES>
__device__ void merge_partials(const DecodeParams& p) {
  const DeviceMergeEntry m = p.merges[blockIdx.x];
  if (m.request < 0) return;
  const int group = p.num_qo_heads / p.num_kv_heads;
  const bool softmax_on = BuiltinVariant<FEATURES>::use_softmax(p.variant);
  for (int i = threadIdx.x; i < group * DVO; i += blockDim.x) {
    const int gh = i / DVO, e = i % DVO;
    float lse_max = -INFINITY;
    for (int sl = m.slot_begin; sl < m.slot_begin + m.num_slots; ++sl)
      lse_max = fmaxf(lse_max, p.partial_lse[int64_t(sl) * group + gh]);
    float o = 0.0f, wsum = 0.0f;
    bool poisoned = false;  // a NaN state (a bad page id) makes the row NaN
    for (int sl = m.slot_begin; sl < m.slot_begin + m.num_slots; ++sl) {
      const float x = p.partial_o[(int64_t(sl) * group + gh) * DVO + e];
      const float l = p.partial_lse[int64_t(sl) * group + gh];
      poisoned |= l != l;
      if (!softmax_on) {
        o += x;
        continue;
      }
      const float w = l == -INFINITY ? 0.0f : exp2f(l - lse_max);
      o += w * x;
      wsum += w;
    }
    float lse = -INFINITY;
    if (softmax_on) {
      o = wsum > 0.0f ? o / wsum : 0.0f;
      lse = wsum > 0.0f ? lse_max + log2f(wsum) : -INFINITY;
    }
    if (poisoned) o = lse = NAN;
    const int qo_head = m.kv_head * group + gh;
    store_from_f32<ODT>(p.o, m.request * p.o_stride_n + qo_head * p.o_stride_h + e, o);
    if (p.lse && e == 0) p.lse[m.request * p.lse_stride_n + qo_head * p.lse_stride_h] = lse;
  }
}

}  // namespace kvattn::kernels::decode
