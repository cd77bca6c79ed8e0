#include "kvattn/formats.h"

#include "kvattn/error.h"

namespace kvattn {

const char* kv_layout_name(KVLayout layout) { return layout == KVLayout::NHD ? "NHD" : "HND"; }

PagedKVCache PagedKVCache::split(const TensorView& k, const TensorView& v, KVLayout layout) {
  KVATTN_CHECK(k.ndim() == 4, "paged k must be 4-D (", kv_layout_name(layout),
               "), got ", k.describe());
  KVATTN_CHECK(v.ndim() == 4, "paged v must be 4-D (", kv_layout_name(layout),
               "), got ", v.describe());
  return PagedKVCache{k, v, layout};
}

PagedKVCache PagedKVCache::combined(const TensorView& kv, KVLayout layout) {
  KVATTN_CHECK(kv.ndim() == 5 && kv.size(1) == 2, "combined paged kv must be 5-D [pages, 2, ",
               layout == KVLayout::NHD ? "page_size, heads" : "heads, page_size",
               ", dim], got ", kv.describe());
  // View [pages, 2, a, b, d] as two 4-D tensors: drop dim 1 and offset v by its stride.
  int64_t shape[4] = {kv.size(0), kv.size(2), kv.size(3), kv.size(4)};
  int64_t strides[4] = {kv.stride(0), kv.stride(2), kv.stride(3), kv.stride(4)};
  auto base = static_cast<char*>(kv.data());
  auto v_ptr = base + kv.stride(1) * int64_t(dtype_size(kv.dtype()));
  return PagedKVCache{TensorView(base, kv.dtype(), 4, shape, strides, kv.device()),
                      TensorView(v_ptr, kv.dtype(), 4, shape, strides, kv.device()), layout};
}

}  // namespace kvattn
