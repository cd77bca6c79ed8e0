// The entry points of the prefill family: one CTA per planner work item (blockIdx.x; blockIdx.y
// picks the chunk of GH query heads when the GQA group is wider than the M tile), and the merge of
// split rows over query ranges.
#pragma once

#include "kernels/common/merge_rows.cuh"
#include "kernels/prefill/prefill_mma_kernel.cuh"

namespace kvattn::kernels::prefill {

template <class Kernel>
__device__ void run_one_item(const PrefillParams& p, char* smem) {
  if constexpr (Kernel::kSlices) {  // params.cuh: slice 0's items for every slice
    const int32_t index = int32_t(blockIdx.x) / p.slices, s = int32_t(blockIdx.x) - index * p.slices;
    DeviceWorkItem item = p.items[index];
    item.kv_head = int16_t(item.kv_head + s * p.slice_heads);
    if (item.partial_slot >= 0) item.partial_slot += s * p.slice_slots;
    if (item.active) Kernel::run_item(p, smem, item);
  } else {
    const DeviceWorkItem item = p.items[blockIdx.x];
    if (item.active) Kernel::run_item(p, smem, item);
  }
}

// Folds the partial states of merge entry blockIdx.x in slot = KV order into query rows [q_begin,
// q_end) of its request, heads of its KV head (SEMANTICS.md merge rule; sigmoid attention: plain
// sum). A row is (query token, head in group), laid out in a slot as the prefill kernel writes
// it; CTA blockIdx.y folds rows blockIdx.y x rows_per_cta + ..., p.merge_row_warps warps per row
// (common/merge_rows.cuh).
// Variant: the kernel's variant (its softmax switch, a user variant's sink and output_transform);
// PAGED: how the request's KV length is read (the query's position for output_transform).
template <int ODT, int DVO, class Variant, bool PAGED>
__device__ void merge_partials(const PrefillParams& p) {
  const DeviceMergeEntry m = p.merges[blockIdx.x];
  if (m.request < 0) return;  // graph-mode padding: the whole CTA leaves
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int rows = (m.q_end - m.q_begin) * group;
  const int row_warps = p.merge_row_warps;
  const int row = blockIdx.y * (kMergeRowWarps / row_warps) + int(threadIdx.x / 32) / row_warps;
  const bool valid = row < rows;
  const int r = valid ? row : 0;
  const int tq = r / group, qo_head = m.kv_head * group + r % group;
  const int64_t q_row = p.qo_indptr[m.request] + m.q_begin + tq;
  const int64_t first = int64_t(m.slot_begin) * p.partial_rows + r;  // slot sl: + sl x partial_rows
  fold_row_across_warps<DVO>(p.partial_lse + first, p.partial_rows, p.partial_o + first * DVO,
                             int64_t(p.partial_rows) * DVO, m.num_slots, Variant::use_softmax(p.variant), row_warps,
                             valid, [&](int e, float o, float lse) {
                               if constexpr (kHasRowEpilogue<Variant>) {
                                 const int32_t b = m.request, n = p.kv_indptr[b + 1] - p.kv_indptr[b];
                                 const int64_t kv_len =
                                     !PAGED ? n : n == 0 ? 0 : int64_t(n - 1) * p.page_size + p.kv_last_page_len[b];
                                 const int64_t q_pos = kv_len - (p.qo_indptr[b + 1] - p.qo_indptr[b]) + m.q_begin + tq;
                                 finish_row<Variant>(p.variant, b, q_pos, qo_head, e, &o, 1, lse);
                               }
                               store_from_f32<ODT>(p.o, q_row * p.o_stride_n + int64_t(qo_head) * p.o_stride_h + e, o);
                               if (p.lse && e == 0)
                                 p.lse[q_row * p.lse_stride_n + int64_t(qo_head) * p.lse_stride_h] = lse;
                             });
}

}  // namespace kvattn::kernels::prefill
