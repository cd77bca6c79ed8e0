// TMA descriptors (CUtensorMap) of a paged K or V cache for the decode kernel that copies whole
// page boxes (kernels/decode/decode_tma_kernel.cuh). Encoded on the host through the driver's
// cuTensorMapEncodeTiled, reached with cudaGetDriverEntryPointByVersion: kvattn still links only
// the CUDA runtime.
#pragma once

#include <cstdint>

#include "kernels/decode/params.cuh"
#include "kvattn/dtype.h"

namespace kvattn::cuda {

// One paged cache as the decode kernels see it: element strides of a page, a token and a head.
struct PagedCacheView {
  const void* base = nullptr;
  DType dtype = DType::bf16;
  int head_dim = 0, page_size = 0, num_heads = 0;
  int64_t num_pages = 0;
  int64_t stride_page = 0, stride_token = 0, stride_head = 0;

  bool operator==(const PagedCacheView&) const = default;
};

// The 4-D map of `cache` (head dim, then token and head in the order of their strides, heads
// first on a tie, then page)
// with boxes of 128 bytes x 16 tokens (64 dims of f16/bf16, 128 of fp8, read as bytes), 128-byte
// swizzle. `token_dim` gets 1 when tokens are the second dimension, 2 when heads are. Returns
// false, leaving `map` alone, where TMA cannot describe the cache (not f16/bf16/fp8, a head dim
// that is not a whole number of boxes, pages of fewer than
// 16 tokens, a base address or a stride that is not a multiple of 16 bytes, a page stride that is
// not the largest) or the driver has no cuTensorMapEncodeTiled; the kernel then copies every tile
// on its cp.async path.
bool encode_paged_cache_map(const PagedCacheView& cache, kernels::TensorMapBytes& map, int& token_dim);

}  // namespace kvattn::cuda
