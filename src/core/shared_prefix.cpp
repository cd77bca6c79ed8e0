#include "core/shared_prefix.h"

#include <algorithm>
#include <cstring>

namespace kvattn::detail {

const char* cascade_unsupported_feature(const Variant& v) {
  return v.window_left >= 0 ? "a sliding window"
         : v.alibi          ? "ALiBi"
         : v.rope           ? "fused RoPE"
         : v.custom_mask    ? "a custom mask"
         : v.sigmoid        ? "sigmoid attention"
         : v.custom         ? "a user variant"
                            : nullptr;
}

std::vector<SharedPrefixGroup> find_shared_prefixes(std::span<const int32_t> kv_indptr,
                                                    std::span<const int32_t> kv_indices, int min_shared_pages,
                                                    int64_t first, int64_t last, int32_t skip_pages) {
  std::vector<SharedPrefixGroup> groups;
  const int64_t batch = last < 0 ? int64_t(kv_indptr.size()) - 1 : last;
  const int32_t min_pages = std::max(min_shared_pages, 1);
  auto pages = [&](int64_t b) { return kv_indptr[size_t(b) + 1] - kv_indptr[size_t(b)] - skip_pages; };
  auto ids = [&](int64_t b) { return kv_indices.data() + kv_indptr[size_t(b)] + skip_pages; };
  for (int64_t s = first; s < batch;) {
    // A member shares at most pages - 1 ids (its last page stays its own).
    int32_t shared = pages(s) - 1;
    int64_t e = s + 1;
    for (; e < batch && shared >= min_pages; ++e) {
      const int32_t limit = std::min(shared, pages(e) - 1);
      if (limit < min_pages || ids(e)[0] != ids(s)[0]) break;
      // The common prefix with the run's first request: one memcmp for a member that shares all
      // of `limit` (the common case), else the first mismatch.
      int32_t lcp = 0;
      if (std::memcmp(ids(e), ids(s), size_t(limit) * sizeof(int32_t)) == 0) {
        lcp = limit;
      } else {
        lcp = int32_t(std::mismatch(ids(e), ids(e) + limit, ids(s)).first - ids(e));
      }
      if (lcp < min_pages) break;
      shared = std::min(shared, lcp);
    }
    if (e - s >= 2 && shared >= min_pages) {
      groups.push_back({int32_t(s), int32_t(e - s), shared, skip_pages});
      s = e;
    } else {
      ++s;
    }
  }
  return groups;
}

std::vector<std::vector<SharedPrefixGroup>> find_shared_prefix_levels(std::span<const int32_t> kv_indptr,
                                                                      std::span<const int32_t> kv_indices,
                                                                      int min_shared_pages) {
  std::vector<std::vector<SharedPrefixGroup>> levels(1);
  levels[0] = find_shared_prefixes(kv_indptr, kv_indices, min_shared_pages);
  std::vector<SharedPrefixGroup> inner;
  for (const SharedPrefixGroup& g : levels[0]) {
    auto runs = find_shared_prefixes(kv_indptr, kv_indices, min_shared_pages, g.first, g.first + g.count,
                                     g.skip_pages + g.shared_pages);
    inner.insert(inner.end(), runs.begin(), runs.end());
  }
  if (!inner.empty()) levels.push_back(std::move(inner));
  return levels;
}

namespace {
// The model's constants (H200, bf16, 32/8 heads, head dim 128; fitted to `kvattn bench cascade`'s
// rows of 2026-11-30: flat within 10%, the cascade within 20% on the 1k-32k prefixes measured).
constexpr double kHbmBytesPerUs = 4.0e6;      // 4.0 TB/s: pages read once
constexpr double kL2BytesPerUs = 8.3e6;       // pages many requests of a flat decode read again
constexpr double kFlatFixedUs = 7.0;          // one decode launch and its merge
constexpr double kCascadeFixedUs = 25.0;      // level 0's prefill, the own-KV decode, the merge
constexpr double kLevel0FlopsPerUs = 300e6;   // 300 TFLOP/s: level 0's Q K^T and P V
// Not measured: one more BatchPrefill launch and merge, from the pieces' times of a two-level run.
constexpr double kExtraLevelUs = 12.0;
}  // namespace

CascadeCost cascade_cost(const CascadeCostInputs& in, std::span<const std::vector<SharedPrefixGroup>> levels) {
  CascadeCost c;
  for (int64_t len : in.kv_len) c.flat_tokens += len;
  int64_t repeated = 0;
  double level0_flops = 0;
  for (const auto& groups : levels)
    for (const SharedPrefixGroup& g : groups) {
      const int64_t shared = int64_t(g.shared_pages) * in.page_size;
      repeated += shared * (g.count - 1);
      level0_flops += 4.0 * g.count * in.num_qo_heads * double(shared) * in.head_dim_qk;
    }
  c.cascade_tokens = c.flat_tokens - repeated;
  const double unique_bytes = double(c.cascade_tokens) * double(in.bytes_per_token);
  const double repeated_bytes = double(repeated) * double(in.bytes_per_token);
  c.flat_us = unique_bytes / kHbmBytesPerUs + repeated_bytes / kL2BytesPerUs + kFlatFixedUs;
  c.cascade_us = kCascadeFixedUs + kExtraLevelUs * double(levels.size() > 1 ? levels.size() - 1 : 0) +
                 unique_bytes / kHbmBytesPerUs + level0_flops / kLevel0FlopsPerUs;
  return c;
}

}  // namespace kvattn::detail
