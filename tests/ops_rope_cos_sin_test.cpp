// apply_rope_with_cos_sin_cache against a float64 rotation written here from kvattn/ops.h: the
// table's own values (a random table, so that a wrong row, column or pairing cannot pass), every
// dtype, rotate-half and interleaved, partial rotary_dim, strided q/k (a fused QKV buffer), a
// padded table, in place; a table of cos/sin of the plain frequencies against apply_rope's
// reference; and every validation error by its message, nothing written.
//
// Tolerance of a rotated element x'[i] of the pair (x0, x1) with table entries (c, s): the library
// forms x0 c - x1 s (or x1 c + x0 s) in f32, two products and a sum, within 2 ulps of
// |x0 c| + |x1 s| <= |x0| + |x1|; allowed (|x0| + |x1|) * 4 * 2^-24, then the rounding to the dtype
// (half an ulp of |x'|, or half the subnormal spacing). Elements past rotary_dim come back bit for
// bit.
#include "ops_testing.h"

namespace ops_test {
namespace {

constexpr int kD = 64, kHq = 4, kHk = 2;

// q, k of a fused [nnz, Hq + 2 Hk, D + 3] buffer (padded heads).
struct Fused {
  int64_t nnz, hs = kD + 3, rs = (kHq + 2 * kHk) * (kD + 3);
  Buf buf;
  Fused(DType t, int64_t n, std::mt19937_64& g) : nnz(n), buf(t, n * rs) {
    for (int64_t i = 0; i < buf.size(); ++i) buf.set(i, uniform(g, -2, 2));
  }
  kvattn::TensorView q() { return buf.view({nnz, kHq, kD}, {rs, hs, 1}); }
  kvattn::TensorView k() { return buf.view({nnz, kHk, kD}, {rs, hs, 1}, kHq * hs); }
  int64_t off(int64_t r, int head, int e) const { return r * rs + head * hs + e; }  // head: q then k
};

// A [rows, rd] table at row stride rd + pad: random values in [-1, 1], or cos / sin of
// p * theta^(-2t/rd).
struct Table {
  int64_t rows, rd, stride;
  Buf buf;
  Table(int64_t rows_, int64_t rd_, int64_t pad, std::mt19937_64* g, double theta = 1e4)
      : rows(rows_), rd(rd_), stride(rd_ + pad), buf(DType::f32, rows_ * (rd_ + pad)) {
    for (int64_t p = 0; p < rows; ++p)
      for (int64_t t = 0; t < rd / 2; ++t) {
        const double a = double(p) * std::pow(theta, -2.0 * double(t) / double(rd));
        buf.set(p * stride + t, g ? uniform(*g, -1, 1) : std::cos(a));
        buf.set(p * stride + rd / 2 + t, g ? uniform(*g, -1, 1) : std::sin(a));
      }
  }
  kvattn::TensorView view() { return buf.view({rows, rd}, {stride, 1}); }
  double c(int64_t p, int64_t t) const { return buf.get(p * stride + t); }
  double s(int64_t p, int64_t t) const { return buf.get(p * stride + rd / 2 + t); }
};

std::vector<int32_t> positions(std::mt19937_64& g, int64_t n, int64_t rows) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& x : p) x = int32_t(randint(g, 0, rows - 1));
  p[0] = 0;
  p[size_t(n - 1)] = int32_t(rows - 1);
  return p;
}

// Checks out (dense [nnz, H, D]) against the rotation of the fused buffer's heads by the table.
void check_rotation(Checker& c, const Buf& out, const Fused& in, int head0, int H, const Table& tb,
                    const std::vector<int32_t>& pos, bool interleave, DType t) {
  const int64_t half = tb.rd / 2;
  for (int64_t r = 0; r < in.nnz; ++r)
    for (int h = 0; h < H; ++h)
      for (int e = 0; e < kD; ++e) {
        const int64_t oi = (r * H + h) * kD + e, ii = in.off(r, head0 + h, e);
        const std::string where = (head0 ? "k" : "q") + idx({r, h, e}) + " pos " + std::to_string(pos[size_t(r)]);
        if (e >= tb.rd) {
          c.exact(out.bits(oi), in.buf.bits(ii), where);
          continue;
        }
        const int64_t tt = interleave ? e / 2 : e % half;
        const bool first = interleave ? e % 2 == 0 : e < half;
        const int i0 = int(interleave ? 2 * tt : tt), i1 = int(interleave ? 2 * tt + 1 : tt + half);
        const double x0 = in.buf.get(in.off(r, head0 + h, i0)), x1 = in.buf.get(in.off(r, head0 + h, i1));
        const double cs = tb.c(pos[size_t(r)], tt), sn = tb.s(pos[size_t(r)], tt);
        const double want = first ? x0 * cs - x1 * sn : x1 * cs + x0 * sn;
        const double tol = (std::fabs(x0) + std::fabs(x1)) * 4 * 0x1p-24;
        c.close(out.get(oi), want, tol + unit_roundoff(t) * (std::fabs(want) + tol) + half_subnormal_spacing(t), where);
      }
}

