// The flat parameter block of the batch prefill/append kernels (ragged or paged KV). Host code
// fills it (src/cuda/prefill_runner.cpp); the kernels read nothing else. Work items and merge
// entries are the planner's records, mirrored in kernels/decode/params.cuh.
#pragma once

#include "kernels/decode/params.cuh"
#include "kernels/variants/params.cuh"

namespace kvattn::kernels {

struct PrefillParams {
  const void* q;  // [nnz_q, num_qo_heads, head_dim_qk], rows of request b from qo_indptr[b]
  int64_t q_stride_n, q_stride_h;
  void* o;        // [nnz_q, num_qo_heads, head_dim_vo]
  int64_t o_stride_n, o_stride_h;
  float* lse;     // [nnz_q, num_qo_heads] or null
  int64_t lse_stride_n, lse_stride_h;

  // K/V in elements. Ragged: row of token t of request b at kv_indptr[b] + t (stride_token),
  // stride_page unused. Paged: page kv_indices[kv_indptr[b] + t / page_size], slot t % page_size.
  const void* k;
  const void* v;
  int64_t k_stride_page, k_stride_token, k_stride_head;
  int64_t v_stride_page, v_stride_token, v_stride_head;
  const int32_t* qo_indptr;         // [B + 1]
  const int32_t* kv_indptr;         // [B + 1]: tokens (ragged) or pages (paged)
  const int32_t* kv_indices;        // paged: the workspace's copy, or the caller's device-resident table
  const int32_t* kv_last_page_len;  // paged
  int32_t page_size;
  // Paged: pages in the cache. An id outside [0, num_pages) is never read through: the first one
  // is recorded in error [flag, position, value, num_pages] (BatchPrefill::check_errors() reports
  // it) and the rows of every item whose KV range holds it come out NaN (decode/params.cuh).
  int32_t num_pages;
  int32_t* error;

  // The plan: CTA blockIdx.x runs items[blockIdx.x] (inactive padding exits).
  const DeviceWorkItem* items;
  const DeviceMergeEntry* merges;
  // Partial states of split rows: slot s holds partial_rows rows (query token in the item x
  // group + head in group), o [partial_rows][head_dim_vo] (v_scale applied) and lse.
  float* partial_o;
  float* partial_lse;
  int32_t partial_rows;
  int32_t merge_row_warps;  // the merge kernel's warps per output row (common/merge_rows.cuh)

  int32_t num_qo_heads, num_kv_heads;
  VariantParams variant;  // custom-mask pointers are device pointers

  // Decode-shape kernels only (KV_WARPS > 1; kept last so the other kernels' parameter offsets
  // stay): the plan's slice 0 (include/kvattn/plan.h, "Slices"), repeated on the device. CTA i runs
  // items[i / slices] for slice s = i % slices: kv_head + s slice_heads, partial_slot (where >= 0)
  // + s slice_slots. 1 slice: items as staged.
  int32_t slices, slice_heads, slice_slots;
};

}  // namespace kvattn::kernels
