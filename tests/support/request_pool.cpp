#include "support/request_pool.h"

#include "kvattn/variant.h"
#include "reference/reference.h"

namespace kvattn_test {

RequestPool::RequestPool(int requests, int64_t max_len, int page_size, int num_kv_heads, int head_dim, Rng& rng)
    : cache(PagedKVSpec{std::vector<int64_t>(size_t(requests), max_len), page_size, num_kv_heads, head_dim, head_dim,
                        kvattn::DType::bf16, kvattn::KVLayout::NHD, false, false, false, 2},
            rng),
      k(size_t(requests)),
      v(size_t(requests)),
      num_kv_heads(num_kv_heads),
      head_dim(head_dim),
      page_size(page_size) {
  for (size_t b = 0; b < size_t(requests); ++b) {
    k[b].resize(size_t(max_len * num_kv_heads * head_dim));
    v[b].resize(size_t(max_len * num_kv_heads * head_dim));
    for (int64_t t = 0; t < max_len; ++t)
      for (int h = 0; h < num_kv_heads; ++h)
        for (int e = 0; e < head_dim; ++e) {
          const size_t i = size_t((t * num_kv_heads + h) * head_dim + e);
          k[b][i] = cache.set_k(b, t, h, e, rng.normal());
          v[b][i] = cache.set_v(b, t, h, e, rng.uniform(-1, 1));
        }
  }
}

kvattn::BatchDecodePlan RequestPool::decode_plan(int num_qo_heads) const {
  kvattn::BatchDecodePlan p;
  p.num_qo_heads = num_qo_heads;
  p.num_kv_heads = num_kv_heads;
  p.head_dim_qk = head_dim;
  p.page_size = page_size;
  return p;
}

RequestPool::PageTable RequestPool::page_table(const std::vector<int64_t>& lens) const {
  std::vector<int32_t> indptr{0}, indices, last;
  for (size_t b = 0; b < lens.size(); ++b) {
    const int64_t pages = (lens[b] + page_size - 1) / page_size;
    const auto& own = cache.pages_of(b);
    indices.insert(indices.end(), own.begin(), own.begin() + pages);
    indptr.push_back(int32_t(indices.size()));
    last.push_back(int32_t(pages ? lens[b] - (pages - 1) * page_size : 0));
  }
  return {int32_tensor(indptr), int32_tensor(indices), int32_tensor(last)};
}

#if KVATTN_WITH_CUDA
GpuPool::GpuPool(int requests, int64_t max_len, int page_size, int num_qo_heads, int num_kv_heads, int head_dim,
                 Rng& rng)
    : pool(requests, max_len, page_size, num_kv_heads, head_dim, rng),
      dk(pool.cache.k),
      dv(pool.cache.v),
      cache(kvattn::PagedKVCache::split(dk.view(), dv.view(), kvattn::KVLayout::NHD)),
      q(kvattn::DType::bf16, {requests, num_qo_heads, head_dim}),
      out(kvattn::DType::bf16, {requests, num_qo_heads, head_dim}),
      lse(kvattn::DType::f32, {requests, num_qo_heads}),
      qd(size_t(requests) * num_qo_heads * head_dim),
      dq(q),
      dout(out),
      dlse(lse) {}
#endif

RequestPool::Reference RequestPool::decode_reference(const std::vector<int64_t>& lens, const double* q,
                                                    int num_qo_heads) const {
  Reference out;
  for (size_t b = 0; b < lens.size(); ++b) {
    ref::Request r{1, lens[b], num_qo_heads, num_kv_heads, head_dim, head_dim,
                   q + b * size_t(num_qo_heads * head_dim), k[b].data(), v[b].data(), lens[b] - 1, {}};
    auto res = ref::attention(r, kvattn::Variant{});
    out.o.insert(out.o.end(), res.o.begin(), res.o.end());
    out.mag.insert(out.mag.end(), res.o_mag.begin(), res.o_mag.end());
    out.lse.insert(out.lse.end(), res.lse.begin(), res.lse.end());
  }
  return out;
}

}  // namespace kvattn_test