TEST(OpsApplyRopeCosSin, MatchesFloat64ReferenceOfTheTableEveryDtypeAndLayout) {
  OPS_TEST_RNG(rng);
  for (DType t : kFloatDtypes)
    for (bool interleave : {false, true})
      for (int64_t rd : {64, 32, 10})
        for (int64_t pad : {0, 5}) {
          SCOPED_TRACE(std::string(kvattn::dtype_name(t)) + (interleave ? " interleave" : " half") +
                       " rotary_dim=" + std::to_string(rd) + " row pad " + std::to_string(pad));
          const int64_t nnz = 17, rows = 40;
          Fused in(t, nnz, rng);
          const Buf before = in.buf;
          Table tb(rows, rd, pad, &rng);
          const Buf table_before = tb.buf;
          Buf qo(t, nnz * kHq * kD), ko(t, nnz * kHk * kD);
          auto pos = positions(rng, nnz, rows);
          const auto pos_before = pos;
          kvattn::apply_rope_with_cos_sin_cache(in.q(), in.k(), qo.view({nnz, kHq, kD}), ko.view({nnz, kHk, kD}),
                                                i32_view(pos), tb.view(), interleave);
          Checker c("apply_rope_with_cos_sin_cache");
          check_rotation(c, qo, in, 0, kHq, tb, pos, interleave, t);
          check_rotation(c, ko, in, kHq, kHk, tb, pos, interleave, t);
          for (int64_t i = 0; i < in.buf.size(); ++i) c.exact(in.buf.bits(i), before.bits(i), "input " + std::to_string(i));
          for (int64_t i = 0; i < tb.buf.size(); ++i) c.exact(tb.buf.bits(i), table_before.bits(i), "table " + std::to_string(i));
          c.truth(pos == pos_before, "pos_ids unchanged");
          EXPECT_TRUE(c.result());
        }
}

TEST(OpsApplyRopeCosSin, InPlaceEqualsOutOfPlaceAndLeavesTheRestAlone) {
  OPS_TEST_RNG(rng);
  for (DType t : kFloatDtypes)
    for (bool interleave : {false, true}) {
      SCOPED_TRACE(std::string(kvattn::dtype_name(t)) + (interleave ? " interleave" : ""));
      const int64_t nnz = 29;
      Fused a(t, nnz, rng);
      Table tb(64, 48, 0, &rng);
      Buf qo(t, nnz * kHq * kD), ko(t, nnz * kHk * kD);
      auto pos = positions(rng, nnz, 64);
      kvattn::apply_rope_with_cos_sin_cache(a.q(), a.k(), qo.view({nnz, kHq, kD}), ko.view({nnz, kHk, kD}),
                                            i32_view(pos), tb.view(), interleave);
      const Buf before = a.buf;
      kvattn::apply_rope_with_cos_sin_cache(a.q(), a.k(), a.q(), a.k(), i32_view(pos), tb.view(), interleave);
      Checker c("in place vs out of place");
      for (int64_t r = 0; r < nnz; ++r)
        for (int e = 0; e < kD + 3; ++e) {
          for (int h = 0; h < kHq; ++h)
            c.exact(a.buf.bits(a.off(r, h, e)), e < kD ? qo.bits((r * kHq + h) * kD + e) : before.bits(a.off(r, h, e)), "q" + idx({r, h, e}));
          for (int h = 0; h < kHk; ++h)
            c.exact(a.buf.bits(a.off(r, kHq + h, e)), e < kD ? ko.bits((r * kHk + h) * kD + e) : before.bits(a.off(r, kHq + h, e)), "k" + idx({r, h, e}));
          for (int h = kHq + kHk; h < kHq + 2 * kHk; ++h)  // the v heads
            c.exact(a.buf.bits(a.off(r, h, e)), before.bits(a.off(r, h, e)), "v" + idx({r, h, e}));
        }
      EXPECT_TRUE(c.result());
    }
}

