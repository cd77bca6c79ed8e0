// The RoPE ops (kvattn/ops.h) on CUDA tensors: apply_rope, apply_rope_ragged and
// apply_rope_with_cos_sin_cache through the GPU kernels (kernels/rope/rope.cuh), on fresh random
// inputs, checked element by element:
//  - apply_rope against the float64 rotation (tests/reference, SEMANTICS.md "Rotary position
//    embedding"): f32/f16/bf16, rotate-half and interleaved, Llama 3.1 scaling, rope_scale and
//    rope_theta, partial rotary_dim, q and k as views of a fused QKV buffer (contiguous, padded with
//    odd strides: the scalar kernel, padded by 16-byte multiples: the vector kernel with strides),
//    strided device pos_ids, positions up to 2^24 (sincosf's slow argument reduction);
//  - apply_rope_with_cos_sin_cache (a random table, padded rows) bit for bit against the CPU
//    backend, and rows whose device position is outside the table left unwritten;
//  - apply_rope_ragged bit for bit against apply_rope at the positions it implies, rows outside the
//    batch left unwritten;
//  - in place equals out of place, and nothing outside q and k (the v heads, the padding) changes;
//  - q and k of different dtypes; empty inputs (no rows, no k heads, null pointers);
//  - the three ops captured in a CUDA graph and replayed;
//  - the host-side errors of CUDA calls (host or misaligned index arrays, mixed devices,
//    misaligned tensors, rotary_dim past the GPU limit), by message, nothing written;
//  - the launch shapes (cuda::choose_rope_launch) and kernel names, which need no GPU.
// GPU cases skip, saying why, where there is no CUDA device; GpuRopeLaunch.* and GpuRopeErrors.*
// run everywhere (without a device the calls fail on the host before any launch).
//
// Tolerances. apply_rope: as tests/ops_rope_test.cpp for the CPU. The kernel forms f_t in f32
// (CUDA's powf, the division by rope_scale, the Llama 3.1 blend that amplifies the relative error by
// up to ~7x): within 64 ulps, so the f32 angle a = float(pos) * f_t is off by at most
// 64 * 2^-24 * |a|; sincosf (2 ulps), the two products and the difference add a few ulps of
// |x0| + |x1|. So |err| <= (|x0| + |x1|) (64 * 2^-24 |a| + 8 * 2^-24) before the rounding to the
// dtype (half an ulp of |x'|, or half the subnormal spacing): with positions below 1024 at most
// ~4e-3 (|x0| + |x1|), while a wrong pairing, frequency, sign or position moves an element by
// O(|x|). Elements past rotary_dim and every element at position 0 come back bit for bit. The
// large-position case checks only the pair of f_0 = 1 (exact in f32, so a = pos exactly, an
// integer below 2^24), whose error is sincosf's alone: (|x0| + |x1|) 8 * 2^-24 for f32 values.
// The table form and the ragged form have no tolerance: the GPU rounds each product and the
// difference separately, as the CPU does, so equal inputs give equal bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ops_testing.h"
#include "reference/reference.h"
#include "support/device_mirror.h"
#include "support/expect_error.h"
#include "support/gpu_skip.h"
#include "support/host_tensor.h"
#include "support/random.h"

#if KVATTN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/rope_kernels.h"
#endif

