// The stand-alone operations (kvattn/ops.h) on CUDA tensors: merge_state, merge_state_in_place,
// merge_states and append_paged_kv_cache run through the GPU kernels on fresh random inputs and
// are checked, element by element, against
//  - merges: the float64 reference (tests/reference, SEMANTICS.md "Merging attention states"),
//    with every dtype pair, strided views (the kernels' 4-element and scalar paths), aliasing,
//    -inf states (their o is NaN here: it must not be read), device masks (contiguous and
//    strided), k = 0, 1, 5;
//  - append: the slot SEMANTICS.md ("Paged KV cache") gives, computed here from the page table,
//    holding exactly the right bits (the tests' own codec, ops_testing.h, independent of src/),
//    every other byte of the cache unchanged, and the whole cache byte-identical to the CPU
//    backend's result; NHD/HND, split/combined, page sizes 1/5/16, dtype conversions; rows with
//    out-of-range device indices skipped;
//  - a merge and an append captured in a CUDA graph and replayed;
//  - the host-side errors of CUDA calls (mixed devices, dtypes, misalignment, index arrays), by
//    message, with nothing written.
// GPU cases skip, saying why, where there is no CUDA device. GpuOpsConvert.*, GpuOpsJit.* and
// GpuOpsErrors.* need no device (the calls they make fail before any launch; with a device their tensors are real
// device memory).
//
// Tolerances (merges). The reference reads the stored inputs, so input rounding adds nothing. The
// kernels fold in f32: the weights 2^(lse_i - m) carry a relative error of a few ulps (the rounding
// of lse_i - m, of exp2f, of 1/d), and an output is a convex combination of the inputs, so its f32
// error is below 16 f32 ulps of the largest contributing |o_i[e]| for the k <= 5 states here
// (kFold * o_mag, o_mag from ref::merge_states). The result is rounded once to the output dtype:
// compare.h's output_tolerance (2 unit roundoffs of |o| plus the subnormal spacing). The LSE is
// m + log2(d), d in [1, k]: a few ulps of |lse| <= 200, far below 1e-5 + 1e-6 |lse|, while a wrong
// base or weight is off by O(1). A (row, head) with exactly one finite state must reproduce it
// exactly (rounded once to the output dtype), and all -inf gives exactly o = 0, lse = -inf.
// Append: no tolerance; every byte is compared.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/convert.h"
#include "kernels/common/convert.cuh"
#include "ops_testing.h"
#include "reference/reference.h"
#include "support/compare.h"
#include "support/device_mirror.h"
#include "support/gpu_skip.h"
#include "support/expect_error.h"
#include "support/host_tensor.h"
#include "support/paged_kv.h"
#include "support/random.h"

#if KVATTN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/jit.h"
#include "cuda/merge_kernels.h"
#endif

namespace kvattn_test {
namespace {

using kvattn::DType;
using kvattn::KVLayout;
using kvattn::TensorView;
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- the device converters against the CPU backend's, on the host (no GPU needed) ------------------
namespace cv = kvattn::convert;
namespace dc = kvattn::kernels::cvt;

::testing::AssertionResult same_conversions(uint32_t u) {
  const float f = cv::bits_f32(u);
  if (dc::f32_to_f16_bits(u) != cv::f32_to_f16(f) || dc::f32_to_bf16_bits(u) != cv::f32_to_bf16(f) ||
      dc::f32_to_e4m3_bits(u) != cv::f32_to_e4m3(f) || dc::f32_to_e5m2_bits(u) != cv::f32_to_e5m2(f))
    return ::testing::AssertionFailure() << "f32 0x" << std::hex << u << " (" << f << ") converts differently";
  return ::testing::AssertionSuccess();
}

// The append kernel converts with kernels/common/convert.cuh; the CPU backend with
// src/core/convert.h. They must agree bit for bit (NaNs included): every code of the narrow formats
// decoded, and f32 inputs at every exponent around every rounding boundary of the targets, plus a
// sweep of the whole f32 range. (An exhaustive run over all 2^32 inputs agreed when this was
// written; it takes minutes, so the suite samples.)
TEST(GpuOpsConvert, DeviceConvertersMatchTheCpuPathBitForBit) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    ASSERT_EQ(dc::f16_to_f32_bits(uint16_t(h)), cv::f32_bits(cv::f16_to_f32(uint16_t(h)))) << "f16 0x" << std::hex << h;
    ASSERT_EQ(dc::bf16_to_f32_bits(uint16_t(h)), cv::f32_bits(cv::bf16_to_f32(uint16_t(h)))) << "bf16 0x" << std::hex << h;
  }
  for (uint32_t x = 0; x < 0x100u; ++x) {
    ASSERT_EQ(dc::e4m3_to_f32_bits(uint8_t(x)), cv::f32_bits(cv::e4m3_to_f32(uint8_t(x)))) << "e4m3 0x" << std::hex << x;
    ASSERT_EQ(dc::e5m2_to_f32_bits(uint8_t(x)), cv::f32_bits(cv::e5m2_to_f32(uint8_t(x)))) << "e5m2 0x" << std::hex << x;
  }
  // Every value of every narrow format, and the f32 values just around it and around the midpoints
  // to its neighbours (ties, one ulp either side), at every exponent.
  std::vector<uint32_t> centres;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    centres.push_back(uint32_t(h) << 16);                          // bf16 codes
    centres.push_back(cv::f32_bits(cv::f16_to_f32(uint16_t(h))));  // f16 codes
  }
  for (uint32_t x = 0; x < 0x100u; ++x) {
    centres.push_back(cv::f32_bits(cv::e4m3_to_f32(uint8_t(x))));
    centres.push_back(cv::f32_bits(cv::e5m2_to_f32(uint8_t(x))));
  }
  for (uint32_t c : centres) {
    if ((c & 0x7fffffffu) > 0x7f800000u) continue;  // NaN centres: covered by the sweep below
    const float f = cv::bits_f32(c);
    for (int shift : {0, 1, 2, 3, 4}) {  // midpoints towards the neighbours of the 5 formats' ulps
      for (uint32_t mid : {c + (0x1000u << shift), c - (0x1000u << shift), c + (0x40000u << shift), c - (0x40000u << shift)})
        for (int d : {-1, 0, 1}) ASSERT_TRUE(same_conversions(mid + uint32_t(d)));
    }
    for (int d : {-2, -1, 0, 1, 2}) ASSERT_TRUE(same_conversions(c + uint32_t(d)));
    ASSERT_TRUE(same_conversions(cv::f32_bits(std::nextafter(f, kInf))));
    ASSERT_TRUE(same_conversions(cv::f32_bits(std::nextafter(f, -kInf))));
  }
  KVATTN_CASE_RNG(rng);
  const uint64_t start = uint64_t(rng.integer(0, 996));
  for (uint64_t u = start; u < (uint64_t(1) << 32); u += 997) ASSERT_TRUE(same_conversions(uint32_t(u)));
}

#if KVATTN_WITH_CUDA