// A table of cos / sin of the plain frequencies gives apply_rope's rotation (within apply_rope's
// own tolerance: its f32 angles carry ~|a| ulps, ops_rope_test.cpp).
TEST(OpsApplyRopeCosSin, TableOfThePlainFrequenciesMatchesApplyRope) {
  OPS_TEST_RNG(rng);
  const int64_t nnz = 23, rows = 512;
  for (bool interleave : {false, true}) {
    Fused in(DType::f32, nnz, rng);
    Table tb(rows, kD, 0, nullptr);
    Buf a(DType::f32, nnz * kHq * kD), ak(DType::f32, nnz * kHk * kD);
    Buf b(DType::f32, nnz * kHq * kD), bk(DType::f32, nnz * kHk * kD);
    auto pos = positions(rng, nnz, rows);
    kvattn::RopeOptions opt;
    opt.interleave = interleave;
    kvattn::apply_rope(in.q(), in.k(), a.view({nnz, kHq, kD}), ak.view({nnz, kHk, kD}), i32_view(pos), opt);
    kvattn::apply_rope_with_cos_sin_cache(in.q(), in.k(), b.view({nnz, kHq, kD}), bk.view({nnz, kHk, kD}),
                                          i32_view(pos), tb.view(), interleave);
    Checker c(interleave ? "interleaved" : "rotate-half");
    for (int64_t i = 0; i < a.size(); ++i) c.close(b.get(i), a.get(i), 4 * (64 * 0x1p-24 * rows + 8 * 0x1p-24), "q " + std::to_string(i));
    for (int64_t i = 0; i < ak.size(); ++i) c.close(bk.get(i), ak.get(i), 4 * (64 * 0x1p-24 * rows + 8 * 0x1p-24), "k " + std::to_string(i));
    EXPECT_TRUE(c.result());
  }
}

