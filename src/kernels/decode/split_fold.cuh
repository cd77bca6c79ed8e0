// Folding split-KV rows of decode (SEMANTICS.md merge rule, in slot = KV order; sigmoid attention:
// plain sum), two ways:
//   - merge_partials (the default): a kernel of its own after the decode kernel, the heads of a
//     merge entry spread over CTAs and each head's slots over warps (common/merge_rows.cuh);
//   - fold_split_if_last (KVATTN_DECODE_MERGE=fold): inside the decode kernel, by the last CTA to finish a
//     (merge entry, head chunk). Every split CTA stores its partial state and, after a CTA barrier,
//     its thread 0 fences and counts the CTA on the entry's counter; the one that completes the
//     count folds the slots, which are then in L2, and resets the counter for the next run. Each
//     thread folds four elements of a row with 8 slots' loads in flight (fold_states4). On the
//     H200 it measures within a few percent of the merge kernel (2026-11-30, docs/perf/HISTORY.md
//     "Decode experiments": 1 x 32k -1.5%, 1 x 4096 -5%, 16 x 4096 +2%, 1 x 32k + 63 x 512 +1%),
//     so the merge kernel stays the default; the first fold, one element per thread in two passes
//     over the slots (maximum, then sum), was 1.3-2x slower.
#pragma once

#include "kernels/common/fold_states.cuh"
#include "kernels/common/merge_rows.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/decode/params.cuh"
#include "kernels/variants/epilogue.cuh"

namespace kvattn::kernels::decode {

// Folds the slots of merge entry `m` for the group heads [gh_begin, gh_end), threads tid, tid +
// nthreads, ... over (head, 4 dims), and writes the request's output row (and LSE).
template <int ODT, int DVO, class Variant>
__device__ void fold_slots(const DecodeParams& p, const DeviceMergeEntry& m, int gh_begin, int gh_end, int tid,
                           int nthreads) {
  static_assert(DVO % 4 == 0, "four elements per thread");
  // Slots in flight: the fold's registers count for the whole decode kernel; at head dim 64 eight
  // raised its kernels from 96 to 128 registers (their main loops need fewer than hd 128's).
  constexpr int kFoldInFlight = DVO >= 128 ? 8 : 4;
  const int group = p.num_qo_heads / p.num_kv_heads;
  const bool softmax_on = Variant::use_softmax(p.variant);
  for (int i = tid; i < (gh_end - gh_begin) * (DVO / 4); i += nthreads) {
    const int gh = gh_begin + i / (DVO / 4), e = 4 * (i % (DVO / 4));
    const FoldedState4 f =
        fold_states4<kFoldInFlight>(p.partial_lse + int64_t(m.slot_begin) * group + gh, group,
                     p.partial_o + (int64_t(m.slot_begin) * group + gh) * DVO + e, int64_t(group) * DVO,
                     m.num_slots, softmax_on);
    // A NaN state (a bad page id) makes the row NaN.
    float o[4] = {f.o.x, f.o.y, f.o.z, f.o.w};
    float lse = f.lse;
    if (f.nan_state) o[0] = o[1] = o[2] = o[3] = lse = NAN;
    const int qo_head = m.kv_head * group + gh;
    if constexpr (kHasRowEpilogue<Variant>) finish_row<Variant>(p.variant, m.request, m.q_begin, qo_head, e, o, 4, lse);
    const int64_t at = m.request * p.o_stride_n + qo_head * p.o_stride_h + e;
#pragma unroll
    for (int j = 0; j < 4; ++j) store_from_f32<ODT>(p.o, at + j, o[j]);
    if (p.lse && e == 0) p.lse[m.request * p.lse_stride_n + qo_head * p.lse_stride_h] = lse;
  }
}

// The separate merge kernel's body: CTA (blockIdx.x, blockIdx.y) folds merge entry blockIdx.x's
// group heads blockIdx.y x rows_per_cta + ..., p.merge_row_warps warps per head
// (common/merge_rows.cuh). Launched with PDL it starts while the decode kernel runs: the entry
// (written by plan(), before the decode kernel) is read before the wait for the decode grid, so
// that its load (DRAM, after a cold start) is off the path from the last decode CTA to the output.
template <int ODT, int DVO, class Variant>
__device__ void merge_partials(const DecodeParams& p) {
  const DeviceMergeEntry m = p.merges[blockIdx.x];
  wait_for_prerequisite_grid();
  if (m.request < 0) return;  // graph-mode padding: the whole CTA leaves
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int row_warps = p.merge_row_warps;
  const int gh = blockIdx.y * (kMergeRowWarps / row_warps) + int(threadIdx.x / 32) / row_warps;
  const bool valid = gh < group;
  const int g = valid ? gh : 0;
  const int qo_head = m.kv_head * group + g;
  fold_row_across_warps<DVO>(
      p.partial_lse + int64_t(m.slot_begin) * group + g, group,
      p.partial_o + (int64_t(m.slot_begin) * group + g) * DVO, int64_t(group) * DVO, m.num_slots,
      Variant::use_softmax(p.variant), row_warps, valid, [&](int e, float o, float lse) {
        if constexpr (kHasRowEpilogue<Variant>) finish_row<Variant>(p.variant, m.request, m.q_begin, qo_head, e, &o, 1, lse);
        store_from_f32<ODT>(p.o, m.request * p.o_stride_n + qo_head * p.o_stride_h + e, o);
        if (p.lse && e == 0) p.lse[m.request * p.lse_stride_n + qo_head * p.lse_stride_h] = lse;
      });
}

// Called by every thread of a decode CTA after it stored its item's rows (heads [gh_begin,
// gh_begin + gh_count) of the group). Does nothing unless the item is a split row and the plan
// asked for in-kernel folding (p.merge_counters set); then the CTA that completes the count of
// (entry, blockIdx.y) folds that entry's heads of this chunk.
template <int ODT, int DVO, class Variant>
__device__ void fold_split_if_last(const DecodeParams& p, const DeviceDecodeItem& item, int gh_begin, int gh_count) {
  if (item.partial_slot < 0 || p.merge_counters == nullptr) return;  // the same for the whole CTA
  __syncthreads();  // every thread's partial stores come before thread 0's fence (which is cumulative)
  const int32_t entry = p.slot_merge[item.partial_slot];
  bool last = false;
  if (threadIdx.x == 0) {
    __threadfence();  // the CTA's partial states are visible GPU-wide before the CTA is counted
    int32_t* counter = p.merge_counters + int64_t(entry) * gridDim.y + blockIdx.y;
    last = atomicAdd(counter, 1) == p.merges[entry].num_slots - 1;
    if (last) atomicExch(counter, 0);  // every CTA of this entry and chunk has counted: reset for the next run
  }
  if (!__syncthreads_or(last)) return;
  __threadfence();  // the other CTAs' partial states are read after their counts
  fold_slots<ODT, DVO, Variant>(p, p.merges[entry], gh_begin, gh_begin + gh_count, threadIdx.x, blockDim.x);
}

}  // namespace kvattn::kernels::decode
