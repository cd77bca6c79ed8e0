// The entry points of the prefill family: one CTA per planner work item (blockIdx.x; blockIdx.y
// picks the chunk of GH query heads when the GQA group is wider than the M tile), and the merge of
// split rows over query ranges.
#pragma once

#include "kernels/common/fold_states.cuh"
#include "kernels/prefill/prefill_mma_kernel.cuh"

namespace kvattn::kernels::prefill {

template <class Kernel>
__device__ void run_one_item(const PrefillParams& p, char* smem) {
  const DeviceWorkItem item = p.items[blockIdx.x];
  if (item.active) Kernel::run_item(p, smem, item);
}

// Folds the partial states of one merge entry (blockIdx.x) in slot = KV order into query rows
// [q_begin, q_end) of its request, heads of its KV head (SEMANTICS.md merge rule; sigmoid
// attention: plain sum). Threads stride over (row, dim); a row is (query token, head in group),
// laid out in a slot as the prefill kernel writes it.
template <int ODT, int DVO, bool SIGMOID>
__device__ void merge_partials(const PrefillParams& p) {
  const DeviceMergeEntry m = p.merges[blockIdx.x];
  if (m.request < 0) return;
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int rows = (m.q_end - m.q_begin) * group;
  const int64_t q_row0 = p.qo_indptr[m.request] + m.q_begin;
  for (int i = threadIdx.x; i < rows * DVO; i += blockDim.x) {
    const int row = i / DVO, e = i % DVO;
    const int tq = row / group, gh = row % group;
    const int64_t first = int64_t(m.slot_begin) * p.partial_rows + row;  // slot sl: + sl x partial_rows
    const FoldedState f = fold_states(p.partial_lse + first, p.partial_rows, p.partial_o + first * DVO + e,
                                      int64_t(p.partial_rows) * DVO, m.num_slots, !SIGMOID);
    const float o = f.o, lse = f.lse;
    const int qo_head = m.kv_head * group + gh;
    store_from_f32<ODT>(p.o, (q_row0 + tq) * p.o_stride_n + int64_t(qo_head) * p.o_stride_h + e, o);
    if (p.lse && e == 0) p.lse[(q_row0 + tq) * p.lse_stride_n + int64_t(qo_head) * p.lse_stride_h] = lse;
  }
}

}  // namespace kvattn::kernels::prefill