TEST(OpsApplyRopeCosSinErrors, EachBadArgumentIsNamedAndNothingIsWritten) {
  OPS_TEST_RNG(rng);
  const int64_t n = 5, rows = 8;
  Fused in(DType::bf16, n, rng);
  Table tb(rows, 32, 0, &rng);
  Buf qo(DType::bf16, n * kHq * kD), ko(DType::bf16, n * kHk * kD), f16o(DType::f16, n * kHq * kD);
  Buf t16(DType::f16, rows * 32), wide(DType::f32, rows * 66), odd(DType::f32, rows * 7);
  std::vector<int32_t> pos = {0, 1, 2, 3, 7}, short_pos = {0, 1, 2}, past = {0, 1, 8, 3, 4}, neg = {0, -1, 2, 3, 4};
  auto Q = in.q(), K = in.k(), QO = qo.view({n, kHq, kD}), KO = ko.view({n, kHk, kD});
  auto P = i32_view(pos), T = tb.view();
  auto call = [](kvattn::TensorView q, kvattn::TensorView k, kvattn::TensorView qo_, kvattn::TensorView ko_,
                 kvattn::TensorView p, kvattn::TensorView table) {
    return [=] { kvattn::apply_rope_with_cos_sin_cache(q, k, qo_, ko_, p, table); };
  };
  EXPECT_TRUE(throws_with(call(Q, K, QO, KO, P, tb.buf.view({rows * 32})), "cos_sin_cache must be 2-D, got f32[256] on cpu"));
  EXPECT_TRUE(throws_with(call(Q, K, QO, KO, P, t16.view({rows, 32})), "cos_sin_cache has dtype f16 but f32 is expected"));
  EXPECT_TRUE(throws_with(call(Q, K, QO, KO, P, odd.view({rows, 7})), "cos_sin_cache.shape[1] = 7 (rotary_dim: the cos of rotary_dim / 2 frequencies, then their sin) must be even"));
  EXPECT_TRUE(throws_with(call(Q, K, QO, KO, P, wide.view({rows, 66})), "cos_sin_cache.shape[1] = 66 (rotary_dim) exceeds the head dim 64"));
  EXPECT_TRUE(throws_with(call(Q, K, QO, KO, P, tb.buf.view({rows, 16}, {32, 2})),
                          "cos_sin_cache must be contiguous in its last (head) dimension"));
  EXPECT_TRUE(throws_with(call(Q, K, QO, KO, P, kvattn::TensorView(nullptr, DType::f32, {rows, 32})),
                          "cos_sin_cache has a null data pointer"));
  EXPECT_TRUE(throws_with(call(Q, K, QO, KO, P, tb.buf.view({rows, 32}, kvattn::Device::cuda(0))),
                          "cos_sin_cache is on cuda:0 but q is on cpu"));
  EXPECT_TRUE(throws_with(call(Q, K, QO, KO, i32_view(past), T), "pos_ids[2] = 8 is out of range [0, 8) (the rows of cos_sin_cache)"));
  EXPECT_TRUE(throws_with(call(Q, K, QO, KO, i32_view(neg), T), "pos_ids[1] = -1 is out of range [0, 8)"));
  EXPECT_TRUE(throws_with(call(Q, K, QO, KO, i32_view(short_pos), T), "pos_ids has 3 elements but 5 are expected"));
  EXPECT_TRUE(throws_with(call(Q, K, f16o.view({n, kHq, kD}), KO, P, T), "q_out has dtype f16 but q has dtype bf16; they must match"));
  EXPECT_TRUE(throws_with(call(Q, K, QO, qo.view({n, kHq, kD}), P, T), "k_out.shape[1] = 4 but k.shape[1] = 2"));
  EXPECT_TRUE(throws_with(call(Q, qo.view({n - 1, kHk, kD}), QO, KO, P, T), "k.shape[0] = 4 but q.shape[0] (nnz) = 5"));
  EXPECT_TRUE(throws_with(call(Q, K, in.buf.view({n, kHq, kD}, {in.rs, in.hs + 1, 1}), KO, P, T), "q_out aliases q with other strides"));
  EXPECT_TRUE(throws_with(call(Q, K, QO, qo.view({n, kHk, kD}), P, T), "overlaps k_out"));  // inside q_out
  // An output over the table or the positions: the rotation would read what it already wrote.
  std::vector<int32_t> store(size_t(n * kHk * kD), 0);  // bytes for a bf16 k_out and more
  for (int64_t i = 0; i < n; ++i) store[size_t(i)] = pos[size_t(i)];
  const kvattn::TensorView k_over(store.data(), DType::bf16, {n, kHk, kD});
  EXPECT_TRUE(throws_with(call(Q, K, QO, k_over, P, kvattn::TensorView(store.data(), DType::f32, {rows, 32})),
                          "overlaps cos_sin_cache"));
  EXPECT_TRUE(throws_with(call(Q, K, QO, k_over, kvattn::TensorView(store.data(), DType::i32, {n}), T),
                          "overlaps pos_ids"));
  const auto cuda = kvattn::Device::cuda(0);
  EXPECT_TRUE(throws_with(call(in.buf.view({n, kHq, kD}, {in.rs, in.hs, 1}, 0, cuda),
                               in.buf.view({n, kHk, kD}, {in.rs, in.hs, 1}, kHq * in.hs, cuda), qo.view({n, kHq, kD}, cuda),
                               ko.view({n, kHk, kD}, cuda), P, tb.buf.view({rows, 32}, cuda)),
                          "pos_ids is on cpu but q is on cuda:0; with CUDA tensors, pos_ids is an int32 tensor on q's device"));
  Checker c("outputs after rejected calls");
  for (int64_t i = 0; i < qo.size(); ++i) c.truth(qo.poisoned(i), "q_out " + std::to_string(i));
  for (int64_t i = 0; i < ko.size(); ++i) c.truth(ko.poisoned(i), "k_out " + std::to_string(i));
  EXPECT_TRUE(c.result());
  EXPECT_NO_THROW(call(Q, K, QO, KO, P, T)());  // the base arguments are valid
}

}  // namespace
}  // namespace ops_test
