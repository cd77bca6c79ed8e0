// The attention fuzzer's problem (attention_fuzz.cpp builds, runs and checks it) and its
// corruptions (attention_corruptions.cpp).
#pragma once

#include <optional>
#include <vector>

#include "fuzz/operations.h"
#include "support/paged_kv.h"

namespace kvattn_fuzz::attention {

using kvattn::KVLayout;
using kvattn::Variant;

// Everything one plan() + run() pair takes; the corruptions rewrite a copy of it.
struct AttnArgs {
  AttentionApi api = AttentionApi::decode;
  kvattn::AttentionShape shape;
  KVLayout wrapper_layout = KVLayout::NHD;
  TensorView workspace;
  bool plan_first = true;  // false: run() on a wrapper that was never planned
  // plan()
  kvattn::PageTable table;
  int page_size = 0;
  bool plan_kv_indptr = false, plan_page_table = false;  // prefill: which KV description plan() gets
  TensorView qo_indptr, kv_indptr, custom_mask, mask_indptr;
  kvattn::BSRMatrix bsr;
  // run()
  TensorView q, k, v, out, lse;
  kvattn::PagedKVCache cache;
  bool run_paged = false;  // prefill: which run() overload
  kvattn::SharedPrefix shared_prefix = kvattn::SharedPrefix::automatic;  // decode
};

// The values a request's kernel sees (decoded from storage), dense for the reference.
struct RequestValues {
  int64_t qo = 0, kv = 0, q_pos0 = 0;
  std::vector<double> q, k, v;
};

struct AttnProblem {
  AttentionApi api;
  int hq = 1, hkv = 1, dqk = 8, dvo = 8;
  DType qt = DType::f32, kvt = DType::f32, ot = DType::f32;
  Variant variant;
  KVLayout layout = KVLayout::NHD;
  int page_size = 1;
  bool want_lse = true;
  std::vector<RequestValues> reqs;
  HostTensor q, k, v, out, lse, workspace;
  std::optional<kvattn_test::PagedKV> paged;
  HostTensor qo_indptr, kv_indptr, mask, mask_indptr, bsr_indptr, bsr_indices;
  std::vector<uint8_t> mask_bytes;
  std::vector<int32_t> mask_ind, bsr_ind, bsr_idx;
  int64_t M = 0, N = 0, R = 1, C = 1;
  int64_t rows = 0;  // query rows of the batch
  int shared_prefix_pages = 0;  // decode: the requests' common first pages (0: none)
  int cascade_levels = 0;       // decode: the levels of the cascade plan() chose (0: flat)
  AttnArgs legal;
};

// The corruptions that apply to problem `p`, each rewriting `a` (a copy of p.legal) when applied.
// prior_plan: the wrapper holds a legal plan already (its construction arguments and the
// "run() before plan()" corruption are then left out).
std::vector<Corruption> attention_corruptions(Ctx& ctx, AttnProblem& p, AttnArgs& a, bool prior_plan);

}  // namespace kvattn_fuzz::attention