// The default preset compiles the same-dtype merges and the append for sm_90a and sm_80 (CudaJit.*);
// the mixed-dtype merges compile on first use, so they are compiled here, for the oldest target.
TEST(GpuOpsJit, MixedDtypeMergeKernelsCompile) {
  for (DType in : {DType::f32, DType::f16, DType::bf16})
    for (DType out : {DType::f32, DType::f16, DType::bf16}) {
      if (in == out) continue;
      for (const kvattn::cuda::KernelSpec& spec : {kvattn::cuda::merge_states_spec(in, out, "sm_80"),
                                                   kvattn::cuda::merge_pair_spec(in, out, "sm_80")}) {
        SCOPED_TRACE(spec.name);
        EXPECT_FALSE(kvattn::cuda::compile_to_cubin(spec).cubin.empty());
      }
    }
}

constexpr double kFold = 16 * 0x1p-24;
constexpr ComputeTolerance kMergeTolerance{kFold, 1e-5};

std::string name(DType t) { return std::string(kvattn::dtype_name(t)); }

// ---- merges ---------------------------------------------------------------------------------------
// How a state tensor is stored: contiguous, padded by 1-3 elements (odd strides: the kernels' scalar
// path), or padded by 16-byte multiples (the 4-element path).
enum class Storage { contiguous, padded, padded_aligned };
const Storage kStorages[] = {Storage::contiguous, Storage::padded, Storage::padded_aligned};
std::string storage_name(Storage s) {
  return s == Storage::contiguous ? "contiguous" : s == Storage::padded ? "padded" : "padded (aligned)";
}

HostTensor make_tensor(DType t, std::vector<int64_t> shape, Storage s) {
  HostTensor h = s == Storage::contiguous ? HostTensor(t, std::move(shape))
                 : s == Storage::padded   ? HostTensor::strided(t, std::move(shape))
                                          : HostTensor::strided_aligned(t, std::move(shape));
  h.poison();
  return h;
}

// Random base-2 LSE: mostly in [-20, 20], sometimes -inf (p_inf), sometimes far below the others
// (weights that underflow f32); stored as f32, so rounded to f32 here.
double random_lse(Rng& rng, double p_inf) {
  const double u = rng.uniform(0, 1);
  if (u < p_inf) return -kInf;
  if (u < p_inf + 0.05) return double(float(rng.uniform(-200, -150)));
  return double(float(rng.uniform(-20, 20)));
}

// One [n, H, D] state: values and LSEs, on the host (and a device mirror made later).
struct StateSet {
  HostTensor v, s;
  StateSet(DType t, int64_t n, int H, int D, Storage st)
      : v(make_tensor(t, {n, H, D}, st)), s(make_tensor(DType::f32, {n, H}, st)) {}
  // Random states; a -inf state's o has NaNs (it must not be read).
  void fill(Rng& rng, double p_inf) {
    const int64_t n = v.shape()[0], H = v.shape()[1], D = v.shape()[2];
    for (int64_t r = 0; r < n; ++r)
      for (int64_t h = 0; h < H; ++h) {
        const double l = random_lse(rng, p_inf);
        s.set({r, h}, l);
        for (int64_t e = 0; e < D; ++e) v.set({r, h, e}, l == -kInf && e % 5 == 0 ? std::nan("") : rng.uniform(-3, 3));
      }
  }
  std::vector<double> o(int64_t r, int64_t h) const {
    std::vector<double> x(size_t(v.shape()[2]));
    for (size_t e = 0; e < x.size(); ++e) x[e] = v.get({r, h, int64_t(e)});
    return x;
  }
  double lse(int64_t r, int64_t h) const { return s.get({r, h}); }
};

// Expected outputs of merging, per (row, head), the given states; dense [n][H][D] and [n][H].
struct Expected {
  std::vector<double> o, mag, lse;
  std::vector<int> finite;       // per (row, head): how many states are finite
  std::vector<double> only;      // the only finite state's o (finite == 1), dense
  void add(const std::vector<std::vector<double>>& os, const std::vector<double>& lses) {
    const ref::Result m = ref::merge_states(os, lses);
    o.insert(o.end(), m.o.begin(), m.o.end());
    mag.insert(mag.end(), m.o_mag.begin(), m.o_mag.end());
    lse.push_back(m.lse[0]);
    int f = 0;
    size_t which = 0;
    for (size_t i = 0; i < lses.size(); ++i)
      if (lses[i] != -kInf) ++f, which = i;
    finite.push_back(f);
    const size_t D = m.o.size();
    for (size_t e = 0; e < D; ++e) only.push_back(f == 1 ? os[which][e] : 0.0);
  }
};

// Checks out (copied back) against `want`: within tolerance everywhere, exact where at most one
// state was finite, every element written, no byte outside the views touched.
void check_merged(const HostTensor& v_out, const HostTensor& s_out, const Expected& want) {
  EXPECT_TRUE(outputs_match(v_out, want.o, want.mag, kMergeTolerance));
  EXPECT_TRUE(lse_match(s_out, want.lse, kMergeTolerance));
  const int64_t n = v_out.shape()[0], H = v_out.shape()[1], D = v_out.shape()[2];
  int64_t bad = 0;
  std::string first;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < H; ++h) {
      const size_t rh = size_t(r * H + h);
      if (want.finite[rh] > 1) continue;
      for (int64_t e = 0; e < D; ++e) {
        const double expect = want.finite[rh] ? ops_test::round_to(v_out.dtype(), want.only[rh * size_t(D) + size_t(e)]) : 0.0;
        if (v_out.get({r, h, e}) != expect && bad++ == 0)
          first = "o" + index_str({r, h, e}) + " = " + std::to_string(v_out.get({r, h, e})) + ", expected exactly " + std::to_string(expect);
      }
      const double l = s_out.get({r, h});
      if (l != want.lse[rh] && bad++ == 0)
        first = "lse" + index_str({r, h}) + " = " + std::to_string(l) + ", expected exactly " + std::to_string(want.lse[rh]);
    }
  EXPECT_EQ(bad, 0) << "(row, head) pairs with at most one finite state must be exact; first: " << first;
}

TEST(GpuOps, MergeStateEveryDtypeStorageAndInf) {
  SKIP_WITHOUT_GPU();
  for (DType in : {DType::f32, DType::f16, DType::bf16})
    for (DType out : {DType::f32, DType::f16, DType::bf16})
      for (Storage st : kStorages)
        for (int D : {128, 37}) {
          KVATTN_CASE_RNG(rng);
          SCOPED_TRACE(name(in) + " -> " + name(out) + ", " + storage_name(st) + ", D = " + std::to_string(D));
          const int64_t n = 45;
          const int H = 3;
          StateSet a(in, n, H, D, st), b(in, n, H, D, Storage::contiguous), o(out, n, H, D, st);
          a.fill(rng, 0.2);
          b.fill(rng, 0.2);
          Expected want;
          for (int64_t r = 0; r < n; ++r)
            for (int h = 0; h < H; ++h) want.add({a.o(r, h), b.o(r, h)}, {a.lse(r, h), b.lse(r, h)});
          DeviceMirror da(a.v), dsa(a.s), db(b.v), dsb(b.s), dout(o.v), dsout(o.s);
          kvattn::merge_state(da.view(), dsa.view(), db.view(), dsb.view(), dout.view(), dsout.view());
          device_synchronize();
          dout.copy_back(o.v);
          dsout.copy_back(o.s);
          check_merged(o.v, o.s, want);
        }
}

