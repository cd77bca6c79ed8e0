// merge_state, merge_state_in_place and merge_states (kvattn/ops.h) on the CPU.
//
// Legal problems: 0-8 rows, 1-4 heads, head dims 5-64, input states f32/f16/bf16 with f32 LSEs
// (mostly in [-20, 20], some -inf, some far below the others so that their weights underflow),
// any output dtype, padded strides, a u8 row mask of any stride (in place), and the documented
// exact aliasing (an output the same view as an input). Reference: tests/reference's
// merge_states in float64 over the decoded inputs.
//
// Tolerances (as tests/ops_merge_test.cpp derives them): the f32 fold of k <= 7 states stays within
// 16 ulps of the largest input magnitude |o_i[e]| (o_mag here), then one rounding to the output
// dtype (compare.h's 2 unit roundoffs); the LSE m + log2(d), d in [1, k], within 1e-6 (1 + |lse|).
// A side with lse = -inf is not read; all -inf gives exactly o = 0, lse = -inf.
#include <algorithm>
#include <cmath>
#include <memory>

#include "fuzz/operations.h"
#include "reference/reference.h"
#include "support/compare.h"

namespace kvattn_fuzz {
namespace {

using kvattn_test::ComputeTolerance;

constexpr ComputeTolerance kMergeTolerance{16 * 0x1p-24, 1e-6};

double random_lse(Ctx& ctx) {
  const double u = ctx.values.uniform(0, 1);
  if (u < 0.12) return -kInf;
  if (u < 0.17) return double(float(ctx.values.uniform(-200, -150)));
  return double(float(ctx.values.uniform(-20, 20)));
}

// A state tensor [dims..., D] of random values and its LSE tensor [dims...].
struct States {
  HostTensor v, s;
};

States make_states(Ctx& ctx, DType t, std::vector<int64_t> dims, int64_t D) {
  std::vector<int64_t> vs = dims;
  vs.push_back(D);
  States st{make_tensor(ctx, t, vs), make_tensor(ctx, DType::f32, dims)};
  st.v.for_each([&](int64_t off, const std::vector<int64_t>&) { st.v.set_at(off, ctx.values.uniform(-2, 2)); });
  st.s.for_each([&](int64_t off, const std::vector<int64_t>&) { st.s.set_at(off, random_lse(ctx)); });
  return st;
}

// Element (row, [state,] head, e) of a state tensor, decoded.
double val(const HostTensor& t, std::initializer_list<int64_t> idx) { return t.get(idx); }

// Appends the merge of the given (o, lse) pairs for one (row, head) to the dense references.
void ref_merge(const std::vector<std::vector<double>>& o, const std::vector<double>& lse,
               std::vector<double>& o_ref, std::vector<double>& mag, std::vector<double>& lse_ref) {
  const auto r = kvattn_test::ref::merge_states(o, lse);
  o_ref.insert(o_ref.end(), r.o.begin(), r.o.end());
  mag.insert(mag.end(), r.o_mag.begin(), r.o_mag.end());
  lse_ref.push_back(r.lse[0]);
}

void check_states(const HostTensor& v, const HostTensor& s, const std::vector<double>& o_ref,
                  const std::vector<double>& mag, const std::vector<double>& lse_ref) {
  if (auto r = kvattn_test::outputs_match(v, o_ref, mag, kMergeTolerance); !r) fail("merged o: ", r.message());
  if (auto r = kvattn_test::lse_match(s, lse_ref, kMergeTolerance); !r) fail("merged lse: ", r.message());
}

// A view at `base`'s address shifted by one element of `base` (a partial overlap: base has at least
// two elements per row, so the shifted view always shares bytes with it).
TensorView shifted_into(const TensorView& v, const TensorView& base) {
  return with_data(v, static_cast<const char*>(base.data()) + kvattn::dtype_size(base.dtype()));
}

// Sizes, dtypes and devices of the states are legal relative to each other, so the corruptions of
// one group share a target (`group`): two could agree again otherwise (v_a and v_b both bf16).
void common_state_corruptions(Ctx& ctx, std::vector<Corruption>& c, const std::string& name, TensorView& v,
                              std::vector<DType> dtypes, std::vector<int> exact, bool output, const std::string& group) {
  tensor_corruptions(ctx, c, name, v, {std::move(dtypes), true, std::move(exact), output, group});
}
void lse_corruptions(Ctx& ctx, std::vector<Corruption>& c, const std::string& name, TensorView& s, std::vector<int> exact,
                     bool output, const std::string& group) {
  tensor_corruptions(ctx, c, name, s, {{DType::f32}, false, std::move(exact), output, group});
}

}  // namespace

void fuzz_merge_state(Ctx& ctx) {
  Source& s = ctx.src;
  const int64_t n = s.range(0, 8), H = s.range(1, 4), D = s.pick<int64_t>({5, 8, 16, 40, 64});
  const DType in = s.pick(kComputeDtypes), ot = s.pick(kComputeDtypes);
  auto a = std::make_unique<States>(make_states(ctx, in, {n, H}, D));
  auto b = std::make_unique<States>(make_states(ctx, in, {n, H}, D));
  auto o = std::make_unique<States>(States{make_tensor(ctx, ot, {n, H, D}), make_tensor(ctx, DType::f32, {n, H})});
  // In place: the output the same view as v_a (or v_b), as kvattn/ops.h allows.
  const int alias = ot == in && s.chance(30) ? int(s.range(1, 2)) : 0;
  for (HostTensor* t : {&a->v, &a->s, &b->v, &b->s, &o->v, &o->s}) ctx.track(*t);
  ctx.note("merge_state: n ", n, " H ", H, " D ", D, " in ", dtype_str(in), " out ", dtype_str(ot),
           alias ? (alias == 1 ? " in place on a" : " in place on b") : "");

  std::vector<double> o_ref, mag, lse_ref;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<std::vector<double>> os(2, std::vector<double>(size_t(D)));
      for (int64_t e = 0; e < D; ++e) {
        os[0][size_t(e)] = val(a->v, {r, h, e});
        os[1][size_t(e)] = val(b->v, {r, h, e});
      }
      ref_merge(os, {a->s.get({r, h}), b->s.get({r, h})}, o_ref, mag, lse_ref);
    }
  HostTensor& out_v = alias == 1 ? a->v : alias == 2 ? b->v : o->v;
  HostTensor& out_s = alias == 1 ? a->s : alias == 2 ? b->s : o->s;
  struct Args {
    TensorView va, sa, vb, sb, vo, so;
  } legal{a->v.view(), a->s.view(), b->v.view(), b->s.view(), out_v.view(), out_s.view()};
  auto call = [](const Args& x) { kvattn::merge_state(x.va, x.sa, x.vb, x.sb, x.vo, x.so); };

