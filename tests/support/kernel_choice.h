// The GPU kernel choices as the tests ask for them: a problem in positional form, the H200's
// limits unless others are given (cuda::limits_of_arch for the other architectures), and the
// overrides of the test's scope (ScopedOverride) unless given.
#pragma once

#if KVATTN_WITH_CUDA
#include "core/overrides.h"
#include "cuda/decode_kernels.h"
#include "cuda/device_limits.h"
#include "cuda/prefill_kernels.h"

namespace kvattn_test {

inline kvattn::cuda::DeviceLimits h200() { return kvattn::cuda::limits_of_arch("sm_90a"); }
inline kvattn::cuda::DeviceLimits arch(const char* name) { return kvattn::cuda::limits_of_arch(name); }

inline kvattn::cuda::PrefillKernelConfig prefill_choice(
    kvattn::DType q, kvattn::DType kv, kvattn::DType o, int dqk, int dvo, int group, bool paged, int page_size,
    uint32_t features, int64_t max_qo_len, const kvattn::cuda::DeviceLimits& limits = h200(),
    bool uniform_decode = false, float soft_cap = 0.0f,
    const kvattn::detail::Overrides& overrides = kvattn::detail::active_overrides()) {
  kvattn::cuda::PrefillProblemKey key;
  key.q_dtype = q;
  key.kv_dtype = kv;
  key.o_dtype = o;
  key.head_dim_qk = dqk;
  key.head_dim_vo = dvo;
  key.group_size = group;
  key.paged = paged;
  key.page_size = page_size;
  key.features = features;
  key.max_qo_len = max_qo_len;
  key.uniform_decode = uniform_decode;
  key.soft_cap = soft_cap;
  return kvattn::cuda::choose_prefill(key, limits, overrides);
}

// bulk_copies: the H200 as it is (sm_90: bulk copies), else the same limits without them (the
// cp.async kernels, as before sm_90).
inline kvattn::cuda::DeviceLimits h200_bulk(bool bulk_copies) {
  kvattn::cuda::DeviceLimits l = h200();
  if (!bulk_copies) l.cc_major = 8;
  return l;
}

inline kvattn::cuda::DecodeKernelConfig decode_choice(kvattn::DType q, kvattn::DType kv, kvattn::DType o, int dqk,
                                                      int dvo, int group, int page_size, uint32_t features,
                                                      bool bulk_copies = false, bool skewed_batch = false) {
  kvattn::cuda::DecodeProblemKey key;
  key.q_dtype = q;
  key.kv_dtype = kv;
  key.o_dtype = o;
  key.head_dim_qk = dqk;
  key.head_dim_vo = dvo;
  key.group_size = group;
  key.page_size = page_size;
  key.features = features;
  key.skewed_batch = skewed_batch;
  return kvattn::cuda::choose_decode(key, h200_bulk(bulk_copies), kvattn::detail::active_overrides());
}

}  // namespace kvattn_test
#endif