namespace kvattn_test {
namespace {

using kvattn::DType;
using kvattn::TensorView;
using ops_test::Checker;

#if KVATTN_WITH_CUDA

constexpr kvattn::Device kCuda0 = kvattn::Device::cuda(0);
constexpr double kTwoPi = 6.283185307179586476925286766559;
const DType kDtypes[] = {DType::f32, DType::f16, DType::bf16};
std::string name(DType t) { return std::string(kvattn::dtype_name(t)); }

// ---- launch shapes and names (no GPU) -----------------------------------------------------------------
TEST(GpuRopeLaunch, ShapeIsAPureFunctionOfTheProblem) {
  namespace cu = kvattn::cuda;
  // Llama-3-8B: 4096 rows x (32 + 8) heads x 8 pieces (bf16, rotate-half, head dim 128) on 132 SMs:
  // 4 rows per CTA (1280 items, 5 per thread), 1024 CTAs, 4 x (128 floats + a flag) of shared memory.
  cu::RopeLaunch l = cu::choose_rope_launch(4096, 40 * 8, 128, 132);
  EXPECT_EQ(l.tokens_per_block, 4);
  EXPECT_EQ(l.blocks, 1024);
  EXPECT_EQ(l.smem_bytes, 4 * (128 * 4 + 4));
  // A decode step: one row per CTA, so that the few rows spread over the SMs.
  l = cu::choose_rope_launch(64, 40 * 8, 128, 132);
  EXPECT_EQ(l.tokens_per_block, 1);
  EXPECT_EQ(l.blocks, 64);
  // One head of 8 pieces: many rows per CTA, at most 64, and at least two CTAs per SM.
  EXPECT_EQ(cu::choose_rope_launch(1 << 20, 8, 128, 132).tokens_per_block, 64);
  EXPECT_EQ(cu::choose_rope_launch(1000, 8, 128, 132).tokens_per_block, 4);
  // The cos/sin rows fit in 48 KB: rotary_dim 8192 takes one row per CTA.
  l = cu::choose_rope_launch(4096, 2, 8192, 132);
  EXPECT_EQ(l.tokens_per_block, 1);
  EXPECT_LE(l.smem_bytes, 48 * 1024);
  EXPECT_EQ(cu::choose_rope_launch(0, 320, 128, 132).blocks, 0);
  // The kernels' names spell their configuration, and differ.
  cu::RopeKernelConfig c;
  EXPECT_EQ(c.name(), "rope_bf16_half_computed_vec16");
  c.dtype = DType::f16, c.pairs = kvattn::kernels::RopePairs::interleaved, c.cos_sin = kvattn::kernels::RopeCosSin::table,
  c.vector_bytes = 0;
  EXPECT_EQ(c.name(), "rope_f16_interleaved_table_scalar");
  EXPECT_EQ(cu::rope_spec(c, "sm_80").entry, "kvattn_rope_f16_interleaved_table_scalar");
  // 16-byte pieces need the head dim and the split points on whole vectors.
  using kvattn::kernels::RopePairs;
  EXPECT_TRUE(cu::rope_vectorizable(RopePairs::rotate_half, 128, 128, 8));
  EXPECT_FALSE(cu::rope_vectorizable(RopePairs::rotate_half, 128, 40, 8));  // partner 20 elements on
  EXPECT_TRUE(cu::rope_vectorizable(RopePairs::interleaved, 128, 40, 8));
  EXPECT_FALSE(cu::rope_vectorizable(RopePairs::interleaved, 100, 40, 8));
  EXPECT_TRUE(cu::rope_vectorizable(RopePairs::rotate_half, 64, 32, 4));
}

// ---- buffers -------------------------------------------------------------------------------------------
// How the fused [nnz, Hq + 2 Hk, D] buffer that q and k are views of is stored.
enum class Layout { contiguous, padded, padded_aligned };
const Layout kLayouts[] = {Layout::contiguous, Layout::padded, Layout::padded_aligned};
std::string layout_name(Layout l) {
  return l == Layout::contiguous ? "contiguous" : l == Layout::padded ? "padded (scalar)" : "padded (aligned)";
}

HostTensor make(DType t, std::vector<int64_t> shape, Layout l) {
  const int64_t a = 16 / int64_t(kvattn::dtype_size(t));
  std::vector<int64_t> pad(shape.size(), 0);
  int64_t guard = 0;
  if (l == Layout::padded) {
    for (size_t d = 0; d + 1 < shape.size(); ++d) pad[d] = 1 + int64_t(d % 3);
    guard = 5;
  } else if (l == Layout::padded_aligned) {
    for (size_t d = 0; d + 1 < shape.size(); ++d) pad[d] = a * int64_t(1 + d % 2);
    guard = a;
  }
  HostTensor h(t, std::move(shape), pad, guard);
  h.poison();
  return h;
}

// q (heads [0, Hq)), k (heads [Hq, Hq + Hk)) and v of one fused buffer, random in [-2, 2]; the
// padding stays poisoned.
struct Fused {
  int64_t nnz;
  int Hq, Hk, D;
  HostTensor t;
  Fused(DType dt, int64_t n, int hq, int hk, int d, Layout l, Rng& rng)
      : nnz(n), Hq(hq), Hk(hk), D(d), t(make(dt, {n, hq + 2 * hk, d}, l)) {
    t.for_each([&](int64_t off, const std::vector<int64_t>&) { t.set_at(off, rng.uniform(-2, 2)); });
  }
  int64_t off(int64_t r, int head, int e) const { return t.offset({r, head, e}); }
  TensorView side(void* base, bool is_k, kvattn::Device dev) const {
    char* p = static_cast<char*>(base) + (is_k ? Hq : 0) * t.strides()[1] * int64_t(kvattn::dtype_size(t.dtype()));
    return TensorView(p, t.dtype(), {nnz, is_k ? Hk : Hq, D}, {t.strides()[0], t.strides()[1], 1}, dev);
  }
  TensorView q(const DeviceMirror& m) const { return side(m.view().data(), false, kCuda0); }
  TensorView k(const DeviceMirror& m) const { return side(m.view().data(), true, kCuda0); }
  TensorView host_q() { return side(t.base(), false, kvattn::Device::cpu()); }
  TensorView host_k() { return side(t.base(), true, kvattn::Device::cpu()); }
};

uint32_t bits_at(const HostTensor& t, int64_t off) {
  uint32_t u = 0;
  const size_t esz = kvattn::dtype_size(t.dtype());
  std::memcpy(&u, t.raw_bytes().data() + t.view_byte_offset() + off * int64_t(esz), esz);
  return u;
}

// An int32 [n] array on the device, at element stride `stride` (the elements between are -7).
struct DeviceInts {
  HostTensor h;
  std::unique_ptr<DeviceMirror> m;
  int64_t n, stride;
  DeviceInts(const std::vector<int32_t>& v, int64_t stride_ = 1)
      : h(DType::i32, {std::max<int64_t>(int64_t(v.size()) * stride_, 1)}), n(int64_t(v.size())), stride(stride_) {
    for (int64_t i = 0; i < h.numel(); ++i) h.set_at(i, -7);
    for (int64_t i = 0; i < n; ++i) h.set_at(i * stride, v[size_t(i)]);
    m = std::make_unique<DeviceMirror>(h);
  }
  TensorView view() const { return TensorView(m->view().data(), DType::i32, {n}, {stride}, kCuda0); }
};

std::vector<int32_t> random_positions(Rng& rng, int64_t n, int64_t hi) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& x : p) x = int32_t(rng.integer(0, hi));
  if (n > 0) p[0] = 0;
  if (n > 1) p[size_t(n - 1)] = int32_t(hi);
  return p;
}

// ---- the float64 reference and its tolerance ---------------------------------------------------------------
struct RopeRef {
  int rotary_dim;
  kvattn::RopeOptions opt;
  double freq(int t) const {
    double f = std::pow(double(opt.rope_theta), -2.0 * t / rotary_dim) / opt.rope_scale;
    if (!opt.llama31) return f;
    const auto& l = *opt.llama31;
    const double wl = kTwoPi / f;
    if (wl < l.original_max_position / l.high_freq_factor) return f;
    if (wl > l.original_max_position / l.low_freq_factor) return f / l.factor;
    const double g = (l.original_max_position / wl - l.low_freq_factor) / (l.high_freq_factor - l.low_freq_factor);
    return (1 - g) * f / l.factor + g * f;
  }
};

