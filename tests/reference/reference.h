// The float64 reference of every attention operation (SEMANTICS.md), written independently of the
// library's kernels: one request at a time, plain loops, softmax in double. It shares nothing with
// src/ but the public kvattn::Variant description it reads its switches from.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kvattn/variant.h"

namespace kvattn_test::ref {

// An extra visibility rule on top of the variant's own masks: (query row, key index) -> visible.
using MaskFn = std::function<bool(int64_t i, int64_t j)>;

// A user variant's hooks in double (docs/VARIANTS.md has the contract; batch is Request::batch).
// Empty functions are hooks the variant does not define.
struct UserHooks {
  std::function<double(double logit, int batch, int64_t qo_pos, int64_t kv_pos, int qo_head, int kv_head)>
      logits_transform;
  std::function<bool(int batch, int64_t qo_pos, int64_t kv_pos, int qo_head, int kv_head)> logits_mask;
  std::function<double(double value, int batch, int64_t qo_pos, int qo_head, int dim)> output_transform;
  std::function<double(int batch, int qo_head)> sink_logit;
  bool use_softmax = true;  // false: the weights are the transformed logits (no lse)
};

// One attention problem in double. Arrays are dense and row-major:
//   q [qo_len][num_qo_heads][head_dim_qk], k [kv_len][num_kv_heads][head_dim_qk],
//   v [kv_len][num_kv_heads][head_dim_vo].
// Query i sits at position q_pos0 + i, key j at position j.
struct Request {
  int64_t qo_len = 0, kv_len = 0;
  int num_qo_heads = 1, num_kv_heads = 1, head_dim_qk = 8, head_dim_vo = 8;
  const double* q = nullptr;
  const double* k = nullptr;
  const double* v = nullptr;
  int64_t q_pos0 = 0;  // kv_len - qo_len for decode and prefill, N - M for block-sparse
  MaskFn mask;         // optional: custom bit mask or block-sparse pattern
  const UserHooks* user = nullptr;  // optional: a user variant on top of the built-in switches
  int batch = 0;                    // the request's index, as the user hooks see it
};

struct Result {
  std::vector<double> o;      // [qo_len][num_qo_heads][head_dim_vo]
  std::vector<double> lse;    // [qo_len][num_qo_heads], base 2; -inf for a row that sees nothing
  // sum_j |w_ij| * |v_j[e]| * v_scale per output element: the size of the terms an output is
  // accumulated from, which bounds the kernel's f32 accumulation error (see compare.h).
  std::vector<double> o_mag;
};

Result attention(const Request& r, const kvattn::Variant& variant);

// Merging attention states (SEMANTICS.md, "Merging attention states") of one (row, head): state i
// has values o[i] (D each) and base-2 lse[i]. lse = log2(sum_i 2^lse_i), o = sum_i o_i 2^(lse_i -
// lse); a -inf state contributes nothing (its o is not read); none left: o = 0, lse = -inf.
// Returns o [D], lse [1] and o_mag [D] = max over contributing states of |o_i[e]| (a convex
// combination's rounding errors scale with it).
Result merge_states(const std::vector<std::vector<double>>& o, const std::vector<double>& lse);

// The ALiBi paper's slope of head h among n heads.
double alibi_slope(int head, int num_heads);
// RoPE frequency t (SEMANTICS.md), plain llama or Llama 3.1 scaled.
double rope_frequency(int t, int dim, const kvattn::RopeConfig& cfg);
// Rotates x[0..dim) in place for position pos.
void apply_rope(double* x, int dim, double pos, const kvattn::RopeConfig& cfg);

// Bit (i * kv_len + j) of a packed little-endian mask whose bits start at `bytes`.
MaskFn custom_mask_bits(const uint8_t* bytes, int64_t kv_len);
// Block-sparse pattern: (i, j) visible iff column block j / C is listed for row block i / R.
MaskFn bsr_pattern(std::vector<int32_t> indptr, std::vector<int32_t> indices, int64_t R, int64_t C);

}  // namespace kvattn_test::ref