TEST(GpuOps, MergeStateOutputMayAliasAnInput) {
  SKIP_WITHOUT_GPU();
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (Storage st : {Storage::contiguous, Storage::padded})
      for (bool into_a : {false, true}) {
        KVATTN_CASE_RNG(rng);
        SCOPED_TRACE(name(t) + ", " + storage_name(st) + (into_a ? ", out = a" : ", out = b"));
        const int64_t n = 33;
        const int H = 4, D = 64;
        StateSet a(t, n, H, D, st), b(t, n, H, D, st);
        a.fill(rng, 0.2);
        b.fill(rng, 0.2);
        Expected want;
        for (int64_t r = 0; r < n; ++r)
          for (int h = 0; h < H; ++h) want.add({a.o(r, h), b.o(r, h)}, {a.lse(r, h), b.lse(r, h)});
        DeviceMirror da(a.v), dsa(a.s), db(b.v), dsb(b.s);
        const TensorView ov = into_a ? da.view() : db.view(), os = into_a ? dsa.view() : dsb.view();
        kvattn::merge_state(da.view(), dsa.view(), db.view(), dsb.view(), ov, os);
        device_synchronize();
        StateSet& res = into_a ? a : b;
        (into_a ? da : db).copy_back(res.v);
        (into_a ? dsa : dsb).copy_back(res.s);
        check_merged(res.v, res.s, want);
      }
}

TEST(GpuOps, MergeStateInPlaceHonoursTheDeviceMask) {
  SKIP_WITHOUT_GPU();
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (Storage st : kStorages)
      for (int mask_kind : {0, 1, 2}) {  // none, contiguous, every other byte
        KVATTN_CASE_RNG(rng);
        SCOPED_TRACE(name(t) + ", " + storage_name(st) +
                     (mask_kind == 0 ? ", no mask" : mask_kind == 1 ? ", mask" : ", strided mask"));
        const int64_t n = 41;
        const int H = 3, D = 48;
        StateSet v(t, n, H, D, st), other(t, n, H, D, Storage::contiguous);
        v.fill(rng, 0.15);
        other.fill(rng, 0.15);
        // The mask bytes: row r's at r (contiguous) or 2r (strided; the bytes between are 0, so
        // reading them by mistake skips rows).
        HostTensor mask(DType::u8, {2 * n});
        std::vector<bool> merged(size_t(n), true);
        for (int64_t i = 0; i < 2 * n; ++i) mask.set_at(i, 0);
        for (int64_t r = 0; r < n && mask_kind != 0; ++r) {
          const double byte = rng.integer(0, 2) ? double(rng.integer(1, 255)) : 0.0;
          mask.set_at(mask_kind == 1 ? r : 2 * r, byte);
          merged[size_t(r)] = byte != 0;
        }
        Expected want;
        for (int64_t r = 0; r < n; ++r)
          for (int h = 0; h < H; ++h) want.add({v.o(r, h), other.o(r, h)}, {v.lse(r, h), other.lse(r, h)});
        const HostTensor before_v = v.v, before_s = v.s;
        DeviceMirror dv(v.v), ds(v.s), dov(other.v), dos(other.s), dm(mask);
        TensorView mv;
        if (mask_kind == 1) mv = TensorView(dm.view().data(), DType::u8, {n}, kvattn::Device::cuda(0));
        if (mask_kind == 2) mv = TensorView(dm.view().data(), DType::u8, {n}, {2}, kvattn::Device::cuda(0));
        kvattn::merge_state_in_place(dv.view(), ds.view(), dov.view(), dos.view(), mv);
        device_synchronize();
        dv.copy_back(v.v);
        ds.copy_back(v.s);
        const size_t esz = kvattn::dtype_size(t);
        const OutputTolerance ot = output_tolerance(t);
        int64_t bad = 0;
        auto fail = [&](const std::string& what) {
          if (bad++ < 3) ADD_FAILURE() << what;
        };
        for (int64_t r = 0; r < n; ++r)
          for (int h = 0; h < H; ++h) {
            const size_t rh = size_t(r * H + h);
            if (!merged[size_t(r)]) {  // every byte as before (NaN payloads included)
              for (int e = 0; e < D; ++e) {
                const int64_t at = v.v.view_byte_offset() + v.v.offset({r, h, e}) * int64_t(esz);
                if (std::memcmp(v.v.raw_bytes().data() + at, before_v.raw_bytes().data() + at, esz) != 0)
                  fail("masked o" + index_str({r, h, e}) + " was written");
              }
              const int64_t at = v.s.view_byte_offset() + v.s.offset({r, h}) * 4;
              if (std::memcmp(v.s.raw_bytes().data() + at, before_s.raw_bytes().data() + at, 4) != 0)
                fail("masked lse" + index_str({r, h}) + " was written");
              continue;
            }
            for (int e = 0; e < D; ++e) {
              const size_t i = rh * size_t(D) + size_t(e);
              const double got = v.v.get({r, h, e});
              const bool ok = want.finite[rh] <= 1
                                  ? got == (want.finite[rh] ? ops_test::round_to(t, want.only[i]) : 0.0)
                                  : std::abs(got - want.o[i]) <= ot.rtol * std::abs(want.o[i]) + ot.atol + kFold * want.mag[i];
              if (!ok) fail("o" + index_str({r, h, e}) + " = " + std::to_string(got) + ", expected " + std::to_string(want.o[i]));
            }
            const double l = v.s.get({r, h}), wl = want.lse[rh];
            const bool ok = want.finite[rh] <= 1 ? l == wl : std::abs(l - wl) <= kMergeTolerance.lse_abs + kLseRel * std::abs(wl);
            if (!ok) fail("lse" + index_str({r, h}) + " = " + std::to_string(l) + ", expected " + std::to_string(wl));
          }
        EXPECT_EQ(bad, 0);
        EXPECT_TRUE(padding_untouched(v.v, "v"));
        EXPECT_TRUE(padding_untouched(v.s, "s"));
      }
}

// v [n, k, H, D] stored as [k, n, H, D] (split-KV partials), so the view's strides are permuted.
struct StackedStates {
  HostTensor v, s;  // [k, n, H, D], [k, n, H]
  StackedStates(DType t, int k, int64_t n, int H, int D, Storage st)
      : v(make_tensor(t, {k, n, H, D}, st)), s(make_tensor(DType::f32, {k, n, H}, st)) {}
  TensorView vview(const DeviceMirror& m) const {
    const TensorView b = m.view();
    return TensorView(b.data(), b.dtype(), {b.size(1), b.size(0), b.size(2), b.size(3)},
                      {b.stride(1), b.stride(0), b.stride(2), 1}, kvattn::Device::cuda(0));
  }
  TensorView sview(const DeviceMirror& m) const {
    const TensorView b = m.view();
    return TensorView(b.data(), b.dtype(), {b.size(1), b.size(0), b.size(2)},
                      {b.stride(1), b.stride(0), b.stride(2)}, kvattn::Device::cuda(0));
  }
};

void fill_stacked(StackedStates& x, Rng& rng, Expected& want) {
  const int k = int(x.v.shape()[0]);
  const int64_t n = x.v.shape()[1], H = x.v.shape()[2], D = x.v.shape()[3];
  for (int i = 0; i < k; ++i)
    for (int64_t r = 0; r < n; ++r)
      for (int64_t h = 0; h < H; ++h) {
        const double l = random_lse(rng, r % 5 == 0 ? 1.0 : 0.25);  // every 5th row: all -inf
        x.s.set({i, r, h}, l);
        for (int64_t e = 0; e < D; ++e)
          x.v.set({i, r, h, e}, l == -kInf && e % 3 == 0 ? std::nan("") : rng.uniform(-3, 3));
      }
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<std::vector<double>> os;
      std::vector<double> ls;
      for (int i = 0; i < k; ++i) {
        std::vector<double> o(static_cast<size_t>(D));
        for (int64_t e = 0; e < D; ++e) o[size_t(e)] = x.v.get({i, r, h, e});
        os.push_back(o);
        ls.push_back(x.s.get({i, r, h}));
      }
      if (k == 0) os.push_back(std::vector<double>(size_t(D), 0.0)), ls.push_back(-kInf);  // o = 0, lse = -inf
      want.add(os, ls);
    }
}

