// A pool of requests in a paged bf16 cache (NHD, split K/V) with random K (normal) and V (uniform
// in [-1, 1]), and the float64 values the reference reads: tests that re-plan many batches take
// prefixes of its requests' pages (gpu_graph_test, gpu_plan_staging_test).
#pragma once

#include <cstdint>
#include <vector>

#include "kvattn/attention.h"
#include "support/paged_kv.h"
#include "support/random.h"

namespace kvattn_test {

struct RequestPool {
  // `requests` requests of max_len tokens each, num_kv_heads heads of head_dim, pages of page_size.
  RequestPool(int requests, int64_t max_len, int page_size, int num_kv_heads, int head_dim, Rng& rng);

  // The float64 reference of one decode step: request b (b < lens.size()) attends from its last
  // position over its first lens[b] tokens with query q + b * num_qo_heads * head_dim. Outputs,
  // their magnitudes and LSEs, concatenated in request order.
  struct Reference {
    std::vector<double> o, mag, lse;
  };
  Reference decode_reference(const std::vector<int64_t>& lens, const double* q, int num_qo_heads) const;

  // A BatchDecodePlan of this cache's shape (bf16) for num_qo_heads query heads, no page table yet.
  kvattn::BatchDecodePlan decode_plan(int num_qo_heads) const;

  PagedKV cache;
  std::vector<std::vector<double>> k, v;  // per request: [max_len, num_kv_heads, head_dim]
  int num_kv_heads, head_dim, page_size;
};

}  // namespace kvattn_test