// Checks out [nnz, H, D] (a host copy) against the rotation of heads [head0, head0 + H) of `in`.
void check_rotation(Checker& c, const HostTensor& out, const Fused& in, int head0, int H,
                    const std::vector<int32_t>& pos, const RopeRef& ref, const char* side) {
  const int D = in.D, rd = ref.rotary_dim, half = rd / 2;
  const DType t = in.t.dtype();
  std::vector<double> x(static_cast<size_t>(rd));
  for (int64_t r = 0; r < in.nnz; ++r)
    for (int h = 0; h < H; ++h) {
      for (int e = 0; e < rd; ++e) x[size_t(e)] = in.t.get_at(in.off(r, head0 + h, e));
      std::vector<double> y = x;
      kvattn_test::ref::apply_rope(y.data(), rd, double(pos[size_t(r)]), ref.opt);
      for (int e = 0; e < D; ++e) {
        const int64_t oi = out.offset({r, h, e}), ii = in.off(r, head0 + h, e);
        const std::string where = std::string(side) + index_str({r, h, e}) + " pos " + std::to_string(pos[size_t(r)]);
        if (e >= rd || pos[size_t(r)] == 0) {
          c.exact(bits_at(out, oi), bits_at(in.t, ii), where);
          continue;
        }
        const int tt = ref.opt.interleave ? e / 2 : e % half;
        const int i0 = ref.opt.interleave ? 2 * tt : tt, i1 = ref.opt.interleave ? 2 * tt + 1 : tt + half;
        const double a = double(pos[size_t(r)]) * ref.freq(tt);
        const double tol = (std::fabs(x[size_t(i0)]) + std::fabs(x[size_t(i1)])) * (64 * 0x1p-24 * std::fabs(a) + 8 * 0x1p-24);
        const double want = y[size_t(e)];
        c.close(out.get_at(oi), want,
                tol + ops_test::unit_roundoff(t) * (std::fabs(want) + tol) + ops_test::half_subnormal_spacing(t), where);
      }
    }
}

// Every byte of `after` outside q's and k's heads equals `before` (the v heads and the padding).
void check_rest_untouched(Checker& c, const Fused& before, const HostTensor& after) {
  const size_t esz = kvattn::dtype_size(before.t.dtype());
  std::vector<bool> qk(before.t.raw_bytes().size(), false);
  for (int64_t r = 0; r < before.nnz; ++r)
    for (int h = 0; h < before.Hq + before.Hk; ++h)
      for (int e = 0; e < before.D; ++e) {
        const size_t at = size_t(before.t.view_byte_offset() + before.off(r, h, e) * int64_t(esz));
        for (size_t b = 0; b < esz; ++b) qk[at + b] = true;
      }
  int64_t changed = 0;
  for (size_t i = 0; i < qk.size(); ++i) changed += !qk[i] && before.t.raw_bytes()[i] != after.raw_bytes()[i];
  c.truth(changed == 0, "bytes outside q and k changed: " + std::to_string(changed));
}

// ---- apply_rope ----------------------------------------------------------------------------------------
TEST(GpuRope, MatchesFloat64ReferenceEveryDtypeLayoutAndOption) {
  SKIP_WITHOUT_GPU();
  const int D = 64, Hq = 4, Hk = 2;
  for (DType t : kDtypes)
    for (Layout l : kLayouts)
      for (bool interleave : {false, true})
        for (bool llama : {false, true})
          for (int rd : {0, 32, 10}) {
            KVATTN_CASE_RNG(rng);
            kvattn::RopeOptions opt;
            opt.interleave = interleave;
            opt.rotary_dim = rd;
            opt.rope_theta = llama ? 5e5f : 1e4f;
            opt.rope_scale = rd == 10 ? 2.5f : 1.0f;
            if (llama) opt.llama31 = kvattn::Llama31Scaling{8, 1, 4, 256};  // all three frequency regions
            SCOPED_TRACE(name(t) + ", " + layout_name(l) + (interleave ? ", interleaved" : ", rotate-half") +
                         (llama ? ", llama31" : "") + ", rotary_dim " + std::to_string(rd));
            const int64_t nnz = 37;
            Fused in(t, nnz, Hq, Hk, D, l, rng);
            HostTensor qo = make(t, {nnz, Hq, D}, l), ko = make(t, {nnz, Hk, D}, Layout::contiguous);
            const auto pos = random_positions(rng, nnz, 1023);
            DeviceMirror din(in.t), dqo(qo), dko(ko);
            DeviceInts dpos(pos, rd == 10 ? 3 : 1);  // a strided pos_ids too
            kvattn::apply_rope(in.q(din), in.k(din), dqo.view(), dko.view(), dpos.view(), opt);
            device_synchronize();
            HostTensor in_after = in.t;
            dqo.copy_back(qo);
            dko.copy_back(ko);
            din.copy_back(in_after);
            Checker c("apply_rope on the GPU");
            const RopeRef ref{rd == 0 ? D : rd, opt};
            check_rotation(c, qo, in, 0, Hq, pos, ref, "q");
            check_rotation(c, ko, in, Hq, Hk, pos, ref, "k");
            c.truth(in_after.same_bytes(in.t.raw_bytes()), "the input buffer changed");
            c.truth(qo.count_dirty_padding() == 0 && ko.count_dirty_padding() == 0, "a write outside the outputs");
            EXPECT_TRUE(c.result());
          }
}

