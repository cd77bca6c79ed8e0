// The built-in variant, written as the functor hooks every variant implements (DESIGN.md,
// "Variants compiled just in time"):
//   query_transform / key_transform   fused RoPE on a head vector at a position
//   logits_transform                  soft-cap, then ALiBi, on the scaled logit
//   logits_mask                       causal, sliding window, custom bit mask
//   use_softmax                       false for sigmoid attention
//   sigmoid_weight                    the weight of one key under sigmoid attention
// kFeatures is a VariantFeature bit set baked in by the JIT, or kDynamicFeatures to read the bits
// from the params at run time (the CPU backend).
#pragma once

#include "kernels/variants/params.cuh"
#include "kernels/variants/rope.cuh"

namespace kvattn::kernels {

template <uint32_t kFeatures>
struct BuiltinVariant {
  KVATTN_HD static bool has(const VariantParams& p, uint32_t bit) {
    return (kFeatures == kDynamicFeatures ? p.features : kFeatures) & bit;
  }

  KVATTN_HD static bool use_softmax(const VariantParams& p) { return !has(p, kSigmoid); }

  KVATTN_HD static void query_transform(const VariantParams& p, float* q, int dim, int64_t pos) {
    if (has(p, kRope)) rope_rotate(p, q, dim, dim, pos, has(p, kRopeInterleave), has(p, kRopeLlama31));
  }
  KVATTN_HD static void key_transform(const VariantParams& p, float* k, int dim, int64_t pos) {
    if (has(p, kRope)) rope_rotate(p, k, dim, dim, pos, has(p, kRopeInterleave), has(p, kRopeLlama31));
  }

  // s is already multiplied by sm_scale.
  KVATTN_HD static float logits_transform(const VariantParams& p, float s, const LogitCoord& c) {
    if (has(p, kSoftCap)) s = p.soft_cap * tanhf(s / p.soft_cap);
    if (has(p, kAlibi)) s += alibi_slope(c.qo_head, p.num_qo_heads) * float(c.kv_pos - c.q_pos);
    return s;
  }

  KVATTN_HD static bool logits_mask(const VariantParams& p, const LogitCoord& c) {
    if (has(p, kCausal) && c.kv_pos > c.q_pos) return false;
    if (has(p, kSlidingWindow) && c.kv_pos < c.q_pos - p.window_left) return false;
    if (has(p, kCustomMask)) {
      int64_t bit = c.q_idx * c.kv_len + c.kv_idx;
      uint8_t byte = p.custom_mask[p.mask_indptr[c.request] + (bit >> 3)];
      if (!((byte >> (bit & 7)) & 1)) return false;
    }
    return true;
  }

  KVATTN_HD static float sigmoid_weight(const VariantParams& p, float s) {
    return 1.0f / (1.0f + expf(-(s + p.sigmoid_bias)));
  }
  // The weight of a key without softmax (the CPU engine; kernels/variants/custom.cuh composes it).
  KVATTN_HD static float weight(const VariantParams& p, float s) { return sigmoid_weight(p, s); }
  // The user-variant hooks the built-in variant does not have (kUser: no user part; the kernels
  // then keep their feature-specialised score paths).
  static constexpr bool kUser = false, kUserSoftmax = true;
  // Whether the weights may be a softmax (not the baked-in sigmoid).
  static constexpr bool kMaySoftmax = kFeatures == kDynamicFeatures || (kFeatures & kSigmoid) == 0;
  static constexpr bool kHasSink = false, kHasOutput = false, kHasKvRange = false;
  static constexpr bool kHasUserTransform = false, kHasUserMask = false, kHasFullRange = false;
  KVATTN_HD static void kv_range(const VariantParams&, int, int64_t, int64_t, int64_t&, int64_t&) {}
  KVATTN_HD static void kv_full_range(const VariantParams&, int, int64_t, int64_t, int64_t&, int64_t&) {}
  KVATTN_HD static float sink_logit(const VariantParams&, int, int) { return 0.0f; }
  KVATTN_HD static float output_transform(const VariantParams&, float value, int, int64_t, int, int) {
    return value;
  }

  // ALiBi slope of head h among n heads (the ALiBi paper's rule; SEMANTICS.md).
  KVATTN_HD static float alibi_slope(int h, int n) {
    int pow2 = 1;
    while (pow2 * 2 <= n) pow2 *= 2;
    if (h < pow2) return exp2f(-8.0f * float(h + 1) / float(pow2));
    return exp2f(-4.0f * float(2 * (h - pow2) + 1) / float(pow2));
  }
};

}  // namespace kvattn::kernels
