// The last step of an output row, at every kernel's final store (decode, its split-KV fold and
// merge kernel, prefill and its merge kernel, the CPU engine): a user variant's sink joins the
// softmax denominator and its output_transform runs on each element (docs/VARIANTS.md). Nothing
// happens for a variant without those hooks (the built-in one).
#pragma once

#include "kernels/variants/builtin.cuh"

namespace kvattn::kernels {

template <class V>
inline constexpr bool kHasRowEpilogue = V::kHasSink || V::kHasOutput;

// lse2: a row's base-2 LSE, -inf for a row without visible keys, NaN for a poisoned row (left
// alone). The sink's e^s joins the denominator d = 2^lse2: returns the factor d / (d + e^s) that
// the row's normalised output scales by, and moves lse2 to log2(d + e^s). 1 without a sink.
template <class V>
KVATTN_HD float apply_sink(const VariantParams& p, int request, int qo_head, float& lse2) {
  if constexpr (V::kHasSink) {
    if (V::use_softmax(p) && lse2 == lse2) {
      const float s2 = V::sink_logit(p, request, qo_head) * 1.4426950408889634f;
      const float m = fmaxf(lse2, s2);
      if (m != -INFINITY) {
        const float total = m + log2f(exp2f(lse2 - m) + exp2f(s2 - m));
        const float scale = lse2 == -INFINITY ? 0.0f : exp2f(lse2 - total);
        lse2 = total;
        return scale;
      }
    }
  }
  return 1.0f;
}

// One output element through the variant's output_transform (unchanged without one).
template <class V>
KVATTN_HD float output_of(const VariantParams& p, float value, int request, int64_t q_pos, int qo_head, int dim) {
  if constexpr (V::kHasOutput) return V::output_transform(p, value, request, q_pos, qo_head, dim);
  return value;
}

// o: n elements of the row from dimension dim0, normalised and times v_scale. Every thread that
// holds a part of a row gets the same lse2 back.
template <class V>
KVATTN_HD void finish_row(const VariantParams& p, int request, int64_t q_pos, int qo_head, int dim0, float* o, int n,
                          float& lse2) {
  if constexpr (V::kHasSink) {
    const float scale = apply_sink<V>(p, request, qo_head, lse2);
    for (int i = 0; i < n; ++i) o[i] *= scale;
  }
  if constexpr (V::kHasOutput)
    for (int i = 0; i < n; ++i) o[i] = output_of<V>(p, o[i], request, q_pos, qo_head, dim0 + i);
}

}  // namespace kvattn::kernels