// Positions up to 2^24 (sincosf's Payne-Hanek reduction past |a| ~ 1e5): the pair of f_0 = 1, whose
// angle is the position itself, within sincosf's error; the other pairs within the general bound.
TEST(GpuRope, LargePositionsRotateByTheAccurateSinCos) {
  SKIP_WITHOUT_GPU();
  KVATTN_CASE_RNG(rng);
  const int64_t nnz = 64;
  const int D = 32, Hq = 2, Hk = 1;
  for (bool interleave : {false, true}) {
    Fused in(DType::f32, nnz, Hq, Hk, D, Layout::contiguous, rng);
    HostTensor qo = make(DType::f32, {nnz, Hq, D}, Layout::contiguous), ko = make(DType::f32, {nnz, Hk, D}, Layout::contiguous);
    std::vector<int32_t> pos(static_cast<size_t>(nnz));
    for (auto& p : pos) p = int32_t(rng.integer(100000, 1 << 24));
    DeviceMirror din(in.t), dqo(qo), dko(ko);
    DeviceInts dpos(pos);
    kvattn::RopeOptions opt;
    opt.interleave = interleave;
    kvattn::apply_rope(in.q(din), in.k(din), dqo.view(), dko.view(), dpos.view(), opt);
    device_synchronize();
    dqo.copy_back(qo);
    dko.copy_back(ko);
    Checker c(interleave ? "large positions, interleaved" : "large positions, rotate-half");
    const int i1 = interleave ? 1 : D / 2;
    for (int64_t r = 0; r < nnz; ++r)
      for (int h = 0; h < Hq + Hk; ++h) {
        const HostTensor& out = h < Hq ? qo : ko;
        const int oh = h < Hq ? h : h - Hq;
        const double x0 = in.t.get_at(in.off(r, h, 0)), x1 = in.t.get_at(in.off(r, h, i1));
        const double a = double(pos[size_t(r)]), tol = (std::fabs(x0) + std::fabs(x1)) * 8 * 0x1p-24;
        c.close(out.get({r, oh, 0}), x0 * std::cos(a) - x1 * std::sin(a), tol, "x'[0]" + index_str({r, h}));
        c.close(out.get({r, oh, int64_t(i1)}), x1 * std::cos(a) + x0 * std::sin(a), tol, "x'[i1]" + index_str({r, h}));
      }
    EXPECT_TRUE(c.result());
  }
}

// q in f32 and k in bf16: one launch per dtype, each side against the reference.
TEST(GpuRope, QAndKOfDifferentDtypes) {
  SKIP_WITHOUT_GPU();
  KVATTN_CASE_RNG(rng);
  const int64_t nnz = 21;
  const int D = 64;
  Fused qin(DType::f32, nnz, 3, 0, D, Layout::contiguous, rng), kin(DType::bf16, nnz, 2, 0, D, Layout::padded_aligned, rng);
  HostTensor qo = make(DType::f32, {nnz, 3, D}, Layout::contiguous), ko = make(DType::bf16, {nnz, 2, D}, Layout::contiguous);
  const auto pos = random_positions(rng, nnz, 1023);
  DeviceMirror dq(qin.t), dk(kin.t), dqo(qo), dko(ko);
  DeviceInts dpos(pos);
  kvattn::RopeOptions opt;
  opt.rotary_dim = 48;
  kvattn::apply_rope(qin.q(dq), kin.q(dk), dqo.view(), dko.view(), dpos.view(), opt);
  device_synchronize();
  dqo.copy_back(qo);
  dko.copy_back(ko);
  Checker c("mixed dtypes");
  check_rotation(c, qo, qin, 0, 3, pos, {48, opt}, "q");
  check_rotation(c, ko, kin, 0, 2, pos, {48, opt}, "k");
  EXPECT_TRUE(c.result());
}

// In place (q_out = q, k_out = k in the fused buffer) gives the out-of-place bits and leaves the v
// heads and the padding alone; for every op, both layouts and partial rotary_dim (the tail is not
// rewritten in place).
TEST(GpuRope, InPlaceEqualsOutOfPlaceAndLeavesTheRestAlone) {
  SKIP_WITHOUT_GPU();
  const int D = 64, Hq = 4, Hk = 2;
  for (DType t : kDtypes)
    for (Layout l : {Layout::contiguous, Layout::padded, Layout::padded_aligned})
      for (bool interleave : {false, true})
        for (int op = 0; op < 3; ++op) {  // apply_rope, ragged, table
          KVATTN_CASE_RNG(rng);
          SCOPED_TRACE(name(t) + ", " + layout_name(l) + (interleave ? ", interleaved" : "") + ", op " + std::to_string(op));
          const int64_t nnz = 29;
          Fused in(t, nnz, Hq, Hk, D, l, rng);
          HostTensor qo = make(t, {nnz, Hq, D}, Layout::contiguous), ko = make(t, {nnz, Hk, D}, Layout::contiguous);
          std::vector<int32_t> pos(static_cast<size_t>(nnz)), indptr = {0, 10, 10, int32_t(nnz)}, offsets = {3, 50, 700};
          for (int64_t r = 0; r < nnz; ++r) pos[size_t(r)] = r < 10 ? int32_t(3 + r) : int32_t(700 + r - 10);
          HostTensor table = make(DType::f32, {1024, 48}, Layout::padded);
          table.for_each([&](int64_t off, const std::vector<int64_t>&) { table.set_at(off, rng.uniform(-1, 1)); });
          DeviceMirror din(in.t), dqo(qo), dko(ko), dtab(table);
          DeviceInts dpos(pos), dind(indptr), doff(offsets);
          kvattn::RopeOptions opt;
          opt.interleave = interleave;
          opt.rotary_dim = 48;
          auto run = [&](const TensorView& q, const TensorView& k, const TensorView& q_out, const TensorView& k_out) {
            if (op == 0) kvattn::apply_rope(q, k, q_out, k_out, dpos.view(), opt);
            if (op == 1) kvattn::apply_rope_ragged(q, k, q_out, k_out, dind.view(), doff.view(), opt);
            if (op == 2) kvattn::apply_rope_with_cos_sin_cache(q, k, q_out, k_out, dpos.view(), dtab.view(), interleave);
          };
          run(in.q(din), in.k(din), dqo.view(), dko.view());
          run(in.q(din), in.k(din), in.q(din), in.k(din));
          device_synchronize();
          HostTensor after = in.t;
          dqo.copy_back(qo);
          dko.copy_back(ko);
          din.copy_back(after);
          Checker c("in place vs out of place");
          for (int64_t r = 0; r < nnz; ++r)
            for (int e = 0; e < D; ++e) {
              for (int h = 0; h < Hq; ++h)
                c.exact(bits_at(after, in.off(r, h, e)), bits_at(qo, qo.offset({r, h, e})), "q" + index_str({r, h, e}));
              for (int h = 0; h < Hk; ++h)
                c.exact(bits_at(after, in.off(r, Hq + h, e)), bits_at(ko, ko.offset({r, h, e})), "k" + index_str({r, h, e}));
            }
          check_rest_untouched(c, in, after);
          EXPECT_TRUE(c.result());
        }
}

