#include "support/paged_kv.h"

#include <algorithm>
#include <numeric>

namespace kvattn_test {

using kvattn::KVLayout;

HostTensor int32_tensor(const std::vector<int32_t>& values) {
  HostTensor t(kvattn::DType::i32, {int64_t(values.size())});
  for (size_t i = 0; i < values.size(); ++i) t.set_at(int64_t(i), values[i]);
  return t;
}

std::vector<int32_t> as_int32(const HostTensor& t) {
  std::vector<int32_t> v;
  t.for_each([&](int64_t off, const std::vector<int64_t>&) { v.push_back(int32_t(t.get_at(off))); });
  return v;
}

PagedKV::PagedKV(const PagedKVSpec& spec, Rng& rng) : spec_(spec) {
  const int64_t ps = spec.page_size, shared = spec.shared_prefix_pages;
  std::vector<int32_t> ind{0}, last;
  int64_t used = 0, own = 0;  // page-table entries, and pages of the pool they take
  for (int64_t len : spec.kv_lens) {
    const int64_t n = (len + ps - 1) / ps;
    used += n;
    own += shared > 0 && n > shared ? n - shared : n;
    ind.push_back(int32_t(used));
    last.push_back(int32_t(n == 0 ? 0 : len - (n - 1) * ps));
  }
  num_pages_ = (shared > 0 ? shared : 0) + own + spec.extra_pages;
  std::vector<int32_t> ids(static_cast<size_t>(num_pages_));
  std::iota(ids.begin(), ids.end(), 0);
  rng.shuffle(ids);  // scattered: request b's pages are wherever the shuffle put them
  // The shared pages are the pool's first `shared` ids after the shuffle (so their ids are
  // scattered too); set() tells them apart by position in `ids`.
  std::vector<int32_t> flat;
  pages_.resize(spec.kv_lens.size());
  size_t next = size_t(shared > 0 ? shared : 0);
  for (size_t b = 0; b < spec.kv_lens.size(); ++b) {
    const int64_t n = ind[b + 1] - ind[b];
    const bool shares = shared > 0 && n > shared;
    if (shares) pages_[b].assign(ids.begin(), ids.begin() + shared);
    for (int64_t i = shares ? shared : 0; i < n; ++i) pages_[b].push_back(ids[next++]);
    flat.insert(flat.end(), pages_[b].begin(), pages_[b].end());
  }
  if (shared > 0) {
    shared_ids_.assign(ids.begin(), ids.begin() + shared);
    std::sort(shared_ids_.begin(), shared_ids_.end());
  }
  // Trailing garbage entries past kv_indptr[-1] are allowed and must be ignored.
  flat.push_back(int32_t(num_pages_) + 1000);
  indptr = int32_tensor(ind);
  indices = int32_tensor(flat);
  last_page_len = int32_tensor(last);

  const int64_t hkv = spec.num_kv_heads, P = num_pages_;
  auto shape4 = [&](int64_t d) {
    return spec.layout == KVLayout::NHD ? std::vector<int64_t>{P, ps, hkv, d}
                                        : std::vector<int64_t>{P, hkv, ps, d};
  };
  auto make = [&](std::vector<int64_t> shape) {
    if (spec.strided && spec.aligned) return HostTensor::strided_aligned(spec.dtype, std::move(shape));
    return spec.strided ? HostTensor::strided(spec.dtype, std::move(shape))
                        : HostTensor(spec.dtype, std::move(shape));
  };
  if (spec.combined) {
    auto s = shape4(spec.head_dim_qk);
    s.insert(s.begin() + 1, 2);
    kv = make(s);
    kv.poison();
  } else {
    k = make(shape4(spec.head_dim_qk));
    v = make(shape4(spec.head_dim_vo));
    k.poison();
    v.poison();
  }
}

kvattn::PageTable PagedKV::table() const {
  return {indptr.view(), indices.view(), last_page_len.view()};
}

kvattn::PagedKVCache PagedKV::cache() const {
  if (spec_.combined) return kvattn::PagedKVCache::combined(kv.view(), spec_.layout);
  return kvattn::PagedKVCache::split(k.view(), v.view(), spec_.layout);
}

double PagedKV::set(bool is_v, size_t b, int64_t t, int h, int e, double x) {
  const int64_t ps = spec_.page_size;
  const int64_t page = pages_[b][size_t(t / ps)], slot = t % ps;
  const bool nhd = spec_.layout == KVLayout::NHD;
  const int64_t a = nhd ? slot : h, c = nhd ? h : slot;
  HostTensor& dst = spec_.combined ? kv : (is_v ? v : k);
  const int64_t off = spec_.combined ? dst.offset({page, is_v ? 1 : 0, a, c, e})
                                     : dst.offset({page, a, c, e});
  if (std::binary_search(shared_ids_.begin(), shared_ids_.end(), int32_t(page))) {
    const auto key = std::make_pair(is_v, off);
    if (!shared_written_.insert(key).second) return dst.get_at(off);  // set by an earlier request
  }
  dst.set_at(off, x);
  return dst.get_at(off);
}

double PagedKV::set_k(size_t b, int64_t t, int h, int e, double x) { return set(false, b, t, h, e, x); }
double PagedKV::set_v(size_t b, int64_t t, int h, int e, double x) { return set(true, b, t, h, e, x); }

}  // namespace kvattn_test