  if (!ctx.corrupt) {
    const auto a_before = a->v.snapshot(), b_before = b->v.snapshot();
    expect_success(ctx, "merge_state", [&] { call(legal); });
    if (alias != 1 && !a->v.same_bytes(a_before)) fail("merge_state changed v_a");
    if (alias != 2 && !b->v.same_bytes(b_before)) fail("merge_state changed v_b");
    check_states(out_v, out_s, o_ref, mag, lse_ref);
    return;
  }
  Args bad = legal;
  std::vector<Corruption> c;
  common_state_corruptions(ctx, c, "v_a", bad.va, {in}, {0, 1, 2}, false, "v");
  common_state_corruptions(ctx, c, "v_b", bad.vb, {in}, {0, 1, 2}, false, "v");
  common_state_corruptions(ctx, c, "v_out", bad.vo, kComputeDtypes, {0, 1, 2}, true, "v");
  lse_corruptions(ctx, c, "s_a", bad.sa, {0, 1}, false, "s");
  lse_corruptions(ctx, c, "s_b", bad.sb, {0, 1}, false, "s");
  lse_corruptions(ctx, c, "s_out", bad.so, {0, 1}, true, "s");
  Args* B = &bad;
  if (n > 0) {
    c.push_back({"v_out partially overlaps v_a", "v", [B] { B->vo = shifted_into(B->vo, B->va); }});
    c.push_back({"v_out partially overlaps v_b", "v", [B] { B->vo = shifted_into(B->vo, B->vb); }});
    c.push_back({"v_out overlaps s_a", "v+s", [B] { B->vo = with_data(B->vo, B->sa.data()); }});
    c.push_back({"s_out overlaps v_out", "v+s", [B] { B->so = with_data(B->so, B->vo.data()); }});
    if (H >= 2) c.push_back({"s_out partially overlaps s_b", "s", [B] { B->so = shifted_into(B->so, B->sb); }});
    if (!alias && !exact_alias(with_data(o->v.view(), a->v.base()), a->v.view()))
      c.push_back({"v_out at v_a's address with another dtype or strides", "v",
                   [B] { B->vo = with_data(B->vo, B->va.data()); }});
  }
  expect_rejection(ctx, [&] {
    ctx.apply_corruptions(c);
    call(bad);
  });
}