// ---- apply_rope_ragged ---------------------------------------------------------------------------------
// The ragged positions (empty requests, negative offsets) give apply_rope's bits at those
// positions; rows past indptr[B] are not written; a row the device indptr cannot place
// (decreasing entries) is skipped too.
TEST(GpuRope, RaggedEqualsPosIdsAndSkipsRowsOutsideTheBatch) {
  SKIP_WITHOUT_GPU();
  for (DType t : kDtypes)
    for (bool interleave : {false, true}) {
      KVATTN_CASE_RNG(rng);
      SCOPED_TRACE(name(t) + (interleave ? ", interleaved" : ""));
      std::vector<int32_t> indptr = {0}, offsets, pos;
      for (int b = 0; b < 7; ++b) {
        const int len = b == 3 ? 0 : int(rng.integer(1, 9));
        offsets.push_back(int32_t(rng.integer(-20, 5000)));
        for (int i = 0; i < len; ++i) pos.push_back(offsets.back() + i);
        indptr.push_back(indptr.back() + len);
      }
      const int64_t covered = indptr.back(), nnz = covered + 5;  // 5 rows past the batch
      pos.resize(size_t(nnz), 0);
      const int D = 128, Hq = 4, Hk = 2;
      Fused in(t, nnz, Hq, Hk, D, Layout::contiguous, rng);
      HostTensor qa = make(t, {nnz, Hq, D}, Layout::contiguous), ka = make(t, {nnz, Hk, D}, Layout::contiguous);
      HostTensor qb = qa, kb = ka;
      DeviceMirror din(in.t), dqa(qa), dka(ka), dqb(qb), dkb(kb);
      DeviceInts dpos(pos), dind(indptr), doff(offsets);
      kvattn::RopeOptions opt;
      opt.interleave = interleave;
      opt.llama31 = kvattn::Llama31Scaling{};
      opt.rope_theta = 5e5f;
      kvattn::apply_rope(in.q(din), in.k(din), dqa.view(), dka.view(), dpos.view(), opt);
      kvattn::apply_rope_ragged(in.q(din), in.k(din), dqb.view(), dkb.view(), dind.view(), doff.view(), opt);
      device_synchronize();
      for (auto [d, h] : {std::pair{&dqa, &qa}, std::pair{&dka, &ka}, std::pair{&dqb, &qb}, std::pair{&dkb, &kb}}) d->copy_back(*h);
      Checker c("ragged vs pos_ids");
      for (auto [a, b, H] : {std::tuple{&qa, &qb, Hq}, std::tuple{&ka, &kb, Hk}})
        for (int64_t r = 0; r < nnz; ++r)
          for (int h = 0; h < H; ++h)
            for (int e = 0; e < D; ++e) {
              const int64_t o = a->offset({r, h, e});
              if (r < covered) c.exact(bits_at(*b, o), bits_at(*a, o), "row " + std::to_string(r));
              else c.truth(b->is_poison_at(o), "row " + std::to_string(r) + " past the batch was written");
            }
      EXPECT_TRUE(c.result());
      // A decreasing device indptr: the rows its binary search cannot place are left alone, the
      // others are rotated (no read or write outside the tensors either way).
      std::vector<int32_t> bad = {0, 8, 4, int32_t(covered)};
      DeviceInts dbad(bad), dboff({0, 100, 200});
      qb.poison();
      dqb.upload();
      kvattn::apply_rope_ragged(in.q(din), in.k(din), dqb.view(), dkb.view(), dbad.view(), dboff.view(), opt);
      device_synchronize();
      dqb.copy_back(qb);
      EXPECT_EQ(qb.count_dirty_padding(), 0);
    }
}