TEST(GpuOps, MergeStatesFoldsZeroOneAndFiveStates) {
  SKIP_WITHOUT_GPU();
  for (DType in : {DType::f32, DType::f16, DType::bf16})
    for (DType out : {DType::f32, DType::f16, DType::bf16})
      for (int k : {0, 1, 5})
        for (Storage st : {Storage::contiguous, Storage::padded}) {
          KVATTN_CASE_RNG(rng);
          SCOPED_TRACE(name(in) + " -> " + name(out) + ", k = " + std::to_string(k) + ", " + storage_name(st));
          const int64_t n = 29;
          const int H = 3, D = st == Storage::padded ? 72 : 36;
          StackedStates x(in, k, n, H, D, st);
          Expected want;
          fill_stacked(x, rng, want);
          StateSet o(out, n, H, D, st);
          DeviceMirror dv(x.v), ds(x.s), dout(o.v), dsout(o.s);
          kvattn::merge_states(x.vview(dv), x.sview(ds), dout.view(), dsout.view());
          device_synchronize();
          dout.copy_back(o.v);
          dsout.copy_back(o.s);
          check_merged(o.v, o.s, want);
        }
}

// The output aliases state 0 of the input exactly (a split-KV merge written over the first partial).
TEST(GpuOps, MergeStatesOutputMayAliasStateZero) {
  SKIP_WITHOUT_GPU();
  for (DType t : {DType::f32, DType::bf16})
    for (Storage st : {Storage::contiguous, Storage::padded}) {
      KVATTN_CASE_RNG(rng);
      SCOPED_TRACE(name(t) + ", " + storage_name(st));
      const int64_t n = 21;
      const int k = 5, H = 2, D = 128;
      StackedStates x(t, k, n, H, D, st);
      Expected want;
      fill_stacked(x, rng, want);
      DeviceMirror dv(x.v), ds(x.s);
      const TensorView v = x.vview(dv), s = x.sview(ds);
      const TensorView vo(v.data(), t, {n, H, D}, {v.stride(0), v.stride(2), 1}, kvattn::Device::cuda(0));
      const TensorView so(s.data(), DType::f32, {n, H}, {s.stride(0), s.stride(2)}, kvattn::Device::cuda(0));
      kvattn::merge_states(v, s, vo, so);
      device_synchronize();
      dv.copy_back(x.v);
      ds.copy_back(x.s);
      // State 0 of x now holds the result: view it as [n, H, D] on the host.
      HostTensor got_v(t, {n, H, D}), got_s(DType::f32, {n, H});
      got_v.poison();
      got_s.poison();
      for (int64_t r = 0; r < n; ++r)
        for (int h = 0; h < H; ++h) {
          got_s.set({r, h}, x.s.get({0, r, h}));
          for (int e = 0; e < D; ++e) got_v.set({r, h, e}, x.v.get({0, r, h, e}));
        }
      check_merged(got_v, got_s, want);
    }
}

// ---- append ---------------------------------------------------------------------------------------
struct AppendConfig {
  KVLayout layout = KVLayout::NHD;
  bool combined = false;
  int page_size = 16;
  DType cache_t = DType::bf16, append_t = DType::bf16;
  bool strided = false;  // padded cache and append views (odd strides)
  int heads = 2, D = 16, Dv = 8;
};

std::string describe(const AppendConfig& c) {
  return std::string(kvattn::kv_layout_name(c.layout)) + (c.combined ? " combined" : " split") +
         " page_size=" + std::to_string(c.page_size) + " cache " + name(c.cache_t) + " <- " +
         name(c.append_t) + (c.strided ? " strided" : "") + " D=" + std::to_string(c.D) + "/" +
         std::to_string(c.Dv);
}

// A paged cache over a shuffled pool (some pages unused) with random prior contents (every byte,
// padding included), its page table, and append rows for a random subset of each request's
// positions (the newest few and some older), shuffled.
struct AppendCase {
  AppendConfig cfg;
  int64_t num_pages = 0;
  std::vector<int32_t> indptr, indices, last, batch, pos;
  std::vector<int64_t> len;
  HostTensor k, v, kv;  // split: k, v; combined: kv
  HostTensor ak, av;

  HostTensor& storage(bool is_v) { return cfg.combined ? kv : is_v ? v : k; }
  const HostTensor& storage(bool is_v) const { return cfg.combined ? kv : is_v ? v : k; }
  // Element offset (from base()) of (page, slot, head, e).
  int64_t cache_offset(bool is_v, int64_t page, int64_t slot, int64_t h, int64_t e) const {
    const bool nhd = cfg.layout == KVLayout::NHD;
    if (cfg.combined)
      return nhd ? kv.offset({page, is_v ? 1 : 0, slot, h, e}) : kv.offset({page, is_v ? 1 : 0, h, slot, e});
    const HostTensor& t = is_v ? v : k;
    return nhd ? t.offset({page, slot, h, e}) : t.offset({page, h, slot, e});
  }
  int64_t nnz() const { return int64_t(batch.size()); }
};

AppendCase make_append_case(Rng& rng, const AppendConfig& cfg) {
  AppendCase c;
  c.cfg = cfg;
  const int S = cfg.page_size, B = 5;
  std::vector<int64_t> pages_of(B);
  int64_t used = 0;
  for (int b = 0; b < B; ++b) {
    c.len.push_back(b == 2 ? 0 : rng.integer(1, 3 * S + 20));
    pages_of[size_t(b)] = (c.len.back() + S - 1) / S;
    used += pages_of[size_t(b)];
  }
  c.num_pages = used + 3;
  std::vector<int32_t> perm(size_t(c.num_pages));
  for (int32_t i = 0; i < c.num_pages; ++i) perm[size_t(i)] = i;
  rng.shuffle(perm);
  c.indptr.push_back(0);
  for (int b = 0; b < B; ++b) {
    for (int64_t j = 0; j < pages_of[size_t(b)]; ++j) c.indices.push_back(perm[c.indices.size()]);
    c.indptr.push_back(int32_t(c.indices.size()));
    c.last.push_back(int32_t(c.len[size_t(b)] == 0 ? 0 : c.len[size_t(b)] - (pages_of[size_t(b)] - 1) * S));
  }
  std::vector<std::pair<int32_t, int32_t>> rows;
  for (int b = 0; b < B; ++b)
    for (int64_t t = 0; t < c.len[size_t(b)]; ++t)
      if (t >= c.len[size_t(b)] - 5 || rng.integer(0, 3) == 0) rows.push_back({b, int32_t(t)});
  rng.shuffle(rows);
  for (auto [b, t] : rows) c.batch.push_back(b), c.pos.push_back(t);

  const int64_t P = c.num_pages, H = cfg.heads;
  const bool nhd = cfg.layout == KVLayout::NHD;
  auto make = [&](std::vector<int64_t> shape, DType t) {
    return cfg.strided ? HostTensor::strided(t, std::move(shape)) : HostTensor(t, std::move(shape));
  };
  if (cfg.combined) {
    c.kv = make(nhd ? std::vector<int64_t>{P, 2, S, H, cfg.D} : std::vector<int64_t>{P, 2, H, S, cfg.D}, cfg.cache_t);
  } else {
    c.k = make(nhd ? std::vector<int64_t>{P, S, H, cfg.D} : std::vector<int64_t>{P, H, S, cfg.D}, cfg.cache_t);
    c.v = make(nhd ? std::vector<int64_t>{P, S, H, cfg.Dv} : std::vector<int64_t>{P, H, S, cfg.Dv}, cfg.cache_t);
  }
  for (HostTensor* t : {&c.k, &c.v, &c.kv})
    for (uint8_t& byte : t->raw_bytes()) byte = uint8_t(rng.integer(0, 255));
  // Append rows: mostly small values, some large (saturation / overflow), some tiny (subnormals).
  const int64_t nnz = c.nnz();
  c.ak = make({nnz, H, cfg.D}, cfg.append_t);
  c.av = make({nnz, H, cfg.combined ? cfg.D : cfg.Dv}, cfg.append_t);
  for (HostTensor* t : {&c.ak, &c.av}) {
    t->poison();
    t->for_each([&](int64_t off, const std::vector<int64_t>&) {
      double x = rng.uniform(-4, 4);
      const int64_t kind = rng.integer(0, 9);
      if (kind == 0) x *= 3e4;
      if (kind == 1) x *= 1e-5;
      t->set_at(off, x);
    });
  }
  return c;
}

