// merge_state, merge_state_in_place and merge_states against a float64 reference written here
// (SEMANTICS.md, "Merging attention states"), on fresh random inputs in every dtype, with -inf
// states, masks, strided views and aliasing; and every validation error by its message.
//
// Tolerances. The reference reads the stored (decoded) inputs, so input rounding adds nothing. The
// library folds in f32: each output element is a convex combination of the inputs' elements, whose
// f32 rounding errors (weights 2^(lse_i - m), products, sums, the final division) stay within
// 16 ulps of the largest input magnitude |o_i[e]| for the k <= 6 states used here (kF32Fold).
// The result is then rounded once to the output dtype: half an ulp of |o| (2^-24, 2^-11, 2^-8 for
// f32, f16, bf16). The LSE is m + log2(d) with d in [1, k]: a few ulps of |lse|, so 1e-6 * max(1,
// |lse|) (16 ulps at |lse| = 1, far below the O(1) error of any wrong weight or base).
#include "ops_testing.h"

namespace ops_test {
namespace {

constexpr double kF32Fold = 16 * 0x1p-24;
constexpr int kH = 3, kD = 40;

// One state per (row, head): o [D], lse.
struct State {
  std::vector<double> o;
  double lse;
};

// Float64 fold of states (SEMANTICS.md): lse = log2(sum 2^lse_i), o = sum o_i 2^(lse_i - lse);
// -inf states contribute nothing; none left: o = 0, lse = -inf.
State ref_merge(const std::vector<State>& in, int D) {
  double m = -kInf;
  for (const State& s : in) m = std::max(m, s.lse);
  State out{std::vector<double>(size_t(D), 0.0), -kInf};
  if (m == -kInf) return out;
  double d = 0;
  for (const State& s : in)
    if (s.lse != -kInf) d += std::exp2(s.lse - m);
  out.lse = m + std::log2(d);
  for (const State& s : in)
    if (s.lse != -kInf)
      for (int e = 0; e < D; ++e) out.o[size_t(e)] += s.o[size_t(e)] * std::exp2(s.lse - out.lse);
  return out;
}

// Random lse per (row, head): mostly in [-20, 20], sometimes -inf (prob p_inf), sometimes far from
// the others (weights that underflow f32 to 0 or nearly).
double random_lse(std::mt19937_64& g, double p_inf) {
  double u = uniform(g, 0, 1);
  if (u < p_inf) return -kInf;
  // Stored as f32 LSEs, so rounded to f32 here.
  if (u < p_inf + 0.05) return double(float(uniform(g, -200, -150)));
  return double(float(uniform(g, -20, 20)));
}

// A [n, H, D] state tensor stored with padded strides: row stride H*(D+5)+3, head stride D+5.
struct StateTensor {
  int64_t n, row_stride, head_stride;
  Buf v, s;  // s: [n, H] with strides (2H+1, 2)
  StateTensor(DType t, int64_t n_, bool padded)
      : n(n_), row_stride(padded ? kH * (kD + 5) + 3 : kH * kD), head_stride(padded ? kD + 5 : kD),
        v(t, std::max<int64_t>(1, n_ * row_stride)), s(DType::f32, std::max<int64_t>(1, n_ * (2 * kH + 1))) {}
  int64_t vo(int64_t r, int h, int e) const { return r * row_stride + h * head_stride + e; }
  int64_t so(int64_t r, int h) const { return r * (2 * kH + 1) + 2 * h; }
  kvattn::TensorView vv() { return v.view({n, kH, kD}, {row_stride, head_stride, 1}); }
  kvattn::TensorView sv() { return s.view({n, kH}, {2 * kH + 1, 2}); }
  void fill(std::mt19937_64& g, double p_inf) {
    for (int64_t r = 0; r < n; ++r)
      for (int h = 0; h < kH; ++h) {
        double l = random_lse(g, p_inf);
        s.set(so(r, h), l);
        for (int e = 0; e < kD; ++e)  // a -inf state's o is NaN: it must not be read
          v.set(vo(r, h, e), l == -kInf && e % 7 == 0 ? std::nan("") : uniform(g, -3, 3));
      }
  }
  State state(int64_t r, int h) const {
    State st{std::vector<double>(kD), s.get(so(r, h))};
    for (int e = 0; e < kD; ++e) st.o[size_t(e)] = v.get(vo(r, h, e));
    return st;
  }
};

// Checks out against the merge of `ins`; the output must be exact when only one input is finite.
void check_state(Checker& c, const StateTensor& out, int64_t r, int h, const std::vector<State>& ins) {
  State want = ref_merge(ins, kD);
  int finite = 0;
  const State* only = nullptr;
  for (const State& s : ins)
    if (s.lse != -kInf) { ++finite; only = &s; }
  const DType ot = out.v.dtype();
  for (int e = 0; e < kD; ++e) {
    double mag = 0;
    for (const State& s : ins)
      if (s.lse != -kInf) mag = std::max(mag, std::fabs(s.o[size_t(e)]));
    const double got = out.v.get(out.vo(r, h, e));
    const std::string where = "o" + idx({r, h, e});
    if (finite <= 1)  // SEMANTICS: the other side unchanged (rounded to the output dtype), or 0
      c.exact(got, finite ? round_to(ot, only->o[size_t(e)]) : 0.0, where);
    else
      c.close(got, want.o[size_t(e)],
              kF32Fold * mag + unit_roundoff(ot) * (std::fabs(want.o[size_t(e)]) + kF32Fold * mag),
              where);
  }
  const double lse = out.s.get(out.so(r, h));
  if (finite <= 1) c.exact(lse, finite ? only->lse : -kInf, "lse" + idx({r, h}));
  else c.close(lse, want.lse, 1e-6 * std::max(1.0, std::fabs(want.lse)), "lse" + idx({r, h}));
}

TEST(OpsMergeState, MatchesFloat64ReferenceEveryDtypeWithInfAndStrides) {
  OPS_TEST_RNG(rng);
  for (DType in : kFloatDtypes)
    for (DType out : kFloatDtypes)
      for (bool padded : {false, true}) {
        SCOPED_TRACE(std::string(kvattn::dtype_name(in)) + " -> " +
                     std::string(kvattn::dtype_name(out)) + (padded ? " strided" : ""));
        const int64_t n = 53;
        StateTensor a(in, n, padded), b(in, n, !padded), o(out, n, padded);
        a.fill(rng, 0.2);
        b.fill(rng, 0.2);
        kvattn::merge_state(a.vv(), a.sv(), b.vv(), b.sv(), o.vv(), o.sv());
        Checker c("merge_state");
        for (int64_t r = 0; r < n; ++r)
          for (int h = 0; h < kH; ++h) check_state(c, o, r, h, {a.state(r, h), b.state(r, h)});
        // Padding between rows, heads and lse entries is never written.
        for (int64_t i = 0; i < o.v.size(); ++i)
          if (i % o.row_stride >= kH * o.head_stride || i % o.row_stride % o.head_stride >= kD)
            c.truth(o.v.poisoned(i), "v_out padding at " + std::to_string(i));
        for (int64_t i = 0; i < o.s.size(); ++i)
          if (i % (2 * kH + 1) % 2 == 1 || i % (2 * kH + 1) == 2 * kH)
            c.truth(o.s.poisoned(i), "s_out padding at " + std::to_string(i));
        EXPECT_TRUE(c.result());
      }
}

TEST(OpsMergeState, OutputMayAliasAnInput) {
  OPS_TEST_RNG(rng);
  for (DType t : kFloatDtypes) {
    SCOPED_TRACE(std::string(kvattn::dtype_name(t)));
    StateTensor a(t, 17, true), b(t, 17, true);
    a.fill(rng, 0.2);
    b.fill(rng, 0.2);
    std::vector<State> sa, sb;
    for (int64_t r = 0; r < 17; ++r)
      for (int h = 0; h < kH; ++h) { sa.push_back(a.state(r, h)); sb.push_back(b.state(r, h)); }
    kvattn::merge_state(a.vv(), a.sv(), b.vv(), b.sv(), b.vv(), b.sv());  // out = b
    Checker c("merge_state into b");
    for (int64_t r = 0; r < 17; ++r)
      for (int h = 0; h < kH; ++h) check_state(c, b, r, h, {sa[size_t(r * kH + h)], sb[size_t(r * kH + h)]});
    EXPECT_TRUE(c.result());
  }
}

TEST(OpsMergeStateInPlace, MaskedRowsUntouchedOthersMerged) {
  OPS_TEST_RNG(rng);
  for (DType t : kFloatDtypes)
    for (bool use_mask : {false, true}) {
      SCOPED_TRACE(std::string(kvattn::dtype_name(t)) + (use_mask ? " mask" : ""));
      const int64_t n = 41;
      StateTensor v(t, n, true), other(t, n, false);
      v.fill(rng, 0.15);
      other.fill(rng, 0.15);
      const StateTensor before = v;
      std::vector<uint8_t> mask(size_t(2 * n), 0xee);  // strided: every other byte
      for (int64_t r = 0; r < n; ++r) mask[size_t(2 * r)] = uint8_t(randint(rng, 0, 2) ? randint(rng, 1, 255) : 0);
      kvattn::TensorView mv = use_mask ? kvattn::TensorView(mask.data(), DType::u8, {n}, {2})
                                       : kvattn::TensorView();
      kvattn::merge_state_in_place(v.vv(), v.sv(), other.vv(), other.sv(), mv);
      Checker c("merge_state_in_place");
      for (int64_t r = 0; r < n; ++r)
        for (int h = 0; h < kH; ++h) {
          if (use_mask && mask[size_t(2 * r)] == 0) {
            for (int e = 0; e < kD; ++e)
              c.exact(v.v.bits(v.vo(r, h, e)), before.v.bits(v.vo(r, h, e)), "masked o" + idx({r, h, e}));
            c.exact(v.s.bits(v.so(r, h)), before.s.bits(v.so(r, h)), "masked lse" + idx({r, h}));
          } else {
            check_state(c, v, r, h, {before.state(r, h), other.state(r, h)});
          }
        }
      EXPECT_TRUE(c.result());
    }
}

// merge_states over v [n, k, H, D] stored as [k, n, H, D] (split-KV partials), so the view's
// strides are permuted.
TEST(OpsMergeStates, FoldsKStatesEveryDtypeIncludingZeroAndOne) {
  OPS_TEST_RNG(rng);
  for (DType in : kFloatDtypes)
    for (DType out : kFloatDtypes)
      for (int k : {0, 1, 2, 6}) {
        SCOPED_TRACE(std::string(kvattn::dtype_name(in)) + " -> " +
                     std::string(kvattn::dtype_name(out)) + " k=" + std::to_string(k));
        const int64_t n = 29, slab = n * kH * kD;
        Buf v(in, std::max<int64_t>(1, k * slab)), s(DType::f32, std::max<int64_t>(1, k * n * kH));
        std::vector<std::vector<State>> ins(size_t(n * kH));
        for (int i = 0; i < k; ++i)
          for (int64_t r = 0; r < n; ++r)
            for (int h = 0; h < kH; ++h) {
              double l = random_lse(rng, r % 5 == 0 ? 1.0 : 0.25);  // every 5th row: all -inf
              s.set((i * n + r) * kH + h, l);
              State st{std::vector<double>(kD), l};
              for (int e = 0; e < kD; ++e) {
                v.set(i * slab + (r * kH + h) * kD + e, uniform(rng, -3, 3));
                st.o[size_t(e)] = v.get(i * slab + (r * kH + h) * kD + e);
              }
              ins[size_t(r * kH + h)].push_back(st);
            }
        StateTensor o(out, n, true);
        kvattn::merge_states(v.view({n, k, kH, kD}, {kH * kD, slab, kD, 1}),
                             s.view({n, k, kH}, {kH, n * kH, 1}), o.vv(), o.sv());
        Checker c("merge_states");
        for (int64_t r = 0; r < n; ++r)
          for (int h = 0; h < kH; ++h) check_state(c, o, r, h, ins[size_t(r * kH + h)]);
        EXPECT_TRUE(c.result());
      }
}

// ---- validation ---------------------------------------------------------------------------------
TEST(OpsMergeErrors, EachBadArgumentIsNamedAndNothingIsWritten) {
  const int64_t n = 4;
  StateTensor a(DType::bf16, n, false), b(DType::bf16, n, false), o(DType::f32, n, false);
  Buf v16(DType::f16, n * kH * kD), s16(DType::f16, n * kH), i32(DType::i32, n * kH * kD);
  Buf wide(DType::bf16, n * 4 * kD), slong(DType::f32, (n + 1) * kH), m32(DType::i32, n);
  std::vector<uint8_t> mask(size_t(n), 1);
  auto A = a.vv(), SA = a.sv(), B = b.vv(), SB = b.sv(), O = o.vv(), SO = o.sv();
  auto call = [&](kvattn::TensorView va, kvattn::TensorView sa, kvattn::TensorView vb,
                  kvattn::TensorView sb, kvattn::TensorView vo, kvattn::TensorView so) {
    return [=] { kvattn::merge_state(va, sa, vb, sb, vo, so); };
  };
  const auto cuda = kvattn::Device::cuda(0);
  EXPECT_TRUE(throws_with(call(v16.view({n, kH, kD}), SA, B, SB, O, SO), "v_b has dtype bf16 but v_a has dtype f16; they must match"));
  EXPECT_TRUE(throws_with(call(A, SA, wide.view({n, 4, kD}), SB, O, SO), "v_b.shape[1] = 4 but v_a.shape[1] = 3"));
  EXPECT_TRUE(throws_with(call(A, SA, B, SB, wide.view({n, kH, 4 * kD / kH - 1}), SO), "v_out.shape[2] = 52 but v_a.shape[2] = 40"));
  EXPECT_TRUE(throws_with(call(i32.view({n, kH, kD}), SA, B, SB, O, SO), "v_a has dtype i32; expected f32, f16 or bf16"));
  EXPECT_TRUE(throws_with(call(A.select(0), SA, B, SB, O, SO), "v_a must be 3-D, got bf16[3, 40] on cpu"));
  EXPECT_TRUE(throws_with(call(A, s16.view({n, kH}), B, SB, O, SO), "s_a has dtype f16 but f32 is expected"));
  EXPECT_TRUE(throws_with(call(A, SA, B, slong.view({n + 1, kH}), O, SO), "s_b.shape[0] = 5 but v_a.shape[0] = 4"));
  EXPECT_TRUE(throws_with(call(A, SA, B, SB, O, kvattn::TensorView()), "s_out is required but was not given"));
  EXPECT_TRUE(throws_with(call(A, SA, B, SB, o.v.view({n, kH, kD}, {kH * kD, kD, 2}), SO),
                          "v_out must be contiguous in its last (head) dimension"));
  EXPECT_TRUE(throws_with(call(kvattn::TensorView(nullptr, DType::bf16, {n, kH, kD}), SA, B, SB, O, SO), "v_a has a null data pointer"));
  EXPECT_TRUE(throws_with(call(A, SA, b.v.view({n, kH, kD}, cuda), SB, O, SO), "v_b is on cuda:0 but v_a is on cpu"));
  if (!cuda_device_present())
    EXPECT_TRUE(throws_with(call(a.v.view({n, kH, kD}, cuda), a.s.view({n, kH}, {2 * kH + 1, 2}, 0, cuda),
                                 b.v.view({n, kH, kD}, cuda), b.s.view({n, kH}, {2 * kH + 1, 2}, 0, cuda),
                                 o.v.view({n, kH, kD}, cuda), o.s.view({n, kH}, {2 * kH + 1, 2}, 0, cuda)),
                            no_cuda_message("v_a")));
  // In place: the mask.
  auto in_place = [&](kvattn::TensorView m) { return [=] { kvattn::merge_state_in_place(A, SA, B, SB, m); }; };
  EXPECT_TRUE(throws_with(in_place(m32.view({n})), "mask has dtype i32 but u8 is expected"));
  EXPECT_TRUE(throws_with(in_place(kvattn::TensorView(mask.data(), DType::u8, {n - 1})), "mask.shape[0] = 3 but v.shape[0] = 4"));
  EXPECT_TRUE(throws_with([&] { kvattn::merge_state_in_place(A, SA, v16.view({n, kH, kD}), SB); },
                          "v_other has dtype f16 but v has dtype bf16; they must match"));
  // merge_states.
  Buf v4(DType::f32, n * 2 * kH * kD), s3(DType::f32, n * 2 * kH);
  EXPECT_TRUE(throws_with([&] { kvattn::merge_states(v4.view({n, 2 * kH, kD}), s3.view({n, 2, kH}), O, SO); },
                          "v must be 4-D, got f32[4, 6, 40] on cpu"));
  EXPECT_TRUE(throws_with([&] { kvattn::merge_states(v4.view({n, 2, kH, kD}), s3.view({n, 1, 2 * kH}), O, SO); },
                          "s.shape[1] = 1 but v.shape[1] = 2"));
  EXPECT_TRUE(throws_with([&] { kvattn::merge_states(v4.view({n, 2 * kH, 1, kD}), s3.view({n, 2 * kH, 1}), O, SO); },
                          "v_out.shape[1] = 3 but v.shape[2] = 1"));
  EXPECT_TRUE(throws_with([&] { kvattn::merge_states(v4.view({n, 2, kH, kD}), s3.view({n, 2, kH}), O, s3.view({n, 2 * kH})); },
                          "s_out.shape[1] = 6 but v.shape[2] = 3"));
  // No call above wrote anything.
  Checker c("outputs after rejected calls");
  for (int64_t i = 0; i < o.v.size(); ++i) c.truth(o.v.poisoned(i), "v_out " + std::to_string(i));
  for (int64_t i = 0; i < o.s.size(); ++i) c.truth(o.s.poisoned(i), "s_out " + std::to_string(i));
  for (int64_t i = 0; i < a.v.size(); ++i) c.truth(a.v.poisoned(i), "v " + std::to_string(i));
  EXPECT_TRUE(c.result());
}

}  // namespace
}  // namespace ops_test