// ---- apply_rope_with_cos_sin_cache ---------------------------------------------------------------------
// A random table with padded rows: the GPU writes the CPU backend's bits, for every dtype, layout
// and rotary_dim (the vector and scalar kernels).
TEST(GpuRope, CosSinTableGivesTheCpuBitsEveryDtypeAndLayout) {
  SKIP_WITHOUT_GPU();
  const int D = 64, Hq = 4, Hk = 2;
  for (DType t : kDtypes)
    for (Layout l : kLayouts)
      for (bool interleave : {false, true})
        for (int rd : {64, 32, 10}) {
          KVATTN_CASE_RNG(rng);
          SCOPED_TRACE(name(t) + ", " + layout_name(l) + (interleave ? ", interleaved" : ", rotate-half") +
                       ", rotary_dim " + std::to_string(rd));
          const int64_t nnz = 33, rows = 300;
          Fused in(t, nnz, Hq, Hk, D, l, rng);
          HostTensor table = make(DType::f32, {rows, rd}, l == Layout::contiguous ? Layout::contiguous : Layout::padded);
          table.for_each([&](int64_t off, const std::vector<int64_t>&) { table.set_at(off, rng.uniform(-1, 1)); });
          HostTensor qo = make(t, {nnz, Hq, D}, l), ko = make(t, {nnz, Hk, D}, Layout::contiguous);
          HostTensor cq = qo, ck = ko;  // the CPU's
          const auto pos = random_positions(rng, nnz, rows - 1);
          std::vector<int32_t> host_pos = pos;
          kvattn::apply_rope_with_cos_sin_cache(in.host_q(), in.host_k(), cq.view(), ck.view(), ops_test::i32_view(host_pos),
                                                table.view(), interleave);
          DeviceMirror din(in.t), dtab(table), dqo(qo), dko(ko);
          DeviceInts dpos(pos, 2);
          kvattn::apply_rope_with_cos_sin_cache(in.q(din), in.k(din), dqo.view(), dko.view(), dpos.view(), dtab.view(), interleave);
          device_synchronize();
          dqo.copy_back(qo);
          dko.copy_back(ko);
          Checker c("table: GPU vs CPU bits");
          c.truth(qo.same_bytes(cq.raw_bytes()), "q_out differs from the CPU's");
          c.truth(ko.same_bytes(ck.raw_bytes()), "k_out differs from the CPU's");
          EXPECT_TRUE(c.result());
          if (!qo.same_bytes(cq.raw_bytes())) {  // say where
            Checker d("first differences");
            qo.for_each([&](int64_t off, const std::vector<int64_t>& i) { d.exact(qo.get_at(off), cq.get_at(off), "q" + index_str(i)); });
            EXPECT_TRUE(d.result());
          }
        }
}

// Rows whose device position is outside [0, rows of the table) are skipped: their outputs keep
// their poison; the other rows are rotated.
TEST(GpuRope, CosSinTableSkipsRowsWithPositionsOutsideTheTable) {
  SKIP_WITHOUT_GPU();
  KVATTN_CASE_RNG(rng);
  const int64_t nnz = 12, rows = 50;
  const int D = 128, Hq = 2, Hk = 1;
  Fused in(DType::bf16, nnz, Hq, Hk, D, Layout::contiguous, rng);
  HostTensor table = make(DType::f32, {rows, D}, Layout::contiguous);
  table.for_each([&](int64_t off, const std::vector<int64_t>&) { table.set_at(off, rng.uniform(-1, 1)); });
  HostTensor qo = make(DType::bf16, {nnz, Hq, D}, Layout::contiguous), ko = make(DType::bf16, {nnz, Hk, D}, Layout::contiguous);
  std::vector<int32_t> pos = {0, 49, 50, -1, 7, 1 << 30, 3, -2147483647 - 1, 2147483647, 12, 25, 49};
  const std::vector<bool> skipped = {false, false, true, true, false, true, false, true, true, false, false, false};
  DeviceMirror din(in.t), dtab(table), dqo(qo), dko(ko);
  DeviceInts dpos(pos);
  kvattn::apply_rope_with_cos_sin_cache(in.q(din), in.k(din), dqo.view(), dko.view(), dpos.view(), dtab.view());
  device_synchronize();
  dqo.copy_back(qo);
  dko.copy_back(ko);
  Checker c("out-of-range positions");
  for (int64_t r = 0; r < nnz; ++r)
    for (int e = 0; e < D; ++e) {
      for (int h = 0; h < Hq; ++h) c.truth(qo.is_poison_at(qo.offset({r, h, e})) == skipped[size_t(r)], "q" + index_str({r, h, e}));
      for (int h = 0; h < Hk; ++h) c.truth(ko.is_poison_at(ko.offset({r, h, e})) == skipped[size_t(r)], "k" + index_str({r, h, e}));
    }
  EXPECT_TRUE(c.result());
}

// ---- empty inputs --------------------------------------------------------------------------------------
TEST(GpuRope, EmptyInputsLaunchNothingAndSucceed) {
  SKIP_WITHOUT_GPU();
  KVATTN_CASE_RNG(rng);
  // No rows, null pointers.
  const TensorView q0(nullptr, DType::bf16, {0, 4, 64}, kCuda0), k0(nullptr, DType::bf16, {0, 2, 64}, kCuda0);
  const TensorView p0(nullptr, DType::i32, {0}, kCuda0), table(nullptr, DType::f32, {0, 64}, kCuda0);
  EXPECT_NO_THROW(kvattn::apply_rope(q0, k0, q0, k0, p0));
  EXPECT_NO_THROW(kvattn::apply_rope_with_cos_sin_cache(q0, k0, q0, k0, p0, table));
  DeviceInts ind({0});
  EXPECT_NO_THROW(kvattn::apply_rope_ragged(q0, k0, q0, k0, ind.view(), TensorView(nullptr, DType::i32, {0}, kCuda0)));
  // Rows but no k heads: q is rotated.
  const int64_t nnz = 9;
  Fused in(DType::bf16, nnz, 2, 0, 64, Layout::contiguous, rng);
  HostTensor qo = make(DType::bf16, {nnz, 2, 64}, Layout::contiguous);
  const auto pos = random_positions(rng, nnz, 500);
  DeviceMirror din(in.t), dqo(qo);
  DeviceInts dpos(pos);
  const TensorView kn(nullptr, DType::bf16, {nnz, 0, 64}, kCuda0);
  kvattn::apply_rope(in.q(din), kn, dqo.view(), kn, dpos.view());
  device_synchronize();
  dqo.copy_back(qo);
  Checker c("no k heads");
  check_rotation(c, qo, in, 0, 2, pos, {64, {}}, "q");
  EXPECT_TRUE(c.result());
}