kvattn::PagedKVCache cache_view(const AppendCase& c, const TensorView& k, const TensorView& v,
                                const TensorView& kv) {
  return c.cfg.combined ? kvattn::PagedKVCache::combined(kv, c.cfg.layout)
                        : kvattn::PagedKVCache::split(k, v, c.cfg.layout);
}

// The cache bytes expected after appending rows `valid` (SEMANTICS.md): the prior bytes with each
// appended element replaced by its bits in the cache dtype (the tests' codec; equal dtypes: the
// source bits).
std::vector<uint8_t> expected_bytes(const AppendCase& c, bool is_v_storage, const std::vector<bool>& valid) {
  const HostTensor& dst = c.storage(is_v_storage);
  std::vector<uint8_t> out = dst.raw_bytes();
  const size_t dsz = kvattn::dtype_size(c.cfg.cache_t), ssz = kvattn::dtype_size(c.cfg.append_t);
  for (int64_t r = 0; r < c.nnz(); ++r) {
    if (!valid[size_t(r)]) continue;
    const int b = c.batch[size_t(r)], t = c.pos[size_t(r)];
    const int64_t page = c.indices[size_t(c.indptr[size_t(b)] + t / c.cfg.page_size)], slot = t % c.cfg.page_size;
    for (bool is_v : {false, true}) {
      if (!c.cfg.combined && is_v != is_v_storage) continue;
      const HostTensor& src = is_v ? c.av : c.ak;
      const int64_t D = src.shape()[2];
      for (int64_t h = 0; h < c.cfg.heads; ++h)
        for (int64_t e = 0; e < D; ++e) {
          const int64_t so = src.offset({r, h, e});
          uint32_t bits = 0;
          if (c.cfg.cache_t == c.cfg.append_t)
            std::memcpy(&bits, src.raw_bytes().data() + src.view_byte_offset() + so * int64_t(ssz), ssz);
          else
            bits = ops_test::encode_bits(c.cfg.cache_t, src.get_at(so));
          const int64_t d = c.cache_offset(is_v, page, slot, h, e);
          std::memcpy(out.data() + dst.view_byte_offset() + d * int64_t(dsz), &bits, dsz);
        }
    }
  }
  return out;
}

::testing::AssertionResult same_bytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                                      const char* what) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && bad++ == 0) first = int64_t(i);
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << got.size()
                                       << " bytes differ, first at byte " << first << " (got 0x" << std::hex
                                       << int(got[size_t(first)]) << ", expected 0x" << int(want[size_t(first)]) << ")";
}

// Runs the append on the GPU and checks the cache against the expectation of rows `valid`; with
// cpu_too, also runs the CPU backend on a host copy and requires the same bytes.
void run_append_case(AppendCase& c, const std::vector<bool>& valid, bool cpu_too) {
  const std::vector<uint8_t> want_k = expected_bytes(c, false, valid);
  const std::vector<uint8_t> want_v = c.cfg.combined ? std::vector<uint8_t>() : expected_bytes(c, true, valid);
  AppendCase host = c;  // for the CPU backend
  HostTensor ib = int32_tensor(c.batch), ip = int32_tensor(c.pos), iptr = int32_tensor(c.indptr),
             iind = int32_tensor(c.indices), ilast = int32_tensor(c.last);
  {
    std::unique_ptr<DeviceMirror> dk, dv, dkv;
    if (c.cfg.combined) dkv = std::make_unique<DeviceMirror>(c.kv);
    else dk = std::make_unique<DeviceMirror>(c.k), dv = std::make_unique<DeviceMirror>(c.v);
    DeviceMirror dak(c.ak), dav(c.av), db(ib), dp(ip), dptr(iptr), dind(iind), dlast(ilast);
    const auto cache = cache_view(c, dk ? dk->view() : TensorView(), dv ? dv->view() : TensorView(),
                                  dkv ? dkv->view() : TensorView());
    kvattn::append_paged_kv_cache(dak.view(), dav.view(), db.view(), dp.view(), cache,
                                  {dptr.view(), dind.view(), dlast.view()});
    device_synchronize();
    if (dkv) dkv->copy_back(c.kv);
    else dk->copy_back(c.k), dv->copy_back(c.v);
  }
  EXPECT_TRUE(same_bytes(c.storage(false).raw_bytes(), want_k, c.cfg.combined ? "kv cache" : "k cache"));
  if (!c.cfg.combined) EXPECT_TRUE(same_bytes(c.v.raw_bytes(), want_v, "v cache"));
  if (!cpu_too) return;
  const auto cache = host.cfg.combined ? kvattn::PagedKVCache::combined(host.kv.view(), host.cfg.layout)
                                       : kvattn::PagedKVCache::split(host.k.view(), host.v.view(), host.cfg.layout);
  kvattn::append_paged_kv_cache(host.ak.view(), host.av.view(), ib.view(), ip.view(), cache,
                                {iptr.view(), iind.view(), ilast.view()});
  EXPECT_TRUE(same_bytes(c.storage(false).raw_bytes(), host.storage(false).raw_bytes(), "GPU vs CPU backend (k / kv)"));
  if (!c.cfg.combined) EXPECT_TRUE(same_bytes(c.v.raw_bytes(), host.v.raw_bytes(), "GPU vs CPU backend (v)"));
}

