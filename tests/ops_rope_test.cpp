// apply_rope against a float64 RoPE written here from SEMANTICS.md ("Rotary position embedding",
// Llama 3.1 scaling included), in every dtype, rotate-half and interleaved, partial rotary_dim,
// strided and in-place views; and every validation error by its message.
//
// Tolerance of a rotated element x'[i] of the pair (x0, x1) at angle a = pos * f_t. The library
// computes f_t in f32 (powf, the division by rope_scale and, for Llama 3.1, the wavelength blend,
// whose g is amplified by up to 7x relative to the blended frequency): a relative error within 64
// ulps, so |da| <= 64 * 2^-24 * |a|; cosf/sinf and the two products and the sum add a few ulps of
// |x0| + |x1|. So |err| <= (|x0| + |x1|) * (64 * 2^-24 * |a| + 8 * 2^-24), then the rounding to the
// dtype, half an ulp of |x'|. Positions stay below 1024, so this is <= 4e-3 * (|x0| + |x1|) at worst
// and ~1e-6 near position 0, while any wrong pairing, frequency or sign moves an element by O(|x|).
// Elements past rotary_dim, and every element at position 0, must come back bit for bit.
#include "ops_testing.h"

namespace ops_test {
namespace {

constexpr double kTwoPi = 6.283185307179586476925286766559;

struct RopeRef {
  int rotary_dim;
  bool interleave;
  double theta, scale;
  std::optional<kvattn::Llama31Scaling> llama31;
  int regions[3] = {0, 0, 0};  // Llama 3.1 frequencies kept / blended / divided (coverage)

