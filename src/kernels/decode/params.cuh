// The flat parameter block of the paged batch-decode kernel and its work items. Host code fills it
// (src/cuda/decode_launch.cpp); the kernel reads nothing else.
#pragma once

#include "kernels/variants/params.cuh"

namespace kvattn::kernels {

// One CTA's work: a KV range of one request for one KV head (and one chunk of its query heads,
// blockIdx.y). request < 0 marks a padding item of a CUDA-graph plan: the CTA exits at once.
struct DecodeWorkItem {
  int32_t request;
  int32_t kv_head;
  int32_t kv_begin, kv_end;  // tokens of the request, [begin, end)
  int32_t partial_slot;      // -1: write the final output; else the slot of a split row
};

// For each split (request, kv head): fold partial slots [slot_begin, slot_end) into the output.
struct DecodeMergeEntry {
  int32_t request;
  int32_t kv_head;
  int32_t slot_begin, slot_end;
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
  const int32_t* kv_indptr;
  const int32_t* kv_indices;
  const int32_t* kv_last_page_len;
  int32_t page_size;

  const DecodeWorkItem* items;
  int32_t num_items;
  const DecodeMergeEntry* merges;
  int32_t num_merges;
  float* partial_o;    // [slots, group, head_dim_vo], v_scale applied
  float* partial_lse;  // [slots, group]

  int32_t num_qo_heads, num_kv_heads;
  VariantParams variant;
};

}  // namespace kvattn::kernels