// ---- CUDA graphs ---------------------------------------------------------------------------------------
// The three ops captured on a stream after a warm-up call each, replayed twice into re-poisoned
// outputs: the eager results, bit for bit.
TEST(GpuRope, OpsAreGraphCapturable) {
  SKIP_WITHOUT_GPU();
  KVATTN_CASE_RNG(rng);
  const int64_t nnz = 40;
  const int D = 128, Hq = 8, Hk = 2;
  Fused in(DType::bf16, nnz, Hq, Hk, D, Layout::contiguous, rng);
  HostTensor table = make(DType::f32, {64, D}, Layout::contiguous);
  table.for_each([&](int64_t off, const std::vector<int64_t>&) { table.set_at(off, rng.uniform(-1, 1)); });
  std::vector<HostTensor> outs;
  for (int i = 0; i < 3; ++i) {
    outs.push_back(make(DType::bf16, {nnz, Hq, D}, Layout::contiguous));
    outs.push_back(make(DType::bf16, {nnz, Hk, D}, Layout::contiguous));
  }
  std::vector<std::unique_ptr<DeviceMirror>> douts;
  for (const auto& o : outs) douts.push_back(std::make_unique<DeviceMirror>(o));
  const auto pos = random_positions(rng, nnz, 63);
  DeviceMirror din(in.t), dtab(table);
  DeviceInts dpos(pos), dind({0, 13, 40}), doff({5, 0});
  kvattn::RopeOptions opt;
  opt.llama31 = kvattn::Llama31Scaling{};
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  device_synchronize();
  auto ops = [&] {
    kvattn::apply_rope(in.q(din), in.k(din), douts[0]->view(), douts[1]->view(), dpos.view(), opt, stream);
    kvattn::apply_rope_ragged(in.q(din), in.k(din), douts[2]->view(), douts[3]->view(), dind.view(), doff.view(), opt, stream);
    kvattn::apply_rope_with_cos_sin_cache(in.q(din), in.k(din), douts[4]->view(), douts[5]->view(), dpos.view(), dtab.view(),
                                          true, stream);
  };
  ops();  // warm-up: compiles / loads the kernels outside the capture
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<HostTensor> eager = outs;
  for (size_t i = 0; i < outs.size(); ++i) douts[i]->copy_back(eager[i]);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  ops();
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    for (size_t i = 0; i < outs.size(); ++i) douts[i]->upload();  // poisoned again
    device_synchronize();
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (size_t i = 0; i < outs.size(); ++i) {
      HostTensor got = outs[i];
      douts[i]->copy_back(got);
      EXPECT_TRUE(got.same_bytes(eager[i].raw_bytes())) << "output " << i;
      EXPECT_FALSE(got.same_bytes(outs[i].raw_bytes())) << "output " << i << " was not written";
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// ---- host-side errors of CUDA calls ---------------------------------------------------------------------
// Memory that a cuda:0 view may point at: real device memory where there is a device, else a host
// buffer (every call below fails on the host before anything could touch it).
class Cuda0Buffer {
 public:
  explicit Cuda0Buffer(size_t bytes) : host_(bytes + 64, 0) {
    if (gpu_available()) dev_ = std::make_unique<DeviceBytes>(int64_t(bytes + 64));
  }
  char* at(size_t offset = 0) const {  // a 16-byte-aligned start plus `offset` bytes
    char* base = dev_ ? static_cast<char*>(dev_->view().data()) : const_cast<char*>(host_.data());
    auto a = reinterpret_cast<uintptr_t>(base);
    return reinterpret_cast<char*>((a + 15) / 16 * 16) + offset;
  }
  std::vector<uint8_t> bytes(size_t n) const {
    std::vector<uint8_t> out(n);
    if (dev_) EXPECT_EQ(cudaMemcpy(out.data(), at(), n, cudaMemcpyDeviceToHost), cudaSuccess);
    else std::memcpy(out.data(), at(), n);
    return out;
  }

 private:
  std::vector<char> host_;
  std::unique_ptr<DeviceBytes> dev_;
};

TEST(GpuRopeErrors, ArgumentsAreCheckedOnTheHostByMessage) {
  const int64_t n = 4, Hq = 2, Hk = 1, D = 64;
  Cuda0Buffer qb(n * Hq * D * 4 + 64), kb(n * Hk * D * 4 + 64), qob(n * Hq * D * 4), kob(n * Hk * D * 4), idx(256),
      tab(64 * D * 4 + 64);
  const auto qo_before = qob.bytes(n * Hq * D * 4), ko_before = kob.bytes(n * Hk * D * 4);
  auto Q = [&](size_t off = 0, DType t = DType::bf16) { return TensorView(qb.at(off), t, {n, Hq, D}, kCuda0); };
  auto K = [&](size_t off = 0) { return TensorView(kb.at(off), DType::bf16, {n, Hk, D}, kCuda0); };
  const TensorView QO(qob.at(), DType::bf16, {n, Hq, D}, kCuda0), KO(kob.at(), DType::bf16, {n, Hk, D}, kCuda0);
  auto I = [&](size_t off, int64_t len, DType t = DType::i32) { return TensorView(idx.at(off), t, {len}, kCuda0); };
  const TensorView P = I(0, n), T(tab.at(), DType::f32, {64, D}, kCuda0);
  std::vector<int32_t> host_pos = {0, 1, 2, 3};
  const TensorView HP(host_pos.data(), DType::i32, {n});
  // Index arrays on the host with CUDA tensors: rejected, nothing copied.
  EXPECT_KVATTN_ERROR(kvattn::apply_rope(Q(), K(), QO, KO, HP),
                      "pos_ids is on cpu but q is on cuda:0; with CUDA tensors, pos_ids is an int32 tensor on q's device");
  EXPECT_KVATTN_ERROR(kvattn::apply_rope_with_cos_sin_cache(Q(), K(), QO, KO, HP, T), "pos_ids is on cpu but q is on cuda:0");
  EXPECT_KVATTN_ERROR(kvattn::apply_rope_ragged(Q(), K(), QO, KO, TensorView(host_pos.data(), DType::i32, {3}), I(32, 2)),
                      "indptr is on cpu but q is on cuda:0");
  EXPECT_KVATTN_ERROR(kvattn::apply_rope_with_cos_sin_cache(Q(), K(), QO, KO, P, TensorView(tab.at(), DType::f32, {64, D})),
                      "cos_sin_cache is on cpu but q is on cuda:0");
  // Another device, dtypes, lengths, strides of the index arrays.
  EXPECT_KVATTN_ERROR(kvattn::apply_rope(Q(), K(), QO, TensorView(kob.at(), DType::bf16, {n, Hk, D}, kvattn::Device::cuda(1)), P),
                      "k_out is on cuda:1 but q is on cuda:0");
  EXPECT_KVATTN_ERROR(kvattn::apply_rope(Q(), K(), QO, KO, I(0, n, DType::f32)), "pos_ids has dtype f32 but i32 is expected");
  EXPECT_KVATTN_ERROR(kvattn::apply_rope(Q(), K(), QO, KO, I(0, n + 1)), "pos_ids has 5 elements but 4 are expected");
  EXPECT_KVATTN_ERROR(kvattn::apply_rope_ragged(Q(), K(), QO, KO, TensorView(idx.at(), DType::i32, {3}, {2}, kCuda0), I(32, 2)),
                      "indptr must be contiguous");
  EXPECT_KVATTN_ERROR(kvattn::apply_rope_ragged(Q(), K(), QO, KO, I(0, 3), I(32, 3)), "offsets has 3 elements but 2 are expected");
  EXPECT_KVATTN_ERROR(kvattn::apply_rope_ragged(Q(), K(), QO, KO, I(0, 0), I(32, 0)),
                      "indptr must have at least one element (batch_size + 1)");
  // Misaligned (a sticky CUDA error if launched): bf16 one byte off, an index array two bytes off,
  // the table two bytes off.
  EXPECT_KVATTN_ERROR(kvattn::apply_rope(Q(1), K(), QO, KO, P), "q starts at address");
  EXPECT_KVATTN_ERROR(kvattn::apply_rope(Q(), K(), QO, KO, I(2, n)), "pos_ids starts at address");
  EXPECT_KVATTN_ERROR(kvattn::apply_rope_with_cos_sin_cache(Q(), K(), QO, KO, P, TensorView(tab.at(2), DType::f32, {64, D}, kCuda0)),
                      "cos_sin_cache starts at address");
  EXPECT_KVATTN_ERROR(kvattn::apply_rope(Q(), TensorView(kb.at(1), DType::bf16, {n, Hk, D}, kCuda0), QO, KO, P),
                      "which is not a multiple of its element size (2 bytes");
  // The shared checks, as on the CPU.
  EXPECT_KVATTN_ERROR(kvattn::apply_rope(Q(), K(), TensorView(qb.at(), DType::bf16, {n, Hq, D}, {Hq * D + 8, D + 8, 1}, kCuda0), KO, P),
                      "q_out aliases q with other strides");
  EXPECT_KVATTN_ERROR(kvattn::apply_rope(Q(), K(), QO, QO, P), "k_out.shape[1] = 2 but k.shape[1] = 1");
  // rotary_dim past the GPU kernels' 8192 (a CTA keeps its rows' cos/sin in shared memory).
  Cuda0Buffer wide(8200 * 2 * 2 + 64);
  const TensorView WQ(wide.at(), DType::bf16, {1, 1, 8200}, kCuda0), WK(wide.at(8200 * 2), DType::bf16, {1, 1, 8200}, kCuda0);
  EXPECT_KVATTN_ERROR(kvattn::apply_rope(WQ, WK, WQ, WK, I(0, 1)),
                      "rotary_dim = 8200 exceeds 8192, the most the GPU kernels rotate");
  EXPECT_EQ(qob.bytes(n * Hq * D * 4), qo_before) << "a rejected call wrote q_out";
  EXPECT_EQ(kob.bytes(n * Hk * D * 4), ko_before) << "a rejected call wrote k_out";
}

// Without a device, a valid CUDA call says so instead of launching anything.
TEST(GpuRopeErrors, NoDeviceIsAClearError) {
  if (gpu_available()) GTEST_SKIP() << "a CUDA device is present";
  Cuda0Buffer buf(4096);
  const TensorView q(buf.at(), DType::bf16, {2, 1, 64}, kCuda0), k(buf.at(512), DType::bf16, {2, 1, 64}, kCuda0);
  const TensorView p(buf.at(1024), DType::i32, {2}, kCuda0), t(buf.at(2048), DType::f32, {4, 64}, kCuda0);
  EXPECT_KVATTN_ERROR(kvattn::apply_rope(q, k, q, k, p), "no CUDA device: ");
  EXPECT_KVATTN_ERROR(kvattn::apply_rope(q, k, q, k, p), "(needed for q on cuda:0)");
  EXPECT_KVATTN_ERROR(kvattn::apply_rope_with_cos_sin_cache(q, k, q, k, p, t), "no CUDA device: ");
  EXPECT_KVATTN_ERROR(kvattn::apply_rope_ragged(q, k, q, k, TensorView(buf.at(1024), DType::i32, {2}, kCuda0),
                                                TensorView(buf.at(1536), DType::i32, {1}, kCuda0)),
                      "no CUDA device: ");
}

#else  // !KVATTN_WITH_CUDA

TEST(GpuRope, NeedsTheCudaBackend) { GTEST_SKIP() << "this build has no CUDA backend"; }

#endif

}  // namespace
}  // namespace kvattn_test
