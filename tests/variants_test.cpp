// Every attention variant against the float64 reference, on decode, ragged and paged prefill:
// causal (bottom-right), sliding window, soft-cap, ALiBi (power-of-two and other head counts),
// custom bit masks, sm_scale, q/k/v scales with fp8 KV, fused RoPE (llama, scale/theta,
// interleave, Llama 3.1 at long positions), sigmoid attention, and combinations.
// Block-sparse variants: block_sparse_test.cpp.
#include <gtest/gtest.h>

#include "support/attention_case.h"

namespace kvattn_test {
namespace {

using kvattn::DType;
using kvattn::KVLayout;
using kvattn::Variant;
namespace variants = kvattn::variants;

kvattn::RopeConfig rope_cfg(float scale, float theta, bool interleave, bool llama31) {
  kvattn::RopeConfig r;
  r.rope_scale = scale;
  r.rope_theta = theta;
  r.interleave = interleave;
  if (llama31) r.llama31 = kvattn::Llama31Scaling{};
  return r;
}

// The same variant on decode, ragged prefill and paged prefill (HND, page 3), with appends.
void run_everywhere(const Variant& var, Rng& rng, int hq = 8, int hkv = 2, int dqk = 32,
                    DType kv = DType::f16) {
  AttnCase c;
  c.num_qo_heads = hq;
  c.num_kv_heads = hkv;
  c.head_dim_qk = dqk;
  c.q_dtype = DType::f16;
  c.kv_dtype = kv;
  c.o_dtype = DType::f32;
  c.variant = var;
  if (!var.custom_mask) {
    c.lens = {{1, rng.integer(0, 45)}, {1, 1}, {1, rng.integer(20, 70)}};
    c.page_size = 16;
    run_decode_case(c, rng);
  }
  c.lens = {{rng.integer(1, 20), 20}, {3, 3 + rng.integer(0, 40)}, {0, 4}, {17, 40}};
  c.store = KVStore::ragged;
  run_prefill_case(c, rng);
  c.store = KVStore::paged;
  c.layout = KVLayout::HND;
  c.page_size = 3;
  c.o_dtype = DType::bf16;
  run_prefill_case(c, rng);
}

TEST(Variants, Causal) {
  KVATTN_CASE_RNG(rng);
  run_everywhere(variants::causal(), rng);
}

TEST(Variants, SlidingWindow) {
  for (int w : {0, 1, 5, 16, 100, 1 << 30})
    for (bool causal : {true, false}) {
      KVATTN_CASE_RNG(rng);
      run_everywhere(variants::sliding_window(w, causal), rng);
    }
}

TEST(Variants, SoftCap) {
  // A large sm_scale pushes logits well into tanh's saturation, so the cap matters.
  for (float cap : {0.5f, 3.0f, 30.0f}) {
    KVATTN_CASE_RNG(rng);
    run_everywhere(variants::soft_cap(cap).with_sm_scale(0.7f), rng);
  }
}

TEST(Variants, Alibi) {
  // Slopes for power-of-two and other head counts (the extra heads take the odd slopes).
  for (auto [hq, hkv] : {std::pair{8, 2}, {7, 1}, {12, 4}, {1, 1}, {6, 6}}) {
    KVATTN_CASE_RNG(rng);
    run_everywhere(variants::alibi().with_causal(), rng, hq, hkv);
  }
  KVATTN_CASE_RNG(rng);
  run_everywhere(variants::alibi(), rng, 5, 1);  // non-causal: keys past the query too
}

TEST(Variants, CustomMask) {
  for (double density : {0.0, 0.1, 0.6, 1.0})
    for (KVStore store : {KVStore::ragged, KVStore::paged, KVStore::paged_combined}) {
      KVATTN_CASE_RNG(rng);
      AttnCase c;
      c.lens = {{rng.integer(1, 20), 20}, {3, 3 + rng.integer(0, 40)}, {0, 9}, {0, 0},
                {1, 1}, {9, 13}};
      c.num_qo_heads = 4;
      c.num_kv_heads = 1;
      c.head_dim_qk = 16;
      c.variant = variants::custom_mask();
      c.mask_density = density;
      c.store = store;
      c.page_size = 3;
      c.layout = store == KVStore::paged ? KVLayout::HND : KVLayout::NHD;
      run_prefill_case(c, rng);
    }
  for (const Variant& var : {variants::custom_mask().with_causal().with_window(6),
                             variants::custom_mask().with_alibi().with_soft_cap(5.0f),
                             variants::custom_mask().with_sigmoid(0.25f)}) {
    KVATTN_CASE_RNG(rng);
    run_everywhere(var, rng);
  }
}

TEST(Variants, SmScale) {
  for (float s : {0.0f, 0.05f, 0.3f, 1.0f, -0.4f}) {
    KVATTN_CASE_RNG(rng);
    run_everywhere(Variant{}.with_sm_scale(s).with_causal(), rng);
  }
}

TEST(Variants, Fp8Scales) {
  for (DType kv : {DType::e4m3, DType::e5m2})
    for (auto [qs, ks, vs] : {std::tuple{1.0f, 0.5f, 2.0f}, {0.25f, 3.0f, 0.125f}, {2.0f, 1.0f, -0.5f}}) {
      KVATTN_CASE_RNG(rng);
      run_everywhere(Variant{}.with_scales(qs, ks, vs).with_causal(), rng, 8, 2, 64, kv);
    }
}

TEST(Variants, Rope) {
  const kvattn::RopeConfig configs[] = {
      rope_cfg(1, 1e4f, false, false), rope_cfg(4, 5e5f, false, false),
      rope_cfg(1, 1e4f, true, false), rope_cfg(2, 1e4f, true, false),
      rope_cfg(1, 5e5f, false, true), rope_cfg(1, 5e5f, true, true)};
  for (const auto& r : configs)
    for (int dqk : {32, 64}) {
      KVATTN_CASE_RNG(rng);
      run_everywhere(variants::rope(r).with_causal(), rng, 4, 1, dqk);
    }
  // RoPE rotates the qk head dim only; v and out keep their own (different) head dim.
  for (auto [dqk, dvo] : {std::pair{192, 128}, {64, 128}}) {
    KVATTN_CASE_RNG(rng);
    AttnCase c;
    c.lens = {{3, 19}, {1, 7}};
    c.num_qo_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim_qk = dqk;
    c.head_dim_vo = dvo;
    c.q_dtype = DType::bf16;
    c.variant = variants::rope(rope_cfg(2, 1e4f, dqk == 64, dqk == 192)).with_causal();
    c.store = KVStore::paged;
    c.page_size = 3;
    run_prefill_case(c, rng);
  }
}

TEST(Variants, RopeAtLongPositions) {
  // Positions in the thousands reach Llama 3.1's scaled (low-frequency) band. The kernel forms
  // the angle pos * f in f32: at pos ~3000 one rounding is up to 2^-12 rad, so rotated q and k
  // are off by ~3e-4 relative and logits (sum |q_e k_e| * scale ~ 5 here) by ~2e-3, which a
  // softmax weight inherits as a relative error. Allow 5e-3 * o_mag and 5e-3 on lse; any wrong
  // frequency moves angles by O(1) at these positions.
  for (bool llama31 : {false, true}) {
    KVATTN_CASE_RNG(rng);
    AttnCase c;
    c.lens = {{1, 2500 + rng.integer(0, 500)}, {1, 1200}};
    c.num_qo_heads = 2;
    c.num_kv_heads = 1;
    c.head_dim_qk = 64;
    c.q_dtype = DType::f32;
    c.variant = variants::rope(rope_cfg(1, 5e5f, false, llama31));
    c.page_size = 16;
    c.tolerance = {5e-3, 5e-3};
    run_decode_case(c, rng);
    c.lens = {{4, 2100}};
    c.variant.causal = true;
    c.store = KVStore::ragged;
    run_prefill_case(c, rng);
  }
}

TEST(Variants, Sigmoid) {
  for (float bias : {0.0f, -2.0f, 1.5f})
    for (bool causal : {false, true}) {
      KVATTN_CASE_RNG(rng);
      run_everywhere(variants::sigmoid(bias).with_causal(causal), rng);
    }
}

TEST(Variants, Combinations) {
  const Variant combos[] = {
      variants::causal().with_window(7).with_soft_cap(4.0f).with_alibi().with_rope(),
      variants::sliding_window(4).with_rope(rope_cfg(1, 1e4f, true, true)).with_sm_scale(0.2f),
      variants::soft_cap(10.0f).with_alibi(),
      variants::sigmoid(-1.0f).with_causal().with_alibi().with_rope().with_window(9),
      Variant{}.with_scales(0.5f, 1.5f, 0.75f).with_causal().with_soft_cap(8.0f).with_rope(),
      variants::sigmoid(0.3f).with_scales(0.5f, 2.0f, 1.5f).with_soft_cap(2.0f)};
  for (const auto& var : combos) {
    KVATTN_CASE_RNG(rng);
    run_everywhere(var, rng, 8, 2, 32, var.k_scale != 1 ? DType::e4m3 : DType::bf16);
  }
}

TEST(Variants, FullyMaskedRowsAreZeroWithMinusInfLse) {
  // Non-causal windows never mask a whole decode row; BSR empty rows and custom masks do
  // (block_sparse_test.cpp, CustomMask above). Here: kv_len 0 under every mask.
  for (const Variant& var : {variants::causal(), variants::sliding_window(0), variants::alibi(),
                             variants::soft_cap(3.0f), variants::rope()}) {
    KVATTN_CASE_RNG(rng);
    AttnCase c;
    c.lens = {{1, 0}, {1, 3}, {1, 0}};
    c.num_qo_heads = 4;
    c.head_dim_qk = 16;
    c.variant = var;
    c.page_size = 1;
    run_decode_case(c, rng);
  }
}

}  // namespace
}  // namespace kvattn_test