TEST(GpuOps, AppendEveryLayoutStorageAndPageSize) {
  SKIP_WITHOUT_GPU();
  for (KVLayout layout : {KVLayout::NHD, KVLayout::HND})
    for (bool combined : {false, true})
      for (int ps : {1, 5, 16})
        for (bool strided : {false, true}) {
          KVATTN_CASE_RNG(rng);
          AppendConfig cfg;
          cfg.layout = layout;
          cfg.combined = combined;
          cfg.page_size = ps;
          cfg.strided = strided;
          cfg.heads = 3;
          cfg.D = 64;
          cfg.Dv = combined ? 64 : 24;
          SCOPED_TRACE(describe(cfg));
          AppendCase c = make_append_case(rng, cfg);
          ASSERT_GT(c.nnz(), 0);
          run_append_case(c, std::vector<bool>(size_t(c.nnz()), true), true);
        }
}

// Equal dtypes copy bits in the widest piece every address allows (16 down to 1 bytes): head dims
// and paddings that force each width, every dtype.
TEST(GpuOps, AppendSameDtypeCopiesBitsAtEveryWidth) {
  SKIP_WITHOUT_GPU();
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2})
    for (int D : {128, 8, 5, 3})
      for (bool strided : {false, true}) {
        KVATTN_CASE_RNG(rng);
        AppendConfig cfg;
        cfg.cache_t = cfg.append_t = t;
        cfg.D = D;
        cfg.Dv = D + 1;
        cfg.strided = strided;
        cfg.layout = strided ? KVLayout::HND : KVLayout::NHD;
        cfg.page_size = 5;
        SCOPED_TRACE(describe(cfg));
        AppendCase c = make_append_case(rng, cfg);
        run_append_case(c, std::vector<bool>(size_t(c.nnz()), true), true);
      }
}

// Conversions: round to nearest even, fp8 saturating, f16 overflowing to inf, exactly as the CPU.
TEST(GpuOps, AppendConvertsToTheCacheDtypeLikeTheCpu) {
  SKIP_WITHOUT_GPU();
  const std::pair<DType, DType> pairs[] = {
      {DType::e4m3, DType::bf16}, {DType::e5m2, DType::bf16}, {DType::f16, DType::bf16},
      {DType::f32, DType::bf16},  {DType::bf16, DType::f32},  {DType::e4m3, DType::f16},
      {DType::e5m2, DType::f32},  {DType::bf16, DType::e4m3}, {DType::f16, DType::e5m2}};
  for (auto [ct, at] : pairs)
    for (KVLayout layout : {KVLayout::NHD, KVLayout::HND})
      for (bool combined : {false, true}) {
        KVATTN_CASE_RNG(rng);
        AppendConfig cfg;
        cfg.cache_t = ct;
        cfg.append_t = at;
        cfg.layout = layout;
        cfg.combined = combined;
        cfg.page_size = combined ? 16 : 5;
        cfg.strided = !combined;
        cfg.D = 32;
        cfg.Dv = combined ? 32 : 16;
        SCOPED_TRACE(describe(cfg));
        AppendCase c = make_append_case(rng, cfg);
        run_append_case(c, std::vector<bool>(size_t(c.nnz()), true), true);
      }
}

TEST(GpuOps, AppendOfNoRowsLaunchesNothing) {
  SKIP_WITHOUT_GPU();
  KVATTN_CASE_RNG(rng);
  AppendCase c = make_append_case(rng, AppendConfig{});
  c.batch.clear();
  c.pos.clear();
  c.ak = HostTensor(DType::bf16, {0, 2, 16});
  c.av = HostTensor(DType::bf16, {0, 2, 8});
  run_append_case(c, {}, false);
}

// Device index arrays are not read by the host: out-of-range values make the kernel skip the row
// (nothing written, nothing outside the cache touched) while the other rows are appended.
TEST(GpuOps, AppendSkipsRowsWithOutOfRangeDeviceIndices) {
  SKIP_WITHOUT_GPU();
  for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
    KVATTN_CASE_RNG(rng);
    AppendConfig cfg;
    cfg.layout = layout;
    cfg.page_size = 4;
    AppendCase c = make_append_case(rng, cfg);
    // Request 5: a bad page id in its second page; request 6: last_page_len 0 although it has a
    // page; request 7: last_page_len beyond page_size; request 8: indptr past kv_indices.
    const int32_t good_page = c.indices[0];
    c.indices.insert(c.indices.end(), {good_page, int32_t(c.num_pages) + 7, -3});
    c.indptr.push_back(int32_t(c.indices.size()));  // request 5: 3 pages
    c.last.push_back(2);
    c.indices.push_back(good_page);
    c.indptr.push_back(int32_t(c.indices.size()));  // request 6
    c.last.push_back(0);
    c.indices.push_back(good_page);
    c.indptr.push_back(int32_t(c.indices.size()));  // request 7
    c.last.push_back(5);
    c.indptr.push_back(int32_t(c.indices.size()) + 4);  // request 8: past the end
    c.last.push_back(1);
    std::vector<bool> valid(size_t(c.nnz()), true);
    auto add_bad = [&](int32_t b, int32_t t) {
      c.batch.push_back(b);
      c.pos.push_back(t);
      valid.push_back(false);
    };
    const int32_t B = int32_t(c.last.size());
    add_bad(-1, 0);                                  // request out of range
    add_bad(B, 0);
    add_bad(0, int32_t(c.len[0]));                   // position == kv_len
    add_bad(1, -1);                                  // negative position
    add_bad(2, 0);                                   // request without pages
    add_bad(5, 5);                                   // page id num_pages + 7
    add_bad(5, 9);                                   // page id -3
    add_bad(6, 0);                                   // last_page_len 0
    add_bad(7, 4);                                   // last_page_len > page_size
    add_bad(8, 0);                                   // indptr beyond kv_indices
    // Request 5's first page is valid: position 1 is appended (into good_page, slot 1).
    c.batch.push_back(5);
    c.pos.push_back(1);
    valid.push_back(true);
    // Re-make the append rows for the new count; the valid rows keep their targets.
    const int64_t nnz = c.nnz();
    c.ak = HostTensor(DType::bf16, {nnz, cfg.heads, cfg.D});
    c.av = HostTensor(DType::bf16, {nnz, cfg.heads, cfg.Dv});
    for (HostTensor* t : {&c.ak, &c.av})
      t->for_each([&](int64_t off, const std::vector<int64_t>&) { t->set_at(off, rng.uniform(-2, 2)); });
    // good_page slot 1 may also be written by a valid row of request 0 (its first page): drop
    // that row so that no two rows share a slot.
    for (int64_t r = 0; r + 1 < nnz; ++r)
      if (valid[size_t(r)] && c.batch[size_t(r)] == 0 && c.pos[size_t(r)] == 1) valid[size_t(r)] = false, c.pos[size_t(r)] = -5;
    SCOPED_TRACE(describe(cfg) + " with bad rows");
    run_append_case(c, valid, false);
  }
}

