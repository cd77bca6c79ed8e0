// Test KV caches: a paged cache whose pages are scattered at random over a larger pool (unused
// pages and the unused slots of last pages stay 0xff, a NaN, so reading them shows up in the
// output), NHD or HND, split K/V or one combined 5-D [pages, 2, ...] tensor, optionally with
// padded strides; and the int32 page table describing it.
#pragma once

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "kvattn/formats.h"
#include "support/host_tensor.h"
#include "support/random.h"

namespace kvattn_test {

// A contiguous int32 host array.
HostTensor int32_tensor(const std::vector<int32_t>& values);
std::vector<int32_t> as_int32(const HostTensor& t);

struct PagedKVSpec {
  std::vector<int64_t> kv_lens;  // per request
  int page_size = 16;
  int num_kv_heads = 1, head_dim_qk = 64, head_dim_vo = 64;
  kvattn::DType dtype = kvattn::DType::f32;
  kvattn::KVLayout layout = kvattn::KVLayout::NHD;
  bool combined = false;  // one [pages, 2, ...] tensor (needs head_dim_qk == head_dim_vo)
  bool strided = false;   // padded strides on every non-last dim
  bool aligned = false;   // with strided: keep strides and start 16-byte multiples
  int extra_pages = 3;    // unused pages in the pool, at random places
  // > 0: every request with more pages than this begins with the same shared_prefix_pages pages
  // (a radix-tree cache's shared prefix), the rest its own; a shared token keeps the values first
  // written to it (set_k / set_v of a later request, or a second fill, return those).
  int shared_prefix_pages = 0;
};

class PagedKV {
 public:
  PagedKV(const PagedKVSpec& spec, Rng& rng);

  kvattn::PageTable table() const;
  kvattn::PagedKVCache cache() const;
  const PagedKVSpec& spec() const { return spec_; }
  int64_t num_pages() const { return num_pages_; }
  const std::vector<int32_t>& pages_of(size_t request) const { return pages_[request]; }

  // Stores x (rounded to the cache dtype) at token t, head h, element e of request b, and returns
  // the stored value as decoded by the tests.
  double set_k(size_t b, int64_t t, int h, int e, double x);
  double set_v(size_t b, int64_t t, int h, int e, double x);

  HostTensor indptr, indices, last_page_len;
  HostTensor k, v;  // split
  HostTensor kv;    // combined

 private:
  double set(bool is_v, size_t b, int64_t t, int h, int e, double x);
  PagedKVSpec spec_;
  int64_t num_pages_ = 0;
  std::vector<std::vector<int32_t>> pages_;
  std::vector<int32_t> shared_ids_;                   // the shared pages' ids, sorted
  std::set<std::pair<bool, int64_t>> shared_written_;  // (is_v, offset) of shared elements set
};

}  // namespace kvattn_test