void fuzz_merge_state_in_place(Ctx& ctx) {
  Source& s = ctx.src;
  const int64_t n = s.range(0, 8), H = s.range(1, 4), D = s.pick<int64_t>({5, 8, 16, 40, 64});
  const DType t = s.pick(kComputeDtypes);
  auto a = std::make_unique<States>(make_states(ctx, t, {n, H}, D));
  auto b = std::make_unique<States>(make_states(ctx, t, {n, H}, D));
  const bool self = s.chance(10);  // v_other the same view as v: merged with itself
  const int mask_mode = int(s.range(0, 2));  // none, stride 1-3, stride 0 (one byte for every row)
  const int64_t mstride = mask_mode == 1 ? s.range(1, 3) : 0;
  auto mask = std::make_unique<HostTensor>(DType::u8, std::vector<int64_t>{std::max<int64_t>(1, n * std::max<int64_t>(mstride, 1))});
  for (int64_t i = 0; i < mask->numel(); ++i) mask->set_at(i, ctx.values.coin(0.6) ? double(ctx.values.integer(1, 255)) : 0.0);
  for (HostTensor* x : {&a->v, &a->s, &b->v, &b->s, mask.get()}) ctx.track(*x);
  ctx.note("merge_state_in_place: n ", n, " H ", H, " D ", D, " ", dtype_str(t), self ? " with itself" : "",
           " mask mode ", mask_mode, " stride ", mstride);
  auto mask_at = [&](int64_t r) { return mask_mode == 0 ? 1 : int(mask->get_at(r * mstride)); };

  std::vector<double> o_ref, mag, lse_ref;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<std::vector<double>> os(2, std::vector<double>(size_t(D)));
      for (int64_t e = 0; e < D; ++e) {
        os[0][size_t(e)] = val(a->v, {r, h, e});
        os[1][size_t(e)] = self ? os[0][size_t(e)] : val(b->v, {r, h, e});
      }
      if (mask_at(r) == 0) {  // untouched: compared exactly below
        o_ref.insert(o_ref.end(), os[0].begin(), os[0].end());
        mag.insert(mag.end(), size_t(D), 0.0);
        lse_ref.push_back(a->s.get({r, h}));
        continue;
      }
      ref_merge(os, {a->s.get({r, h}), self ? a->s.get({r, h}) : b->s.get({r, h})}, o_ref, mag, lse_ref);
    }
  struct Args {
    TensorView v, s, vo, so, mask;
  } legal{a->v.view(), a->s.view(), self ? a->v.view() : b->v.view(), self ? a->s.view() : b->s.view(), {}};
  if (mask_mode) {
    const int64_t shape[1] = {n}, stride[1] = {mstride};
    legal.mask = TensorView(mask->base(), DType::u8, 1, shape, stride);
  }
  auto call = [](const Args& x) { kvattn::merge_state_in_place(x.v, x.s, x.vo, x.so, x.mask); };

  if (!ctx.corrupt) {
    // Rows the mask skips keep their bytes.
    std::vector<std::vector<uint8_t>> skipped_v, skipped_s;
    const auto v_before = a->v.snapshot(), s_before = a->s.snapshot(), b_before = b->v.snapshot();
    expect_success(ctx, "merge_state_in_place", [&] { call(legal); });
    if (!self && !b->v.same_bytes(b_before)) fail("merge_state_in_place changed v_other");
    for (int64_t r = 0; r < n; ++r) {
      if (mask_at(r) != 0) continue;
      for (int64_t h = 0; h < H; ++h) {
        const size_t es = kvattn::dtype_size(t);
        const size_t vo = size_t(a->v.view_byte_offset() + a->v.offset({r, h, 0}) * int64_t(es));
        const size_t so = size_t(a->s.view_byte_offset() + a->s.offset({r, h}) * 4);
        if (!std::equal(v_before.begin() + vo, v_before.begin() + vo + size_t(D) * es, a->v.raw_bytes().begin() + vo) ||
            !std::equal(s_before.begin() + so, s_before.begin() + so + 4, a->s.raw_bytes().begin() + so))
          fail("row ", r, " head ", h, " has mask 0 but was changed");
      }
    }
    check_states(a->v, a->s, o_ref, mag, lse_ref);
    return;
  }
  Args bad = legal;
  std::vector<Corruption> c;
  common_state_corruptions(ctx, c, "v", bad.v, {t}, {0, 1, 2}, true, "v");
  common_state_corruptions(ctx, c, "v_other", bad.vo, {t}, {0, 1, 2}, false, "v");
  lse_corruptions(ctx, c, "s", bad.s, {0, 1}, true, "s");
  lse_corruptions(ctx, c, "s_other", bad.so, {0, 1}, false, "s");
  Args* B = &bad;
  if (mask_mode) {
    TensorView* m = &bad.mask;
    const DType md = s.pick({DType::i32, DType::f32, DType::f16});
    c.push_back({cat("mask: dtype ", dtype_str(md)), "mask", [m, md] { *m = with_dtype(*m, md); }});
    c.push_back({"mask: 2-D", "mask", [m] { *m = with_extra_dim(*m); }});
    const int64_t delta = s.coin() ? 1 : -1;
    c.push_back({cat("mask: length ", delta > 0 ? "+ 1" : "- 1"), "mask",
                 [m, delta] { *m = with_size(*m, 0, m->size(0) + delta); }});
    if (n > 0) c.push_back({"mask: null data", "mask", [m] { *m = with_data(*m, nullptr); }});
    c.push_back({"mask: on cuda:0", "mask", [m] { *m = with_device(*m, kvattn::Device::cuda(0)); }});
    if (n > 0) c.push_back({"mask overlaps v", "mask+v", [B] { B->mask = with_data(B->mask, B->v.data()); }});
  }
  if (n > 0) {
    c.push_back({"v_other partially overlaps v", "v", [B] { B->vo = shifted_into(B->vo, B->v); }});
    c.push_back({"s overlaps v", "v+s", [B] { B->s = with_data(B->s, B->v.data()); }});
    c.push_back({"v overlaps s_other", "v+s", [B] { B->v = with_data(B->v, B->so.data()); }});
  }
  expect_rejection(ctx, [&] {
    ctx.apply_corruptions(c);
    call(bad);
  });
}

