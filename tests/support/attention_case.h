// One attention test case end to end: generate inputs for a batch of requests (fresh random or
// structured values, stored in the case's dtypes and layouts), run BatchDecode or BatchPrefill
// through the public API on poisoned outputs, run the float64 reference on the stored values, and
// check every output element and every lse.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvattn/attention.h"
#include "reference/reference.h"
#include "support/compare.h"
#include "support/random.h"

namespace kvattn_test {

enum class KVStore { ragged, paged, paged_combined };
enum class Fill {
  random,      // q, k ~ N(0, 1) clipped to [-3, 3], v ~ U(-1, 1)
  ones,        // everything 1: every visible key has the same logit
  structured,  // small multiples of 1/8 that depend on (token, head, lane): exact in every dtype
  aligned,     // q, k ~ U(0.5, 1.5), v ~ U(-1, 1): every q . k near head_dim (logits of one sign)
};

struct AttnCase {
  std::vector<std::pair<int64_t, int64_t>> lens;  // (qo_len, kv_len) per request
  int num_qo_heads = 4, num_kv_heads = 1, head_dim_qk = 64, head_dim_vo = 0;  // 0: = qk
  kvattn::DType q_dtype = kvattn::DType::f32;
  std::optional<kvattn::DType> kv_dtype, o_dtype;  // default: q_dtype
  kvattn::Variant variant{};
  kvattn::KVLayout layout = kvattn::KVLayout::NHD;
  int page_size = 16;
  int runs = 1;  // GPU: run() this many times on one plan, outputs re-poisoned before each, bytes compared
  KVStore store = KVStore::paged;
  bool strided = false;  // padded row/head strides on q, k, v, out, lse
  bool want_lse = true;  // ignored for sigmoid attention (it has no lse)
  Fill fill = Fill::random;
  bool kv_aligned_strides = false;  // with strided: KV strides stay 16-byte multiples (GPU)
  std::string expect_error;  // non-empty: run() must throw kvattn::Error containing this
  bool on_gpu = false;   // run on cuda:0 (decode): inputs mirrored there, outputs copied back
  bool device_page_table = false;  // on_gpu, paged: kv_indices given as a device tensor
  kvattn::SchedulerOptions scheduler{};
  int64_t workspace_bytes = 0;  // on_gpu: 0 = 64 MiB (decode), 256 MiB (prefill)
  double mask_density = 0.7;  // custom mask: probability that a bit is set
  // q of query head h multiplied by q_head_scales[h % size] (empty: 1), e.g. powers of two beyond
  // f16's range or below its normals, stored exactly in bf16.
  std::vector<double> q_head_scales;
  const ref::UserHooks* user = nullptr;  // variant.custom's hooks in double, for the reference
  ComputeTolerance tolerance{};
  double tanh_approx_error = kTanhApproxPtx;  // on_gpu soft-cap: allow_approx_tanh's bound (compare.h)

  int dvo() const { return head_dim_vo ? head_dim_vo : head_dim_qk; }
  kvattn::DType kv() const { return kv_dtype.value_or(q_dtype); }
  kvattn::DType out() const { return o_dtype.value_or(q_dtype); }
  std::string describe() const;
};

// Runs the case on BatchDecode (every qo_len must be 1; paged KV) and checks it.
void run_decode_case(const AttnCase& c, Rng& rng);
// Runs the case on BatchPrefill (ragged or paged KV as c.store says) and checks it.
void run_prefill_case(const AttnCase& c, Rng& rng);

// Helpers shared with the block-sparse tests.
double fill_value(Fill fill, char what, int64_t token, int head, int lane, Rng& rng);
kvattn::AttentionShape shape_of(const AttnCase& c);

}  // namespace kvattn_test
