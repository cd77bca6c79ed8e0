// KV-cache formats. Every layout is a block-sparse row (BSR) matrix: a page table is a BSR whose
// column blocks are pages; a ragged tensor is one with contiguous blocks; block-sparse attention
// is a general R x C BSR.
#pragma once

#include <cstdint>

#include "kvattn/tensor.h"

namespace kvattn {

enum class KVLayout : uint8_t {
  NHD,  // [pages, page_size, heads, dim]
  HND,  // [pages, heads, page_size, dim]
};

const char* kv_layout_name(KVLayout layout);

// The page storage: K and V as two 4-D tensors, or one 5-D tensor [pages, 2, ...] viewed as two.
// Any strides are allowed except that the head dim must be contiguous (stride 1).
struct PagedKVCache {
  TensorView k;
  TensorView v;
  KVLayout layout = KVLayout::NHD;

  static PagedKVCache split(const TensorView& k, const TensorView& v, KVLayout layout);
  static PagedKVCache combined(const TensorView& kv, KVLayout layout);  // [pages, 2, ...]

  int64_t num_pages() const { return k.size(0); }
  int64_t page_size() const { return k.size(layout == KVLayout::NHD ? 1 : 2); }
  int64_t num_heads() const { return k.size(layout == KVLayout::NHD ? 2 : 1); }
  int64_t head_dim_qk() const { return k.size(3); }
  int64_t head_dim_vo() const { return v.size(3); }
  // Element strides of k/v along the token-in-page and head dimensions.
  int64_t k_token_stride() const { return k.stride(layout == KVLayout::NHD ? 1 : 2); }
  int64_t k_head_stride() const { return k.stride(layout == KVLayout::NHD ? 2 : 1); }
  int64_t v_token_stride() const { return v.stride(layout == KVLayout::NHD ? 1 : 2); }
  int64_t v_head_stride() const { return v.stride(layout == KVLayout::NHD ? 2 : 1); }
};

// Which pages each request owns (SEMANTICS.md, "Paged KV cache"). int32 arrays on the host for
// plan(): indptr [B+1], indices [nnz], last_page_len [B] (1..page_size for a request with pages).
// A request's length is page_size * (pages - 1) + last_page_len, or 0 with no pages. BatchDecode
// on the GPU also takes indices on the device (attention.h, BatchDecode::plan).
struct PageTable {
  TensorView indptr;
  TensorView indices;
  TensorView last_page_len;
};

// A block-sparse matrix of M x N with R x C blocks: block row r attends to column blocks
// indices[indptr[r] .. indptr[r+1]). int32 arrays on the host.
struct BSRMatrix {
  TensorView indptr;   // [M / R + 1]
  TensorView indices;  // [nnz], each in [0, N / C)
  int64_t M = 0, N = 0;
  int64_t R = 1, C = 1;
};

}  // namespace kvattn
