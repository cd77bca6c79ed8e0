// The float64 reference checked against facts that hold by construction (so that the suites'
// oracle is itself tested): single-key and equal-logit cases in closed form, the merge identity
// of base-2 LSE states (SEMANTICS.md), GQA head mapping, ALiBi slopes, RoPE invariants.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "reference/reference.h"
#include "support/random.h"

namespace kvattn_test {
namespace {

using kvattn::Variant;

std::vector<double> random_vec(Rng& rng, size_t n) {
  std::vector<double> v(n);
  for (double& x : v) x = rng.uniform(-1, 1);
  return v;
}

TEST(Reference, SingleKeyAndEqualLogits) {
  // One key: o = v_scale * v, lse = s / ln 2 with s = sm_scale * q_scale * k_scale * <q, k>.
  std::vector<double> q{1, 2, 0, 0, 0, 0, 0, 1}, k{0.5, 0.25, 0, 0, 0, 0, 0, -1}, v{3, 4, 5, 6, 7, 8, 9, 10};
  ref::Request r{1, 1, 1, 1, 8, 8, q.data(), k.data(), v.data(), 0, {}};
  auto res = ref::attention(r, Variant{}.with_scales(2, 0.5, 3));
  const double s = (0.5 + 0.5 - 1) / std::sqrt(8.0);
  EXPECT_NEAR(res.lse[0], s / std::numbers::ln2, 1e-15);
  for (int e = 0; e < 8; ++e) EXPECT_DOUBLE_EQ(res.o[size_t(e)], 3 * v[size_t(e)]);
  // Three keys with equal logits: o = mean, lse = s / ln 2 + log2(3).
  std::vector<double> k3{1, 1, 1}, v3{1, 2, 6}, q1{2};
  ref::Request r3{1, 3, 1, 1, 1, 1, q1.data(), k3.data(), v3.data(), 2, {}};
  auto res3 = ref::attention(r3, Variant{}.with_sm_scale(0.5));
  EXPECT_NEAR(res3.o[0], 3.0, 1e-15);
  EXPECT_NEAR(res3.lse[0], 1.0 / std::numbers::ln2 + std::log2(3.0), 1e-14);
  // Sigmoid: sum of sigmoid(s + b) v.
  auto sig = ref::attention(r3, Variant{}.with_sm_scale(0.5).with_sigmoid(-1));
  EXPECT_NEAR(sig.o[0], 9.0 * 0.5, 1e-15);  // s + b = 0 for every key
  // Causal decode sees everything; window 0 only the last key; nothing visible: 0 and -inf.
  auto win = ref::attention(r3, Variant{}.with_window(0));
  EXPECT_DOUBLE_EQ(win.o[0], 6.0);
  r3.mask = [](int64_t, int64_t) { return false; };
  auto none = ref::attention(r3, Variant{});
  EXPECT_EQ(none.o[0], 0.0);
  EXPECT_EQ(none.lse[0], -INFINITY);
}

TEST(Reference, MergeOfDisjointHalvesIsTheWhole) {
  KVATTN_CASE_RNG(rng);
  const int hq = 4, hkv = 2, d = 16;
  const int64_t qo = 3, kv = 11, split = 4;
  auto q = random_vec(rng, qo * hq * d), k = random_vec(rng, kv * hkv * d), v = random_vec(rng, kv * hkv * d);
  ref::Request r{qo, kv, hq, hkv, d, d, q.data(), k.data(), v.data(), kv - qo, {}};
  const Variant var = kvattn::variants::causal().with_alibi().with_rope();
  auto whole = ref::attention(r, var);
  r.mask = [&](int64_t, int64_t j) { return j < split; };
  auto a = ref::attention(r, var);
  r.mask = [&](int64_t, int64_t j) { return j >= split; };
  auto b = ref::attention(r, var);
  for (int64_t row = 0; row < qo * hq; ++row) {
    const double la = a.lse[size_t(row)], lb = b.lse[size_t(row)];
    const double l = std::log2(std::exp2(la) + std::exp2(lb));
    EXPECT_NEAR(l, whole.lse[size_t(row)], 1e-12);
    for (int e = 0; e < d; ++e) {
      const size_t i = size_t(row * d + e);
      EXPECT_NEAR(a.o[i] * std::exp2(la - l) + b.o[i] * std::exp2(lb - l), whole.o[i], 1e-12);
    }
  }
}

TEST(Reference, GroupedQueryHeadsReadTheirKvHead) {
  // 4 query heads over 2 KV heads: heads 0, 1 read KV head 0; heads 2, 3 read KV head 1.
  std::vector<double> q(4 * 8, 0.0), k(2 * 8, 0.0), v(2 * 8);
  for (int e = 0; e < 8; ++e) v[size_t(e)] = 1, v[size_t(8 + e)] = 2;
  ref::Request r{1, 1, 4, 2, 8, 8, q.data(), k.data(), v.data(), 0, {}};
  auto res = ref::attention(r, Variant{});
  for (int h = 0; h < 4; ++h) EXPECT_EQ(res.o[size_t(h * 8)], h < 2 ? 1.0 : 2.0) << h;
}

TEST(Reference, AlibiSlopesMatchThePaperAndTheLibrary) {
  for (int h = 0; h < 8; ++h) EXPECT_DOUBLE_EQ(ref::alibi_slope(h, 8), std::pow(2.0, -(h + 1)));
  // 12 heads: 8 from the power of two, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
  for (int k = 0; k < 4; ++k) EXPECT_DOUBLE_EQ(ref::alibi_slope(8 + k, 12), std::pow(2.0, -0.5 - k));
  for (int n : {1, 3, 7, 8, 12, 32, 40})
    for (int h = 0; h < n; ++h) EXPECT_NEAR(ref::alibi_slope(h, n), kvattn::alibi_slope(h, n), 1e-7) << h << "/" << n;
}

TEST(Reference, RopeInvariants) {
  KVATTN_CASE_RNG(rng);
  kvattn::RopeConfig plain, inter, l31;
  inter.interleave = true;
  l31.llama31 = kvattn::Llama31Scaling{};
  l31.rope_theta = 5e5f;
  const int d = 32;
  for (const auto& cfg : {plain, inter, l31}) {
    auto x = random_vec(rng, d), y = random_vec(rng, d);
    auto x0 = x;
    ref::apply_rope(x0.data(), d, 0, cfg);
    for (int e = 0; e < d; ++e) EXPECT_DOUBLE_EQ(x0[size_t(e)], x[size_t(e)]);  // position 0: identity
    // <rope(x, m), rope(y, n)> depends on m - n only.
    auto dot_at = [&](double m, double n) {
      auto a = x, b = y;
      ref::apply_rope(a.data(), d, m, cfg);
      ref::apply_rope(b.data(), d, n, cfg);
      double s = 0;
      for (int e = 0; e < d; ++e) s += a[size_t(e)] * b[size_t(e)];
      return s;
    };
    EXPECT_NEAR(dot_at(7, 3), dot_at(1004, 1000), 1e-9);
  }
  // Interleaved pairs (2t, 2t+1) are rotate-half pairs (t, t + d/2) after a permutation.
  auto x = random_vec(rng, d), perm(x);
  for (int t = 0; t < d / 2; ++t) perm[size_t(2 * t)] = x[size_t(t)], perm[size_t(2 * t + 1)] = x[size_t(t + d / 2)];
  ref::apply_rope(x.data(), d, 5, plain);
  ref::apply_rope(perm.data(), d, 5, inter);
  for (int t = 0; t < d / 2; ++t) {
    EXPECT_NEAR(perm[size_t(2 * t)], x[size_t(t)], 1e-14);
    EXPECT_NEAR(perm[size_t(2 * t + 1)], x[size_t(t + d / 2)], 1e-14);
  }
  // Llama 3.1: high frequencies unchanged, wavelengths past 8192 divided by 8, rope_scale divides.
  kvattn::RopeConfig base = l31;
  base.llama31.reset();
  EXPECT_DOUBLE_EQ(ref::rope_frequency(0, 128, l31), 1.0);
  const double f_low = ref::rope_frequency(63, 128, base);
  ASSERT_GT(2 * std::numbers::pi / f_low, 8192.0);
  EXPECT_DOUBLE_EQ(ref::rope_frequency(63, 128, l31), f_low / 8);
  base.rope_scale = 4;
  EXPECT_DOUBLE_EQ(ref::rope_frequency(5, 64, base) * 4, std::pow(5e5, -10.0 / 64));
}

}  // namespace
}  // namespace kvattn_test
