// Device pointers and element strides of one attention run, as the decode and the prefill runners
// take them (filled in one place: cuda/attention_backend.cpp).
#pragma once

#include <cstdint>

namespace kvattn::cuda {

struct AttentionTensors {
  const void* q = nullptr;
  int64_t q_stride_n = 0, q_stride_h = 0;
  void* o = nullptr;
  int64_t o_stride_n = 0, o_stride_h = 0;
  float* lse = nullptr;  // may be null
  int64_t lse_stride_n = 0, lse_stride_h = 0;
  const void* k = nullptr;
  const void* v = nullptr;
  // Paged: pages in the cache (ids outside [0, num_pages) are errors) and the page strides;
  // ragged KV leaves them 0.
  int64_t num_pages = 0;
  int64_t k_stride_page = 0, k_stride_token = 0, k_stride_head = 0;
  int64_t v_stride_page = 0, v_stride_token = 0, v_stride_head = 0;
};

}  // namespace kvattn::cuda
