// Uses the installed kvattn package: one decode step of two requests on the CPU backend, with
// every key equal so the softmax is uniform and the output must be the mean of the values.
#include <kvattn/kvattn.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  const int heads = 2, dim = 8, page = 4, pages = 3;
  std::vector<float> q(2 * heads * dim, 0.5f), out(2 * heads * dim, -1.0f), lse(2 * heads);
  std::vector<float> k(pages * page * heads * dim, 1.0f), v(k.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i / (heads * dim));  // token index
  std::vector<int32_t> indptr = {0, 2, 3}, indices = {2, 0, 1}, last = {3, 4};
  using kvattn::DType;
  using kvattn::TensorView;
  kvattn::BatchDecodePlan plan;
  plan.num_qo_heads = plan.num_kv_heads = heads;
  plan.head_dim_qk = dim;
  plan.q_dtype = DType::f32;
  plan.page_size = page;
  plan.page_table = {TensorView(indptr.data(), DType::i32, {3}),
                     TensorView(indices.data(), DType::i32, {3}),
                     TensorView(last.data(), DType::i32, {2})};
  kvattn::BatchDecode decode;
  decode.plan(plan);
  auto cache = kvattn::PagedKVCache::split(TensorView(k.data(), DType::f32, {pages, page, heads, dim}),
                                           TensorView(v.data(), DType::f32, {pages, page, heads, dim}),
                                           kvattn::KVLayout::NHD);
  decode.run(TensorView(q.data(), DType::f32, {2, heads, dim}), cache,
             TensorView(out.data(), DType::f32, {2, heads, dim}),
             TensorView(lse.data(), DType::f32, {2, heads}));
  // Request 0: pages 2 (4 tokens, ids 8..11) and 0 (3 tokens, ids 0..2): mean 41/7.
  // Request 1: page 1 (4 tokens, ids 4..7): mean 5.5.
  double want[2] = {41.0 / 7.0, 5.5};
  for (int b = 0; b < 2; ++b) {
    if (std::fabs(out[b * heads * dim] - want[b]) > 1e-4) {
      std::printf("kvattn consumer: request %d got %f, want %f\n", b, out[b * heads * dim], want[b]);
      return 1;
    }
  }
  std::printf("kvattn consumer: ok (kvattn %s, found through find_package)\n", kvattn::kVersion);
  return 0;
}