void fuzz_merge_states(Ctx& ctx) {
  Source& s = ctx.src;
  const int64_t n = s.range(0, 6), k = s.range(0, 7), H = s.range(1, 4), D = s.pick<int64_t>({5, 8, 16, 40, 64});
  const DType in = s.pick(kComputeDtypes), ot = s.pick(kComputeDtypes);
  auto st = std::make_unique<States>(make_states(ctx, in, {n, k, H}, D));
  auto o = std::make_unique<States>(States{make_tensor(ctx, ot, {n, H, D}), make_tensor(ctx, DType::f32, {n, H})});
  for (HostTensor* x : {&st->v, &st->s, &o->v, &o->s}) ctx.track(*x);
  ctx.note("merge_states: n ", n, " k ", k, " H ", H, " D ", D, " in ", dtype_str(in), " out ", dtype_str(ot));

  std::vector<double> o_ref, mag, lse_ref;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<std::vector<double>> os(static_cast<size_t>(k), std::vector<double>(static_cast<size_t>(D)));
      std::vector<double> lse(static_cast<size_t>(k));
      for (int64_t i = 0; i < k; ++i) {
        for (int64_t e = 0; e < D; ++e) os[size_t(i)][size_t(e)] = val(st->v, {r, i, h, e});
        lse[size_t(i)] = st->s.get({r, i, h});
      }
      if (k == 0) {  // no states: o = 0, lse = -inf
        o_ref.insert(o_ref.end(), size_t(D), 0.0);
        mag.insert(mag.end(), size_t(D), 0.0);
        lse_ref.push_back(-kInf);
        continue;
      }
      ref_merge(os, lse, o_ref, mag, lse_ref);
    }
  struct Args {
    TensorView v, s, vo, so;
  } legal{st->v.view(), st->s.view(), o->v.view(), o->s.view()};
  auto call = [](const Args& x) { kvattn::merge_states(x.v, x.s, x.vo, x.so); };

  if (!ctx.corrupt) {
    const auto before = st->v.snapshot();
    expect_success(ctx, "merge_states", [&] { call(legal); });
    if (!st->v.same_bytes(before)) fail("merge_states changed its input");
    check_states(o->v, o->s, o_ref, mag, lse_ref);
    return;
  }
  Args bad = legal;
  std::vector<Corruption> c;
  common_state_corruptions(ctx, c, "v", bad.v, kComputeDtypes, {0, 1, 2, 3}, false, "states");
  common_state_corruptions(ctx, c, "v_out", bad.vo, kComputeDtypes, {0, 1, 2}, true, "states");
  lse_corruptions(ctx, c, "s", bad.s, {0, 1, 2}, false, "states");
  lse_corruptions(ctx, c, "s_out", bad.so, {0, 1}, true, "states");
  Args* B = &bad;
  if (n > 0 && k > 0) {
    c.push_back({"v_out overlaps v", "states", [B] { B->vo = with_data(B->vo, B->v.data()); }});
    c.push_back({"s_out overlaps s", "states", [B] { B->so = with_data(B->so, B->s.data()); }});
  }
  if (n > 0) c.push_back({"s_out overlaps v_out", "states", [B] { B->so = with_data(B->so, B->vo.data()); }});
  expect_rejection(ctx, [&] {
    ctx.apply_corruptions(c);
    call(bad);
  });
}

}  // namespace kvattn_fuzz