// ---- CUDA graphs --------------------------------------------------------------------------------
// A merge_state and an append captured on a stream (after a warm-up call that loads the kernels),
// replayed twice into poisoned outputs.
TEST(GpuOps, MergeAndAppendAreGraphCapturable) {
  SKIP_WITHOUT_GPU();
  KVATTN_CASE_RNG(rng);
  const int64_t n = 16;
  const int H = 4, D = 128;
  StateSet a(DType::bf16, n, H, D, Storage::contiguous), b(DType::bf16, n, H, D, Storage::contiguous),
      o(DType::bf16, n, H, D, Storage::contiguous);
  a.fill(rng, 0.1);
  b.fill(rng, 0.1);
  Expected want;
  for (int64_t r = 0; r < n; ++r)
    for (int h = 0; h < H; ++h) want.add({a.o(r, h), b.o(r, h)}, {a.lse(r, h), b.lse(r, h)});
  AppendCase c = make_append_case(rng, AppendConfig{});
  const std::vector<bool> all(size_t(c.nnz()), true);
  const std::vector<uint8_t> want_k = expected_bytes(c, false, all), want_v = expected_bytes(c, true, all);
  HostTensor ib = int32_tensor(c.batch), ip = int32_tensor(c.pos), iptr = int32_tensor(c.indptr),
             iind = int32_tensor(c.indices), ilast = int32_tensor(c.last);
  DeviceMirror da(a.v), dsa(a.s), db(b.v), dsb(b.s), dout(o.v), dsout(o.s);
  DeviceMirror dk(c.k), dv(c.v), dak(c.ak), dav(c.av), dbi(ib), dp(ip), dptr(iptr), dind(iind), dlast(ilast);
  const auto cache = kvattn::PagedKVCache::split(dk.view(), dv.view(), c.cfg.layout);
  const kvattn::PageTable table{dptr.view(), dind.view(), dlast.view()};
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  device_synchronize();  // the mirrors were filled on the legacy stream
  auto ops = [&] {
    kvattn::merge_state(da.view(), dsa.view(), db.view(), dsb.view(), dout.view(), dsout.view(), stream);
    kvattn::append_paged_kv_cache(dak.view(), dav.view(), dbi.view(), dp.view(), cache, table, stream);
  };
  ops();  // warm-up: compiles / loads the kernels outside the capture
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  ops();
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    // Fresh poisoned outputs and the original cache, then the graph.
    o.v.poison();
    o.s.poison();
    for (auto [host, dev] : {std::pair{&c.k, &dk}, std::pair{&c.v, &dv}, std::pair{&o.v, &dout}, std::pair{&o.s, &dsout}}) {
      char* base = static_cast<char*>(dev->view().data()) - host->view_byte_offset();
      ASSERT_EQ(cudaMemcpy(base, host->raw_bytes().data(), host->raw_bytes().size(), cudaMemcpyHostToDevice), cudaSuccess);
    }
    device_synchronize();  // the copies ran on the legacy stream; the graph runs on a non-blocking one
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    HostTensor got_o = o.v, got_s = o.s, got_k = c.k, got_v = c.v;
    dout.copy_back(got_o);
    dsout.copy_back(got_s);
    dk.copy_back(got_k);
    dv.copy_back(got_v);
    check_merged(got_o, got_s, want);
    EXPECT_TRUE(same_bytes(got_k.raw_bytes(), want_k, "k cache"));
    EXPECT_TRUE(same_bytes(got_v.raw_bytes(), want_v, "v cache"));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// ---- host-side errors of CUDA calls ---------------------------------------------------------------
// Memory that a cuda:0 view may point at: real device memory where there is a device, else a host
// buffer (every call below fails on the host before anything could touch it).
class Cuda0Buffer {
 public:
  explicit Cuda0Buffer(size_t bytes) : host_(bytes + 64, 0) {
    if (gpu_available()) dev_ = std::make_unique<DeviceBytes>(int64_t(bytes + 64));
  }
  // 16-byte-aligned start plus `offset` bytes.
  char* at(size_t offset = 0) const {
    char* base = dev_ ? static_cast<char*>(dev_->view().data()) : const_cast<char*>(host_.data());
    auto a = reinterpret_cast<uintptr_t>(base);
    return reinterpret_cast<char*>((a + 15) / 16 * 16) + offset;
  }
  std::vector<uint8_t> bytes(size_t n) const {  // the first n bytes from at(0)
    std::vector<uint8_t> out(n);
    if (dev_) check(cudaMemcpy(out.data(), at(), n, cudaMemcpyDeviceToHost));
    else std::memcpy(out.data(), at(), n);
    return out;
  }

 private:
  static void check(cudaError_t e) { ASSERT_EQ(e, cudaSuccess); }
  std::vector<char> host_;
  std::unique_ptr<DeviceBytes> dev_;
};

constexpr kvattn::Device kCuda0 = kvattn::Device::cuda(0);

TEST(GpuOpsErrors, MergeArgumentsAreCheckedOnTheHostByMessage) {
  const int64_t n = 4, H = 2, D = 16;
  Cuda0Buffer va(n * H * D * 4), vb(n * H * D * 4), vo(n * H * D * 4), sa(n * H * 4), sb(n * H * 4), so(n * H * 4), m(n);
  std::vector<float> host_s(size_t(n * H), 0.0f);
  auto V = [](const Cuda0Buffer& b, DType t, size_t off = 0) { return TensorView(b.at(off), t, {n, H, D}, kCuda0); };
  auto S = [](const Cuda0Buffer& b, size_t off = 0) { return TensorView(b.at(off), DType::f32, {n, H}, kCuda0); };
  const auto before = vo.bytes(n * H * D * 4), s_before = so.bytes(n * H * 4);
  // Mixed devices.
  EXPECT_KVATTN_ERROR(kvattn::merge_state(V(va, DType::bf16), S(sa), V(vb, DType::bf16), TensorView(host_s.data(), DType::f32, {n, H}),
                                          V(vo, DType::bf16), S(so)),
                      "s_b is on cpu but v_a is on cuda:0");
  EXPECT_KVATTN_ERROR(kvattn::merge_state_in_place(V(va, DType::f16), S(sa), V(vb, DType::f16), S(sb),
                                                   TensorView(host_s.data(), DType::u8, {n})),
                      "mask is on cpu but v is on cuda:0");
  EXPECT_KVATTN_ERROR(kvattn::merge_states(TensorView(va.at(), DType::f32, {n, 1, H, D}, kCuda0),
                                           TensorView(sa.at(), DType::f32, {n, 1, H}, kCuda0),
                                           TensorView(vo.at(), DType::f32, {n, H, D}, kvattn::Device::cuda(1)), S(so)),
                      "v_out is on cuda:1 but v is on cuda:0");
  // Dtypes.
  EXPECT_KVATTN_ERROR(kvattn::merge_state(V(va, DType::bf16), S(sa), V(vb, DType::f16), S(sb), V(vo, DType::bf16), S(so)),
                      "v_b has dtype f16 but v_a has dtype bf16; they must match");
  EXPECT_KVATTN_ERROR(kvattn::merge_state_in_place(V(va, DType::bf16), S(sa), V(vb, DType::bf16), S(sb),
                                                   TensorView(m.at(), DType::i32, {n}, kCuda0)),
                      "mask has dtype i32 but u8 is expected");
  // Misaligned (a sticky CUDA error if launched): one byte off for bf16, two for f32 values and LSEs.
  EXPECT_KVATTN_ERROR(kvattn::merge_state(V(va, DType::bf16, 1), S(sa), V(vb, DType::bf16), S(sb), V(vo, DType::bf16), S(so)),
                      "v_a starts at address");
  EXPECT_KVATTN_ERROR(kvattn::merge_state(V(va, DType::bf16), S(sa), V(vb, DType::bf16), S(sb), V(vo, DType::f32, 2), S(so)),
                      "which is not a multiple of its element size (4 bytes");
  EXPECT_KVATTN_ERROR(kvattn::merge_state_in_place(V(va, DType::f16), S(sa, 2), V(vb, DType::f16), S(sb)),
                      "s starts at address");
  EXPECT_KVATTN_ERROR(kvattn::merge_states(TensorView(va.at(1), DType::bf16, {n, 1, H, D}, kCuda0),
                                           TensorView(sa.at(), DType::f32, {n, 1, H}, kCuda0), V(vo, DType::bf16), S(so)),
                      "v starts at address");
  // Strides: the head dim must be contiguous.
  EXPECT_KVATTN_ERROR(kvattn::merge_state(V(va, DType::f32), S(sa), V(vb, DType::f32), S(sb),
                                          TensorView(vo.at(), DType::f32, {n, H, D / 2}, {H * D, D, 2}, kCuda0), S(so)),
                      "v_out must be contiguous in its last (head) dimension");
  EXPECT_EQ(vo.bytes(n * H * D * 4), before) << "a rejected merge wrote its output";
  EXPECT_EQ(so.bytes(n * H * 4), s_before) << "a rejected merge wrote its LSE";
}

TEST(GpuOpsErrors, AppendArgumentsAreCheckedOnTheHostByMessage) {
  const int64_t P = 4, S = 16, H = 2, D = 16, nnz = 3;
  Cuda0Buffer k(P * S * H * D * 2), v(P * S * H * D * 2), ak(nnz * H * D * 4), av(nnz * H * D * 4), idx(256);
  std::vector<int32_t> host_idx(8, 0);
  const auto k_before = k.bytes(P * S * H * D * 2), v_before = v.bytes(P * S * H * D * 2);
  auto I = [&](size_t off, int64_t len, DType t = DType::i32) { return TensorView(idx.at(off), t, {len}, kCuda0); };
  const TensorView AK(ak.at(), DType::bf16, {nnz, H, D}, kCuda0), AV(av.at(), DType::bf16, {nnz, H, D}, kCuda0);
  const auto cache = kvattn::PagedKVCache::split(TensorView(k.at(), DType::bf16, {P, S, H, D}, kCuda0),
                                                 TensorView(v.at(), DType::bf16, {P, S, H, D}, kCuda0), KVLayout::NHD);
  const kvattn::PageTable table{I(0, 3), I(16, 4), I(48, 2)};
  const TensorView BI = I(64, nnz), POS = I(96, nnz);
  // Index arrays on the host with a CUDA cache: rejected, nothing copied.
  EXPECT_KVATTN_ERROR(kvattn::append_paged_kv_cache(AK, AV, TensorView(host_idx.data(), DType::i32, {nnz}), POS, cache, table),
                      "batch_indices is on cpu but the paged cache is on cuda:0; with a CUDA cache, batch_indices, "
                      "positions and the page table are int32 tensors on the cache's device");
  EXPECT_KVATTN_ERROR(kvattn::append_paged_kv_cache(AK, AV, BI, POS, cache,
                                                    {I(0, 3), TensorView(host_idx.data(), DType::i32, {4}), I(48, 2)}),
                      "kv_indices is on cpu but the paged cache is on cuda:0");
  // Mixed devices among the value tensors.
  EXPECT_KVATTN_ERROR(kvattn::append_paged_kv_cache(AK, TensorView(av.at(), DType::bf16, {nnz, H, D}), BI, POS, cache, table),
                      "append_v is on cpu but append_k is on cuda:0");
  // Dtypes and shapes of the device index arrays.
  EXPECT_KVATTN_ERROR(kvattn::append_paged_kv_cache(AK, AV, BI, I(96, nnz, DType::f32), cache, table),
                      "positions has dtype f32 but i32 is expected");
  EXPECT_KVATTN_ERROR(kvattn::append_paged_kv_cache(AK, AV, I(64, nnz + 1), POS, cache, table),
                      "batch_indices has 4 elements but 3 are expected");
  EXPECT_KVATTN_ERROR(kvattn::append_paged_kv_cache(AK, AV, BI, POS, cache, {I(0, 3), I(16, 4), I(48, 3)}),
                      "kv_last_page_len has 3 elements but 2 are expected");
  EXPECT_KVATTN_ERROR(kvattn::append_paged_kv_cache(AK, AV, BI, POS, cache, {I(0, 0), I(16, 4), I(48, 0)}),
                      "kv_indptr must have at least one element (batch_size + 1)");
  EXPECT_KVATTN_ERROR(kvattn::append_paged_kv_cache(AK, AV, BI, TensorView(idx.at(96), DType::i32, {nnz}, {2}, kCuda0), cache, table),
                      "positions must be contiguous");
  EXPECT_KVATTN_ERROR(kvattn::append_paged_kv_cache(AK, AV, BI, POS, cache, {I(0, 3), TensorView(), I(48, 2)}),
                      "kv_indices is required but was not given");
  // Misaligned: an index array two bytes off, the cache one byte off (bf16), f32 rows two bytes off.
  EXPECT_KVATTN_ERROR(kvattn::append_paged_kv_cache(AK, AV, I(66, nnz), POS, cache, table),
                      "batch_indices starts at address");
  EXPECT_KVATTN_ERROR(kvattn::append_paged_kv_cache(
                          AK, AV, BI, POS,
                          kvattn::PagedKVCache::split(TensorView(k.at(1), DType::bf16, {P, S, H, D}, kCuda0),
                                                      TensorView(v.at(), DType::bf16, {P, S, H, D}, kCuda0), KVLayout::NHD),
                          table),
                      "paged k starts at address");
  EXPECT_KVATTN_ERROR(kvattn::append_paged_kv_cache(TensorView(ak.at(2), DType::f32, {nnz, H, D}, kCuda0), AV, BI, POS, cache, table),
                      "append_k starts at address");
  // Dtype of the values: fp8 rows are fine, integer rows are not.
  EXPECT_KVATTN_ERROR(kvattn::append_paged_kv_cache(TensorView(ak.at(), DType::i32, {nnz, H, D}, kCuda0), AV, BI, POS, cache, table),
                      "append_k has dtype i32; expected a float dtype");
  EXPECT_EQ(k.bytes(P * S * H * D * 2), k_before) << "a rejected append wrote the k cache";
  EXPECT_EQ(v.bytes(P * S * H * D * 2), v_before) << "a rejected append wrote the v cache";
}

// Without a device, a valid CUDA call says so instead of launching anything.
TEST(GpuOpsErrors, NoDeviceIsAClearError) {
  if (gpu_available()) GTEST_SKIP() << "a CUDA device is present";
  const int64_t n = 2, H = 1, D = 8;
  Cuda0Buffer buf(4096);
  const TensorView v(buf.at(), DType::f32, {n, H, D}, kCuda0), s(buf.at(256), DType::f32, {n, H}, kCuda0);
  EXPECT_KVATTN_ERROR(kvattn::merge_state(v, s, v, s, v, s), "no CUDA device: ");
  EXPECT_KVATTN_ERROR(kvattn::merge_state(v, s, v, s, v, s), "(needed for v_a on cuda:0)");
  EXPECT_KVATTN_ERROR(kvattn::merge_states(TensorView(buf.at(), DType::f32, {n, 0, H, D}, kCuda0),
                                           TensorView(buf.at(), DType::f32, {n, 0, H}, kCuda0), v, s),
                      "no CUDA device: ");
}

#else  // !KVATTN_WITH_CUDA

TEST(GpuOps, NeedsTheCudaBackend) { GTEST_SKIP() << "this build has no CUDA backend"; }

#endif

}  // namespace
}  // namespace kvattn_test