  double freq(int t) {
    double f = std::pow(theta, -2.0 * t / rotary_dim) / scale;
    if (!llama31) return f;
    const auto& l = *llama31;
    double wl = kTwoPi / f;
    if (wl < l.original_max_position / l.high_freq_factor) { ++regions[0]; return f; }
    if (wl > l.original_max_position / l.low_freq_factor) { ++regions[2]; return f / l.factor; }
    ++regions[1];
    double g = (l.original_max_position / wl - l.low_freq_factor) / (l.high_freq_factor - l.low_freq_factor);
    return (1 - g) * f / l.factor + g * f;
  }
  // Rotated x and, per element, the tolerance before output rounding.
  void apply(std::vector<double>& x, std::vector<double>& tol, int64_t pos) {
    tol.assign(x.size(), 0.0);
    const int half = rotary_dim / 2;
    for (int t = 0; t < half; ++t) {
      const int i0 = interleave ? 2 * t : t, i1 = interleave ? 2 * t + 1 : t + half;
      const double a = double(pos) * freq(t), x0 = x[size_t(i0)], x1 = x[size_t(i1)];
      x[size_t(i0)] = x0 * std::cos(a) - x1 * std::sin(a);
      x[size_t(i1)] = x1 * std::cos(a) + x0 * std::sin(a);
      tol[size_t(i0)] = tol[size_t(i1)] = (std::fabs(x0) + std::fabs(x1)) * (64 * 0x1p-24 * std::fabs(a) + 8 * 0x1p-24);
    }
  }
};

constexpr int kD = 64, kHq = 4, kHk = 2;

// q, k, v of a fused [nnz, Hq + 2 Hk, D + 3] buffer (padded heads), as apply_rope usually sees them.
struct Qkv {
  int64_t nnz, hs = kD + 3, rs = (kHq + 2 * kHk) * (kD + 3);
  Buf buf;
  Qkv(DType t, int64_t n, std::mt19937_64& g) : nnz(n), buf(t, n * rs) {
    for (int64_t i = 0; i < buf.size(); ++i) buf.set(i, uniform(g, -2, 2));
  }
  kvattn::TensorView q() { return buf.view({nnz, kHq, kD}, {rs, hs, 1}); }
  kvattn::TensorView k() { return buf.view({nnz, kHk, kD}, {rs, hs, 1}, kHq * hs); }
  int64_t q_off(int64_t r, int h, int e) const { return r * rs + h * hs + e; }
  int64_t k_off(int64_t r, int h, int e) const { return r * rs + (kHq + h) * hs + e; }
};

std::vector<int32_t> random_positions(std::mt19937_64& g, int64_t n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& x : p) x = int32_t(randint(g, 0, 1023));
  p[0] = 0;
  p[size_t(n - 1)] = 1023;
  return p;
}

TEST(OpsApplyRope, MatchesFloat64ReferenceEveryDtypeAndOption) {
  OPS_TEST_RNG(rng);
  int regions[3] = {0, 0, 0};
  for (DType t : kFloatDtypes)
    for (bool interleave : {false, true})
      for (bool llama : {false, true})
        for (int rd : {0, 32, 10}) {
          kvattn::RopeOptions opt;
          opt.interleave = interleave;
          opt.rotary_dim = rd;
          opt.rope_theta = llama ? 5e5f : 1e4f;
          opt.rope_scale = rd == 10 ? 2.5f : 1.0f;
          if (llama) opt.llama31 = kvattn::Llama31Scaling{};
          SCOPED_TRACE(std::string(kvattn::dtype_name(t)) + (interleave ? " interleave" : " half") +
                       (llama ? " llama31" : "") + " rotary_dim=" + std::to_string(rd));
          const int64_t nnz = 19;
          Qkv in(t, nnz, rng);
          const Buf before = in.buf;
          Buf qo(t, nnz * kHq * kD), ko(t, nnz * kHk * kD);
          auto pos = random_positions(rng, nnz);
          kvattn::apply_rope(in.q(), in.k(), qo.view({nnz, kHq, kD}), ko.view({nnz, kHk, kD}),
                             i32_view(pos), opt);
          RopeRef ref{rd == 0 ? kD : rd, interleave, opt.rope_theta, opt.rope_scale, opt.llama31};
          Checker c("apply_rope");
          std::vector<double> x(kD), tol;
          for (int64_t r = 0; r < nnz; ++r)
            for (int h = 0; h < kHq + kHk; ++h) {
              const bool isq = h < kHq;
              const int hh = isq ? h : h - kHq;
              for (int e = 0; e < kD; ++e) x[size_t(e)] = in.buf.get(isq ? in.q_off(r, hh, e) : in.k_off(r, hh, e));
              ref.apply(x, tol, pos[size_t(r)]);
              const Buf& out = isq ? qo : ko;
              const int64_t H = isq ? kHq : kHk;
              for (int e = 0; e < kD; ++e) {
                const int64_t oi = (r * H + hh) * kD + e;
                const int64_t ii = isq ? in.q_off(r, hh, e) : in.k_off(r, hh, e);
                const std::string where = std::string(isq ? "q" : "k") + idx({r, hh, e}) + " pos " + std::to_string(pos[size_t(r)]);
                if (e >= ref.rotary_dim || pos[size_t(r)] == 0)
                  c.exact(out.bits(oi), in.buf.bits(ii), where);
                else
                  // The rounding to t: relative, or absolute among subnormals (f16 outputs near 4e-5
                  // failed by 2.4e-8 under the relative bound alone).
                  c.close(out.get(oi), x[size_t(e)],
                          tol[size_t(e)] + unit_roundoff(t) * (std::fabs(x[size_t(e)]) + tol[size_t(e)]) +
                              half_subnormal_spacing(t),
                          where);
              }
            }
          for (int64_t i = 0; i < in.buf.size(); ++i) c.exact(in.buf.bits(i), before.bits(i), "input " + std::to_string(i));
          EXPECT_TRUE(c.result());
          for (int i = 0; i < 3; ++i) regions[i] += ref.regions[i];
        }
  // The Llama 3.1 cases exercised all three branches of the frequency rule.
  EXPECT_GT(regions[0], 0);
  EXPECT_GT(regions[1], 0);
  EXPECT_GT(regions[2], 0);
}

TEST(OpsApplyRope, InPlaceEqualsOutOfPlaceAndLeavesTheRestAlone) {
  OPS_TEST_RNG(rng);
  for (DType t : kFloatDtypes)
    for (bool interleave : {false, true}) {
      SCOPED_TRACE(std::string(kvattn::dtype_name(t)) + (interleave ? " interleave" : ""));
      const int64_t nnz = 33;
      Qkv a(t, nnz, rng);
      Buf qo(t, nnz * kHq * kD), ko(t, nnz * kHk * kD);
      auto pos = random_positions(rng, nnz);
      kvattn::RopeOptions opt;
      opt.interleave = interleave;
      opt.rotary_dim = 48;
      opt.llama31 = kvattn::Llama31Scaling{};
      kvattn::apply_rope(a.q(), a.k(), qo.view({nnz, kHq, kD}), ko.view({nnz, kHk, kD}), i32_view(pos), opt);
      const Buf before = a.buf;
      kvattn::apply_rope(a.q(), a.k(), a.q(), a.k(), i32_view(pos), opt);
      Checker c("in place vs out of place");
      for (int64_t r = 0; r < nnz; ++r)
        for (int e = 0; e < kD + 3; ++e) {
          for (int h = 0; h < kHq; ++h)
            c.exact(a.buf.bits(a.q_off(r, h, e)), e < kD ? qo.bits((r * kHq + h) * kD + e) : before.bits(a.q_off(r, h, e)), "q" + idx({r, h, e}));
          for (int h = 0; h < kHk; ++h)
            c.exact(a.buf.bits(a.k_off(r, h, e)), e < kD ? ko.bits((r * kHk + h) * kD + e) : before.bits(a.k_off(r, h, e)), "k" + idx({r, h, e}));
          for (int h = kHq + kHk; h < kHq + 2 * kHk; ++h)  // the v heads
            c.exact(a.buf.bits(r * a.rs + h * a.hs + e), before.bits(r * a.rs + h * a.hs + e), "v" + idx({r, h, e}));
        }
      EXPECT_TRUE(c.result());
    }
}

// The ragged form: row r of request b at offsets[b] + r - indptr[b], empty requests included, is
// apply_rope at those positions, bit for bit; in place too.
TEST(OpsApplyRopeRagged, EqualsApplyRopeAtTheRaggedPositions) {
  OPS_TEST_RNG(rng);
  for (DType t : kFloatDtypes)
    for (bool interleave : {false, true}) {
      SCOPED_TRACE(std::string(kvattn::dtype_name(t)) + (interleave ? " interleave" : ""));
      std::vector<int32_t> indptr = {0}, offsets, pos;
      for (int b = 0; b < 6; ++b) {
        const int len = b == 2 ? 0 : int(randint(rng, 1, 7));
        offsets.push_back(int32_t(randint(rng, -5, 900)));
        for (int i = 0; i < len; ++i) pos.push_back(offsets.back() + i);
        indptr.push_back(indptr.back() + len);
      }
      const int64_t nnz = indptr.back();
      Qkv in(t, nnz, rng);
      kvattn::RopeOptions opt;
      opt.interleave = interleave;
      opt.rotary_dim = 48;
      opt.llama31 = kvattn::Llama31Scaling{};
      Buf qa(t, nnz * kHq * kD), ka(t, nnz * kHk * kD), qb(t, nnz * kHq * kD), kb(t, nnz * kHk * kD);
      kvattn::apply_rope(in.q(), in.k(), qa.view({nnz, kHq, kD}), ka.view({nnz, kHk, kD}), i32_view(pos), opt);
      kvattn::apply_rope_ragged(in.q(), in.k(), qb.view({nnz, kHq, kD}), kb.view({nnz, kHk, kD}), i32_view(indptr),
                                i32_view(offsets), opt);
      Checker c("ragged vs pos_ids");
      for (int64_t i = 0; i < qa.size(); ++i) c.exact(qb.bits(i), qa.bits(i), "q " + std::to_string(i));
      for (int64_t i = 0; i < ka.size(); ++i) c.exact(kb.bits(i), ka.bits(i), "k " + std::to_string(i));
      kvattn::apply_rope_ragged(in.q(), in.k(), in.q(), in.k(), i32_view(indptr), i32_view(offsets), opt);
      for (int64_t r = 0; r < nnz; ++r)
        for (int e = 0; e < kD; ++e) {
          for (int h = 0; h < kHq; ++h) c.exact(in.buf.bits(in.q_off(r, h, e)), qa.bits((r * kHq + h) * kD + e), "in place q" + idx({r, h, e}));
          for (int h = 0; h < kHk; ++h) c.exact(in.buf.bits(in.k_off(r, h, e)), ka.bits((r * kHk + h) * kD + e), "in place k" + idx({r, h, e}));
        }
      EXPECT_TRUE(c.result());
    }
}

TEST(OpsApplyRopeRaggedErrors, EachBadArgumentIsNamedAndNothingIsWritten) {
  OPS_TEST_RNG(rng);
  const int64_t n = 5;
  Qkv in(DType::bf16, n, rng);
  Buf qo(DType::bf16, n * kHq * kD), ko(DType::bf16, n * kHk * kD);
  std::vector<int32_t> indptr = {0, 2, 5}, offsets = {0, 7}, short_ind = {0, 2, 4}, down = {0, 3, 2, 5},
                       three = {0, 1, 2}, big = {0, 2147483646}, f32_bits(2, 0);
  auto call = [&](std::vector<int32_t>& ind, std::vector<int32_t>& off, kvattn::RopeOptions o = {}) {
    return [&, o] {
      kvattn::apply_rope_ragged(in.q(), in.k(), qo.view({n, kHq, kD}), ko.view({n, kHk, kD}), i32_view(ind), i32_view(off), o);
    };
  };
  EXPECT_TRUE(throws_with(call(short_ind, offsets), "indptr[2] = 4 but q has 5 rows (q.shape[0]); the requests must cover every row"));
  EXPECT_TRUE(throws_with(call(down, three), "indptr is not non-decreasing at 2: indptr[1] = 3, indptr[2] = 2"));
  EXPECT_TRUE(throws_with(call(indptr, three), "offsets has 3 elements but 2 are expected"));
  EXPECT_TRUE(throws_with(call(indptr, big), "row 4 of request 1 is at position offsets[1] + 2 = 2147483648, past int32"));
  kvattn::RopeOptions odd;
  odd.rotary_dim = 5;
  EXPECT_TRUE(throws_with(call(indptr, offsets, odd), "rotary_dim = 5 must be even"));
  EXPECT_TRUE(throws_with([&] {
                kvattn::apply_rope_ragged(in.q(), in.k(), qo.view({n, kHq, kD}), ko.view({n, kHk, kD}),
                                          kvattn::TensorView(f32_bits.data(), DType::f32, {2}), i32_view(offsets));
              },
                          "indptr has dtype f32 but i32 is expected"));
  // An output over the offsets: rejected as any overlap.
  std::vector<int32_t> store(size_t(n * kHk * kD), 0);
  store[0] = 0, store[1] = 7;
  const kvattn::TensorView k_over(store.data(), DType::bf16, {n, kHk, kD});
  EXPECT_TRUE(throws_with([&] {
                kvattn::apply_rope_ragged(in.q(), in.k(), qo.view({n, kHq, kD}), k_over, i32_view(indptr),
                                          kvattn::TensorView(store.data(), DType::i32, {2}));
              },
                          "overlaps offsets"));
  const auto cuda = kvattn::Device::cuda(0);
  EXPECT_TRUE(throws_with([&] {
                kvattn::apply_rope_ragged(in.buf.view({n, kHq, kD}, {in.rs, in.hs, 1}, 0, cuda),
                                          in.buf.view({n, kHk, kD}, {in.rs, in.hs, 1}, kHq * in.hs, cuda),
                                          qo.view({n, kHq, kD}, cuda), ko.view({n, kHk, kD}, cuda), i32_view(indptr),
                                          i32_view(offsets));
              },
                          "indptr is on cpu but q is on cuda:0; with CUDA tensors, indptr is an int32 tensor on q's device"));
  Checker c("outputs after rejected calls");
  for (int64_t i = 0; i < qo.size(); ++i) c.truth(qo.poisoned(i), "q_out " + std::to_string(i));
  for (int64_t i = 0; i < ko.size(); ++i) c.truth(ko.poisoned(i), "k_out " + std::to_string(i));
  EXPECT_TRUE(c.result());
  EXPECT_NO_THROW(call(indptr, offsets)());
}

TEST(OpsApplyRopeErrors, EachBadArgumentIsNamedAndNothingIsWritten) {
  OPS_TEST_RNG(rng);
  const int64_t n = 5;
  Qkv in(DType::bf16, n, rng);
  Buf qo(DType::bf16, n * kHq * kD), ko(DType::bf16, n * kHk * kD), f16o(DType::f16, n * kHq * kD);
  Buf odd(DType::bf16, n * kHq * 7), i32b(DType::i32, n * kHq * kD);
  std::vector<int32_t> pos = {0, 1, 2, 3, 4}, short_pos = {0, 1, 2};
  auto Q = in.q(), K = in.k(), QO = qo.view({n, kHq, kD}), KO = ko.view({n, kHk, kD});
  auto P = i32_view(pos);
  auto with = [&](auto&& tweak) {
    return [&, tweak] {
      kvattn::RopeOptions o;
      tweak(o);
      kvattn::apply_rope(Q, K, QO, KO, P, o);
    };
  };
  using O = kvattn::RopeOptions;
  EXPECT_TRUE(throws_with(with([](O& o) { o.rotary_dim = 7; }), "rotary_dim = 7 must be even: RoPE rotates pairs of elements"));
  EXPECT_TRUE(throws_with(with([](O& o) { o.rotary_dim = 66; }), "rotary_dim = 66 exceeds the head dim 64"));
  EXPECT_TRUE(throws_with(with([](O& o) { o.rotary_dim = -2; }), "rotary_dim = -2 must be >= 0 (0: the whole head dim)"));
  EXPECT_TRUE(throws_with(with([](O& o) { o.rope_theta = 0; }), "rope_theta = 0 must be finite and > 0"));
  EXPECT_TRUE(throws_with(with([](O& o) { o.rope_scale = -1; }), "rope_scale = -1 must be finite and > 0"));
  EXPECT_TRUE(throws_with(with([](O& o) { o.llama31 = kvattn::Llama31Scaling{8, 4, 1, 8192}; }),
                          "llama31 needs 0 < low_freq_factor < high_freq_factor, got low_freq_factor = 4, high_freq_factor = 1"));
  EXPECT_TRUE(throws_with(with([](O& o) { o.llama31 = kvattn::Llama31Scaling{0, 1, 4, 8192}; }), "llama31.factor = 0 must be finite and > 0"));
  EXPECT_TRUE(throws_with(with([](O& o) { o.llama31 = kvattn::Llama31Scaling{8, 1, 4, -1}; }),
                          "llama31.original_max_position = -1 must be finite and > 0"));
  auto call = [&](kvattn::TensorView q, kvattn::TensorView k, kvattn::TensorView qo_, kvattn::TensorView ko_, kvattn::TensorView p) {
    return [=] { kvattn::apply_rope(q, k, qo_, ko_, p); };
  };
  EXPECT_TRUE(throws_with(call(odd.view({n, kHq, 7}), odd.view({n, kHq, 7}), odd.view({n, kHq, 7}), odd.view({n, kHq, 7}), P),
                          "rotary_dim = 7 (the whole head dim) must be even"));
  EXPECT_TRUE(throws_with(call(Q, K, QO, KO, i32_view(short_pos)), "pos_ids has 3 elements but 5 are expected"));
  EXPECT_TRUE(throws_with(call(Q, K, QO, KO, qo.view({n})), "pos_ids has dtype bf16 but i32 is expected"));
  EXPECT_TRUE(throws_with(call(Q, K, QO, KO, kvattn::TensorView(pos.data(), DType::i32, {n}, kvattn::Device::cuda(0))),
                          "pos_ids must be on the host (cpu), got cuda:0"));
  EXPECT_TRUE(throws_with(call(Q, K, qo.view({n, kHq * kD}), KO, P), "q_out must be 3-D, got bf16[5, 256] on cpu"));
  EXPECT_TRUE(throws_with(call(Q, K, f16o.view({n, kHq, kD}), KO, P), "q_out has dtype f16 but q has dtype bf16; they must match"));
  EXPECT_TRUE(throws_with(call(Q, K, QO, qo.view({n, kHq, kD}), P), "k_out.shape[1] = 4 but k.shape[1] = 2"));
  EXPECT_TRUE(throws_with(call(Q, qo.view({n - 1, kHk, kD}), QO, KO, P), "k.shape[0] = 4 but q.shape[0] (nnz) = 5"));
  EXPECT_TRUE(throws_with(call(Q, odd.view({n, kHk, 7}), QO, KO, P), "k.shape[2] = 7 but q.shape[2] (head_dim) = 64"));
  EXPECT_TRUE(throws_with(call(i32b.view({n, kHq, kD}), K, QO, KO, P), "q has dtype i32; expected f32, f16 or bf16"));
  EXPECT_TRUE(throws_with(call(Q, K, in.buf.view({n, kHq, kD}, {in.rs, in.hs + 1, 1}), KO, P),
                          "q_out aliases q with other strides"));
  EXPECT_TRUE(throws_with(call(Q, K, QO, ko.view({n, kHk, kD}, kvattn::Device::cuda(0)), P), "k_out is on cuda:0 but q is on cpu"));
  // CUDA tensors take their positions on the device (tests/gpu_rope_test.cpp has the GPU cases;
  // these views of host memory never reach a launch).
  const auto cuda = kvattn::Device::cuda(0);
  EXPECT_TRUE(throws_with(call(in.buf.view({n, kHq, kD}, {in.rs, in.hs, 1}, 0, cuda), in.buf.view({n, kHk, kD}, {in.rs, in.hs, 1}, kHq * in.hs, cuda),
                               qo.view({n, kHq, kD}, cuda), ko.view({n, kHk, kD}, cuda), P),
                          "pos_ids is on cpu but q is on cuda:0; with CUDA tensors, pos_ids is an int32 tensor on q's device"));
  Checker c("outputs after rejected calls");
  for (int64_t i = 0; i < qo.size(); ++i) c.truth(qo.poisoned(i), "q_out " + std::to_string(i));
  for (int64_t i = 0; i < ko.size(); ++i) c.truth(ko.poisoned(i), "k_out " + std::to_string(i));
  EXPECT_TRUE(c.result());
  EXPECT_NO_THROW(with([](O&) {})());  // the base arguments are valid
}

}  // namespace
}  // namespace ops_test
