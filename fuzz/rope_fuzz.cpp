// apply_rope (kvattn/ops.h) on the CPU.
//
// Legal problems: 0-10 tokens, 1-4 query and key heads, even head dims 2-64, a rotary_dim of 0
// (all) or any even value up to the head dim, q and k in any of f32/f16/bf16 (each its own),
// rotate-half or interleaved, plain or Llama 3.1 frequencies with random legal factors, positions
// in [-64, 1023]; separate buffers, in place (outputs the same views as the inputs), or q and k as
// the head ranges of one fused QKV buffer (in place or not). Reference: tests/reference's
// apply_rope in float64 on the decoded inputs.
//
// Tolerance (tests/ops_rope_test.cpp derives it): an element of the pair (x0, x1) rotated by the
// angle a is off by at most (|x0| + |x1|) (64 u |a| + 8 u), u = 2^-24 (the f32 frequency, angle,
// cosf/sinf and the products), then half an ulp of the output dtype; elements past rotary_dim and
// every element at position 0 come back bit for bit.
#include <array>
#include <cmath>
#include <cstring>
#include <memory>

#include "fuzz/operations.h"
#include "reference/reference.h"
#include "support/dtype_codec.h"

namespace kvattn_fuzz {
namespace {

int64_t elem(const TensorView& v, int64_t r, int64_t h, int64_t e) {
  return r * v.stride(0) + h * v.stride(1) + e * v.stride(2);
}
double get(const TensorView& v, int64_t r, int64_t h, int64_t e) {
  return kvattn_test::decode(v.data(), v.dtype(), elem(v, r, h, e));
}
double unit_roundoff(DType t) {
  return t == DType::f32 ? 0x1p-24 : t == DType::f16 ? 0x1p-11 : 0x1p-8;
}
double subnormal_half(DType t) { return t == DType::f32 ? 0x1p-150 : t == DType::f16 ? 0x1p-25 : 0x1p-134; }

constexpr const char* kLayoutNames[] = {" separate", " in place", " fused", " fused in place"};

struct RopeArgs {
  TensorView q, k, qo, ko, pos;
  kvattn::RopeOptions opt;
};

void call(const RopeArgs& a) { kvattn::apply_rope(a.q, a.k, a.qo, a.ko, a.pos, a.opt); }

// Checks one output tensor against the rotated input values (`in`: dense [nnz][H][D], decoded
// before the call).
void check_rotated(const char* name, const TensorView& out, const std::vector<double>& in, const std::vector<int32_t>& pos,
                   int64_t H, int64_t D, const kvattn::RopeOptions& opt) {
  const int rd = opt.rotary_dim == 0 ? int(D) : opt.rotary_dim;
  const double u = 0x1p-24, uo = unit_roundoff(out.dtype());
  const kvattn::RopeConfig& cfg = opt;
  for (size_t r = 0; r < pos.size(); ++r)
    for (int64_t h = 0; h < H; ++h) {
      const double* x = &in[(r * size_t(H) + size_t(h)) * size_t(D)];
      std::vector<double> y(x, x + D);
      kvattn_test::ref::apply_rope(y.data(), rd, double(pos[r]), cfg);
      for (int64_t e = 0; e < D; ++e) {
        const double got = get(out, int64_t(r), h, e);
        double tol = 0;
        if (e < rd && pos[r] != 0) {
          // The pair of e and its angle.
          const int half = rd / 2;
          const int t = cfg.interleave ? int(e / 2) : int(e % half);
          const int i0 = cfg.interleave ? 2 * t : t, i1 = cfg.interleave ? 2 * t + 1 : t + half;
          const double a = std::abs(double(pos[r]) * kvattn_test::ref::rope_frequency(t, rd, cfg));
          tol = (std::abs(x[i0]) + std::abs(x[i1])) * (64 * u * a + 8 * u) + uo * std::abs(y[size_t(e)]) +
                subnormal_half(out.dtype());
        }
        // Past rotary_dim and at position 0: the input's value, exactly (its bits, as the dtype is the same).
        const double want = e < rd && pos[r] != 0 ? y[size_t(e)] : x[e];
        if (!(std::abs(got - want) <= tol))
          fail(name, "[", r, ", ", h, ", ", e, "] = ", got, ", expected ", want, " (allowed ", tol, ", pos ", pos[r],
               ", rotary_dim ", rd, ")");
      }
    }
}

}  // namespace

void fuzz_rope(Ctx& ctx) {
  Source& s = ctx.src;
  const int64_t nnz = s.range(0, 10), Hq = s.range(1, 4), Hk = s.range(1, 4);
  const int64_t D = s.pick<int64_t>({2, 4, 8, 16, 32, 64});
  const DType qt = s.pick(kComputeDtypes), kt = s.chance(60) ? qt : s.pick(kComputeDtypes);
  kvattn::RopeOptions opt;
  opt.rotary_dim = s.chance(50) ? 0 : int(2 * s.range(1, D / 2));
  opt.rope_scale = float(s.uniform(0.5, 4.0));
  opt.rope_theta = s.pick({1.0e4f, 5.0e5f, 100.0f});
  opt.interleave = s.coin();
  if (s.chance(30)) {
    kvattn::Llama31Scaling l;
    l.factor = float(s.uniform(1.0, 16.0));
    l.low_freq_factor = float(s.uniform(0.5, 2.0));
    l.high_freq_factor = l.low_freq_factor + float(s.uniform(0.5, 4.0));
    l.original_max_position = float(s.uniform(64.0, 8192.0));
    opt.llama31 = l;
  }
  const int layout = int(s.range(0, 3));  // separate, in place, fused QKV, fused QKV in place
  const bool fused = layout >= 2, in_place = layout == 1 || layout == 3;
  const DType kd = fused ? qt : kt;

  auto bufs = std::make_unique<std::array<HostTensor, 5>>();  // q, k, q_out, k_out, fused qkv
  HostTensor &qb = (*bufs)[0], &kb = (*bufs)[1], &qob = (*bufs)[2], &kob = (*bufs)[3], &fb = (*bufs)[4];
  RopeArgs a;
  a.opt = opt;
  if (fused) {
    fb = make_tensor(ctx, qt, {nnz, Hq + Hk + 1, D + s.range(0, 2)});
    const auto& st = fb.strides();
    a.q = TensorView(fb.base(), qt, {nnz, Hq, D}, {st[0], st[1], 1});
    a.k = TensorView(fb.base() + st[1] * Hq * int64_t(kvattn::dtype_size(qt)), qt, {nnz, Hk, D}, {st[0], st[1], 1});
  } else {
    qb = make_tensor(ctx, qt, {nnz, Hq, D});
    kb = make_tensor(ctx, kd, {nnz, Hk, D});
    a.q = qb.view();
    a.k = kb.view();
  }
  if (in_place) {
    a.qo = a.q;
    a.ko = a.k;
  } else {
    qob = make_tensor(ctx, qt, {nnz, Hq, D});
    kob = make_tensor(ctx, kd, {nnz, Hk, D});
    a.qo = qob.view();
    a.ko = kob.view();
  }
  std::vector<double> qin, kin;
  for (auto [v, dst] : {std::pair{&a.q, &qin}, std::pair{&a.k, &kin}})
    for (int64_t r = 0; r < nnz; ++r)
      for (int64_t h = 0; h < v->size(1); ++h)
        for (int64_t e = 0; e < D; ++e) {
          kvattn_test::encode(v->data(), v->dtype(), elem(*v, r, h, e), ctx.values.uniform(-2, 2));
          dst->push_back(get(*v, r, h, e));
        }
  std::vector<int32_t> pos;
  for (int64_t r = 0; r < nnz; ++r)
    pos.push_back(int32_t(ctx.values.coin(0.1) ? 0 : ctx.values.integer(ctx.values.coin(0.1) ? -64 : 0, 1023)));
  auto pos_t = std::make_unique<HostTensor>(int32_host(pos));
  a.pos = pos_t->view();
  for (const HostTensor* t : {&qb, &kb, &qob, &kob, &fb, pos_t.get()}) ctx.track(*t);
  ctx.note("apply_rope: nnz ", nnz, " heads ", Hq, "/", Hk, " D ", D, " rotary_dim ", opt.rotary_dim, " q ",
           dtype_str(qt), " k ", dtype_str(kd), " scale ", opt.rope_scale, " theta ", opt.rope_theta,
           opt.interleave ? " interleave" : "", opt.llama31 ? " llama31" : "",
           kLayoutNames[layout]);

  if (!ctx.corrupt) {
    const auto pos_before = pos_t->snapshot();
    const auto q_before = qb.snapshot(), k_before = kb.snapshot();
    expect_success(ctx, "apply_rope", [&] { call(a); });
    if (!pos_t->same_bytes(pos_before)) fail("apply_rope changed pos_ids");
    if (!in_place && !fused && (!qb.same_bytes(q_before) || !kb.same_bytes(k_before))) fail("apply_rope changed q or k");
    if (!in_place && fused)
      for (int64_t r = 0; r < nnz; ++r) {  // the inputs in the fused buffer are unchanged
        for (int64_t h = 0; h < Hq; ++h)
          for (int64_t e = 0; e < D; ++e)
            if (get(a.q, r, h, e) != qin[size_t((r * Hq + h) * D + e)]) fail("apply_rope changed q");
        for (int64_t h = 0; h < Hk; ++h)
          for (int64_t e = 0; e < D; ++e)
            if (get(a.k, r, h, e) != kin[size_t((r * Hk + h) * D + e)]) fail("apply_rope changed k");
      }
    if (fused)  // the fused buffer's other head and columns past D stay poison
      fb.for_each([&](int64_t off, const std::vector<int64_t>& idx) {
        if ((idx[1] >= Hq + Hk || idx[2] >= D) && !fb.is_poison_at(off))
          fail("apply_rope wrote the fused buffer outside q and k at ", kvattn_test::index_str(idx));
      });
    check_rotated("q_out", a.qo, qin, pos, Hq, D, opt);
    check_rotated("k_out", a.ko, kin, pos, Hk, D, opt);
    for (const HostTensor* t : {&qb, &kb, &qob, &kob, &fb})
      if (!t->shape().empty() && t->count_dirty_padding() != 0) fail("apply_rope wrote outside its views");
    return;
  }

  RopeArgs bad = a;
  RopeArgs* A = &bad;
  std::vector<Corruption> c;
  // q_out takes q's dtype and shape, k_out k's: each pair shares a target (two corruptions of one
  // pair could agree again).
  tensor_corruptions(ctx, c, "q", bad.q, {{qt}, true, {0, 1, 2}, false, "q"});
  tensor_corruptions(ctx, c, "k", bad.k, {{kd}, true, {0, 1, 2}, false, "k"});
  tensor_corruptions(ctx, c, "q_out", bad.qo, {{qt}, true, {0, 1, 2}, true, "q"});
  tensor_corruptions(ctx, c, "k_out", bad.ko, {{kd}, true, {0, 1, 2}, true, "k"});
  index_array_corruptions(ctx, c, "pos_ids", bad.pos, true);
  const int rd = opt.rotary_dim == 0 ? int(D) : opt.rotary_dim;
  const int bad_rd = int(s.pick<int64_t>({rd - 1, D + 2, -2, std::numeric_limits<int>::min()}));
  c.push_back({cat("rotary_dim = ", bad_rd), "rotary_dim", [A, bad_rd] { A->opt.rotary_dim = bad_rd; }});
  const int fcase = int(s.range(0, 5));
  const double fv = s.pick({0.0, -1.0, kNaN, kInf});
  c.push_back({cat("frequency field #", fcase, " = ", fv), "frequencies", [A, fcase, fv] {
                 kvattn::Llama31Scaling l = A->opt.llama31.value_or(kvattn::Llama31Scaling{});
                 switch (fcase) {
                   case 0: A->opt.rope_theta = float(fv); break;
                   case 1: A->opt.rope_scale = float(fv); break;
                   case 2: l.factor = float(fv); A->opt.llama31 = l; break;
                   case 3: l.high_freq_factor = l.low_freq_factor; A->opt.llama31 = l; break;
                   case 4: l.low_freq_factor = float(fv); A->opt.llama31 = l; break;
                   default: l.original_max_position = float(fv); A->opt.llama31 = l; break;
                 }
               }});
  if (nnz > 0) {
    c.push_back({"k_out aliases q", "k+q", [A] { A->ko = with_data(A->ko, A->q.data()); }});
    c.push_back({"q_out overlaps k", "q+k", [A] { A->qo = with_data(A->qo, A->k.data()); }});
    c.push_back({"k_out overlaps q_out", "q+k", [A] { A->ko = with_data(A->ko, A->qo.data()); }});
    c.push_back({"q_out partially overlaps q", "q", [A] {
                   A->qo = with_data(A->qo, static_cast<const char*>(A->q.data()) + kvattn::dtype_size(A->q.dtype()));
                 }});
    c.push_back({"pos_ids inside k_out", "pos_ids+k", [A] { A->pos = with_data(A->pos, A->ko.data()); }});
  }
  expect_rejection(ctx, [&] {
    ctx.apply_corruptions(c);
    call(bad);
  });
}

}  // namespace kvattn_fuzz
