// A pool of requests in a paged bf16 cache (NHD, split K/V) with random K (normal) and V (uniform
// in [-1, 1]), and the float64 values the reference reads: tests that re-plan many batches take
// prefixes of its requests' pages (gpu_graph_test, gpu_plan_staging_test).
#pragma once

#include <cstdint>
#include <vector>

#include "kvattn/attention.h"
#include "support/device_mirror.h"
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

  // The page table of a batch of the pool's first lens.size() requests, request b over its first
  // lens[b] tokens (its own pages, in order). Keep it alive while plan() reads it (host ids).
  struct PageTable {
    HostTensor indptr, indices, last_page_len;
    kvattn::PageTable view() const { return {indptr.view(), indices.view(), last_page_len.view()}; }
  };
  PageTable page_table(const std::vector<int64_t>& lens) const;

  PagedKV cache;
  std::vector<std::vector<double>> k, v;  // per request: [max_len, num_kv_heads, head_dim]
  int num_kv_heads, head_dim, page_size;
};

#if KVATTN_WITH_CUDA
// A pool mirrored on the GPU, with host and device q, out and lse for batches of up to `requests`
// rows (bf16; lse f32) and qd, q's values as the reference reads them: the set-up of tests that
// plan many batches on one object (gpu_graph_test, gpu_decode_route_test).
struct GpuPool {
  GpuPool(int requests, int64_t max_len, int page_size, int num_qo_heads, int num_kv_heads, int head_dim, Rng& rng);
  RequestPool pool;
  DeviceMirror dk, dv;
  kvattn::PagedKVCache cache;
  HostTensor q, out, lse;
  std::vector<double> qd;
  DeviceMirror dq, dout, dlse;
};
#endif

}  // namespace kvattn_test
