// The flat parameter block of the paged batch-decode kernel and its work items. Host code fills it
// (src/cuda/decode_runner.cpp); the kernel reads nothing else.
#pragma once

#include "kernels/variants/params.cuh"

namespace kvattn::kernels {

// The planner's records (include/kvattn/plan.h: WorkItem, MergeEntry), mirrored for device
// code; src/cuda/decode_runner.cpp and prefill_runner.cpp static_assert that the layouts match.
struct DeviceWorkItem {
  int32_t request;
  int16_t kv_head;
  bool active;
  uint8_t reserved;
  int32_t q_begin, q_end;
  int32_t kv_begin, kv_end;  // tokens of the request, [begin, end)
  int32_t worker;
  int32_t partial_slot;      // -1: write the final output; else the slot of a split row
};

// A decode CTA's work item as DecodeRunner stages it: the planner's WorkItem (same 32 bytes) with
// the query range, always [request, request + 1) in decode, replaced by the request's page run.
// Why: a CTA's first page-id loads then wait for this one load only, not for kv_indptr and
// kv_last_page_len after it (one DRAM round trip less before the first K/V bytes are asked for;
// the stamps of 1 x 32k showed 7 us from a CTA's start to its first tile).
struct DeviceDecodeItem {
  int32_t request;
  int16_t kv_head;
  bool active;
  uint8_t reserved;
  int32_t page_base;  // kv_indptr[request]: the request's first entry in kv_indices
  int32_t kv_len;     // the request's KV tokens
  int32_t kv_begin, kv_end;  // this item's tokens of the request, [begin, end)
  int32_t worker;
  int32_t partial_slot;      // -1: write the final output; else the slot of a split row
};

// Partial slots [slot_begin, slot_begin + num_slots) fold into rows [q_begin, q_end) of a request
// for the heads of kv_head. request < 0: an unused entry of a CUDA-graph plan. Decode stages
// q_begin as the query's position (kv_len - 1; a user variant's output_transform reads it) and
// reads no q_end.
struct DeviceMergeEntry {
  int32_t request;
  int32_t kv_head;
  int32_t q_begin, q_end;
  int32_t slot_begin;
  int32_t num_slots;
};

// A CUtensorMap (128 opaque bytes, 64-byte aligned), kept as bytes so that device code needs no
// driver header; src/cuda/tensor_map.cpp encodes it.
struct alignas(64) TensorMapBytes {
  uint64_t words[16];
};

struct DecodeParams {
  const void* q;  // [batch, num_qo_heads, head_dim_qk]
  int64_t q_stride_n, q_stride_h;
  void* o;        // [batch, num_qo_heads, head_dim_vo]
  int64_t o_stride_n, o_stride_h;
  float* lse;     // [batch, num_qo_heads] or null
  int64_t lse_stride_n, lse_stride_h;

  const void* k;  // pages; strides in elements
  const void* v;
  int64_t k_stride_page, k_stride_token, k_stride_head;
  int64_t v_stride_page, v_stride_token, v_stride_head;
  const int32_t* kv_indices;  // the workspace's copy, or the caller's device-resident table
  int32_t page_size;          // (each item carries its request's page run: DeviceDecodeItem)
  int32_t num_pages;          // pages in the cache: page ids outside [0, num_pages) are errors
  int32_t* error;             // [flag, position, value, num_pages] of the first bad page id

  // The plan's slice 0 (include/kvattn/plan.h, "Slices"): slice s runs the same items with
  // kv_head + s slice_heads, and partial_slot + s *slice_slots where a slot is used. One CTA per
  // item: CTA i runs items[i / slices] for slice i % slices (persistent.cuh).
  // Persistent grid: CTA w is worker w % slice_workers of slice w / slice_workers and runs items
  // [worker_begin[..], worker_begin[.. + 1]).
  const DeviceDecodeItem* items;
  const int32_t* worker_begin;  // [slice_workers + 1]
  const int32_t* slice_slots;   // one int32 in the workspace: a re-plan changes it, slices do not
  int32_t slices, slice_heads, slice_workers;
  const DeviceMergeEntry* merges;
  float* partial_o;    // [slots, group, head_dim_vo], v_scale applied
  float* partial_lse;  // [slots, group]
  // In-kernel folding of split rows (split_fold.cuh); null: the separate merge kernel folds them.
  const int32_t* slot_merge;  // [slots]: the merge entry of each partial slot
  int32_t* merge_counters;    // [merge entries, head chunks]: zero between runs
  int32_t merge_row_warps;    // the merge kernel's warps per output row (common/merge_rows.cuh)
  int32_t merge_follows;      // 1: a merge kernel launched with PDL follows; CTAs allow it early

  int32_t num_qo_heads, num_kv_heads;
  VariantParams variant;

  // DecodeTmaKernel only (decode_tma_kernel.cuh): tensor maps of the K and V caches, 4-D: head
  // dim, then token and head in the order of their strides (tma_token_dim 1: token first; 2: head
  // first), then page. tma_ready = 0: run() could not encode them (see tensor_map.h), and every
  // tile takes the kernel's cp.async path.
  int32_t tma_ready;
  int32_t tma_token_dim;
  TensorMapBytes k_map, v_map;
};

#if defined(__CUDACC__)  // device code (NVRTC or nvcc); host code includes this file for the layout
// A decode query sits at its request's last position (SEMANTICS.md, bottom-right alignment).
__device__ __forceinline__ int64_t decode_query_position(const DeviceDecodeItem& item) { return item.kv_len - 1; }

// The page id at position `pos` of kv_indices, or -1 when it lies outside [0, num_pages): then
// nothing is read through it, the first such id is recorded in p.error (BatchDecode::
// check_errors() reports it), and the caller poisons its rows with NaN. Page tables that live on
// the device are never checked on the host, so this is their only guard. report_bad_page serves
// the prefill kernels too (Params: DecodeParams or PrefillParams, whose error records match).
template <class Params>
__device__ __forceinline__ void report_bad_page(const Params& p, int32_t pos, int32_t id) {
  if (atomicCAS(p.error, 0, 1) == 0) {
    p.error[1] = pos;
    p.error[2] = id;
    p.error[3] = p.num_pages;
  }
}
__device__ __forceinline__ int32_t checked_page(const DecodeParams& p, int32_t pos) {
  const int32_t id = p.kv_indices[pos];
  if (id >= 0 && id < p.num_pages) return id;
  report_bad_page(p, pos, id);
  return -1;
}
#endif

}  // namespace kvattn::kernels
