// Helpers of the stand-alone operation tests (ops_*_test.cpp): typed host buffers, a dtype codec
// written independently of src/ (every finite value of a format enumerated, rounding by search),
// fresh seeds that are printed, and an element checker. Everything lives in namespace ops_test so
// that it cannot collide with other test helpers linked into the same binary.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kvattn/kvattn.h"
#if KVATTN_WITH_CUDA
#include "cuda/runtime.h"
#endif

namespace ops_test {

using kvattn::DType;
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- seeds --------------------------------------------------------------------------------------
// A fresh seed per test (KVATTN_TEST_SEED=N reproduces one), printed and attached to failures.
inline uint64_t fresh_seed() {
  if (const char* s = std::getenv("KVATTN_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd();
}
#define OPS_TEST_RNG(rng)                                                                \
  const uint64_t rng##_seed = ::ops_test::fresh_seed();                                  \
  std::printf("[ seed     ] %s: KVATTN_TEST_SEED=%llu\n",                                \
              ::testing::UnitTest::GetInstance()->current_test_info()->name(),           \
              static_cast<unsigned long long>(rng##_seed));                              \
  SCOPED_TRACE("KVATTN_TEST_SEED=" + std::to_string(rng##_seed));                        \
  std::mt19937_64 rng(rng##_seed)

inline double uniform(std::mt19937_64& g, double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(g);
}
inline int64_t randint(std::mt19937_64& g, int64_t lo, int64_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<int64_t>(lo, hi)(g);
}

// ---- dtype codec (independent of src/core/convert.h) ---------------------------------------------
// decode: the exact value of a code, from the format's definition. encode: round to nearest, ties to
// the even code, by binary search over every non-negative finite value; fp8 saturates at its largest
// finite value (as __NV_SATFINITE), f16/bf16 overflow to inf.
struct Format {
  int bits, exp_bits, man_bits;
  bool ieee_inf;  // the all-ones exponent is inf/NaN (false: e4m3fn, only S.1111.111 is NaN)
};
inline Format format_of(DType t) {
  switch (t) {
    case DType::f16: return {16, 5, 10, true};
    case DType::bf16: return {16, 8, 7, true};
    case DType::e4m3: return {8, 4, 3, false};
    case DType::e5m2: return {8, 5, 2, true};
    default: return {32, 8, 23, true};
  }
}
inline double decode_bits(DType t, uint32_t code) {
  if (t == DType::f32) { float f; std::memcpy(&f, &code, 4); return f; }
  const Format f = format_of(t);
  const uint32_t sign = code >> (f.bits - 1);
  const uint32_t e = (code >> f.man_bits) & ((1u << f.exp_bits) - 1);
  const uint32_t m = code & ((1u << f.man_bits) - 1);
  const int bias = (1 << (f.exp_bits - 1)) - 1;
  const uint32_t emax = (1u << f.exp_bits) - 1;
  double v;
  if (f.ieee_inf && e == emax) v = m ? std::nan("") : kInf;
  else if (!f.ieee_inf && e == emax && m == (1u << f.man_bits) - 1) v = std::nan("");
  else if (e == 0) v = std::ldexp(double(m), 1 - bias - f.man_bits);
  else v = std::ldexp(double(m + (1u << f.man_bits)), int(e) - bias - f.man_bits);
  return sign ? -v : v;
}
struct Table {
  std::vector<double> value;  // ascending non-negative finite values
  std::vector<uint32_t> code;
};
inline const Table& table_of(DType t) {
  static Table tables[8];
  static bool built[8] = {};
  const int i = int(t);
  if (!built[i]) {
    const Format f = format_of(t);
    for (uint32_t c = 0; c < (1u << (f.bits - 1)); ++c) {
      double v = decode_bits(t, c);
      if (std::isfinite(v)) { tables[i].value.push_back(v); tables[i].code.push_back(c); }
    }
    built[i] = true;  // codes ascend with value for every format here
  }
  return tables[i];
}
inline uint32_t encode_bits(DType t, double x) {
  if (t == DType::f32) { float f = float(x); uint32_t u; std::memcpy(&u, &f, 4); return u; }
  const Format f = format_of(t);
  const uint32_t sign = std::signbit(x) ? 1u << (f.bits - 1) : 0u;
  if (std::isnan(x)) return (1u << (f.bits - 1)) - 1;  // the all-ones code: NaN in every format
  const Table& tb = table_of(t);
  const double a = std::fabs(x), top = tb.value.back();
  if (a >= top) {
    if (!f.ieee_inf) return sign | tb.code.back();  // saturate
    // IEEE overflow: above max + half an ulp rounds to inf (exactly half: to even, i.e. inf).
    const double ulp = top - tb.value[tb.value.size() - 2];
    if (a < top + ulp / 2) return sign | tb.code.back();
    if (t == DType::e5m2) return sign | tb.code.back();  // fp8 e5m2: saturate as well
    return sign | (((1u << f.exp_bits) - 1) << f.man_bits);
  }
  auto it = std::upper_bound(tb.value.begin(), tb.value.end(), a);
  size_t hi = size_t(it - tb.value.begin()), lo = hi - 1;
  const double dl = a - tb.value[lo], dh = tb.value[hi] - a;
  const size_t pick = dl < dh ? lo : dh < dl ? hi : ((tb.code[lo] & 1u) ? hi : lo);
  return sign | tb.code[pick];
}
inline double round_to(DType t, double x) { return decode_bits(t, encode_bits(t, x)); }
inline double unit_roundoff(DType t) {  // half an ulp, relative
  return t == DType::f32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -format_of(t).man_bits - 1);
}
// Half the subnormal spacing: the absolute rounding error where the relative bound no longer holds
// (f16: 2^-25, about 3e-8).
inline double half_subnormal_spacing(DType t) {
  const Format f = format_of(t);
  const int emin = 2 - (1 << (f.exp_bits - 1));  // the smallest normal exponent
  return std::ldexp(1.0, emin - f.man_bits - 1);
}

// ---- host buffers --------------------------------------------------------------------------------
// A byte buffer of `n` elements of one dtype, filled with the 0xff poison (NaN in every float
// dtype), read and written as doubles.
class Buf {
 public:
  Buf() = default;
  Buf(DType t, int64_t n) : t_(t), n_(n), bytes_(size_t(n) * kvattn::dtype_size(t), 0xff) {}
  DType dtype() const { return t_; }
  int64_t size() const { return n_; }
  void* data() { return bytes_.empty() ? nullptr : bytes_.data(); }
  uint32_t bits(int64_t i) const {
    uint32_t u = 0;
    std::memcpy(&u, &bytes_[size_t(i) * esz()], esz());
    return u;
  }
  void set_bits(int64_t i, uint32_t u) { std::memcpy(&bytes_[size_t(i) * esz()], &u, esz()); }
  double get(int64_t i) const { return decode_bits(t_, bits(i)); }
  void set(int64_t i, double v) { set_bits(i, encode_bits(t_, v)); }  // rounds to the dtype
  bool poisoned(int64_t i) const {
    for (size_t b = 0; b < esz(); ++b)
      if (bytes_[size_t(i) * esz() + b] != 0xff) return false;
    return true;
  }
  const std::vector<uint8_t>& raw() const { return bytes_; }
  kvattn::TensorView view(std::initializer_list<int64_t> shape,
                          std::initializer_list<int64_t> strides, int64_t offset = 0,
                          kvattn::Device dev = kvattn::Device::cpu()) {
    return kvattn::TensorView(static_cast<char*>(data()) + offset * int64_t(esz()), t_, shape,
                              strides, dev);
  }
  kvattn::TensorView view(std::initializer_list<int64_t> shape,
                          kvattn::Device dev = kvattn::Device::cpu()) {
    return kvattn::TensorView(data(), t_, shape, dev);
  }

 private:
  size_t esz() const { return kvattn::dtype_size(t_); }
  DType t_ = DType::f32;
  int64_t n_ = 0;
  std::vector<uint8_t> bytes_;
};

// i32 / u8 host arrays.
inline kvattn::TensorView i32_view(std::vector<int32_t>& v) {
  return kvattn::TensorView(v.data(), DType::i32, {int64_t(v.size())});
}

// ---- checks --------------------------------------------------------------------------------------
// Accumulates element checks; reports the count, the worst and the first few failures.
class Checker {
 public:
  explicit Checker(std::string what) : what_(std::move(what)) {}
  void close(double got, double want, double tol, const std::string& where) {
    ++n_;
    bool ok;
    if (std::isnan(want)) ok = std::isnan(got);
    else if (std::isinf(want)) ok = got == want;
    else ok = std::fabs(got - want) <= tol;  // false for a NaN got
    if (!ok) fail(got, want, tol, where);
  }
  void exact(double got, double want, const std::string& where) { close(got, want, 0.0, where); }
  void truth(bool ok, const std::string& where) {
    ++n_;
    if (!ok) fail(0, 0, 0, where);
  }
  ::testing::AssertionResult result() const {
    if (bad_ == 0) return ::testing::AssertionSuccess() << n_ << " checks";
    return ::testing::AssertionFailure() << what_ << ": " << bad_ << " of " << n_
                                         << " elements are off; first: " << first_.str();
  }

 private:
  void fail(double got, double want, double tol, const std::string& where) {
    if (bad_++ < 5)
      first_ << "\n  " << where << ": got " << got << ", expected " << want << " (tol " << tol
             << ")";
  }
  std::string what_;
  int64_t n_ = 0, bad_ = 0;
  std::ostringstream first_;
};

// Runs fn and expects a kvattn::Error whose message contains `needle`.
template <class Fn>
::testing::AssertionResult throws_with(Fn&& fn, const std::string& needle) {
  try {
    fn();
  } catch (const kvattn::Error& e) {
    if (std::string(e.what()).find(needle) != std::string::npos)
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "message \"" << e.what() << "\" lacks \"" << needle
                                         << "\"";
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-kvattn exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw (expected \"" << needle << "\")";
}

inline std::string idx(std::initializer_list<int64_t> i) {
  std::string s = "[";
  for (int64_t v : i) s += (s.size() > 1 ? ", " : "") + std::to_string(v);
  return s + "]";
}

inline const DType kFloatDtypes[] = {DType::f32, DType::f16, DType::bf16};

// Calls on tensors labelled cuda:0 whose memory is on the host: builds without the CUDA backend
// reject the device, CUDA builds on a machine without a device say so. Where a device is present
// such a call would launch a kernel on host memory, so the CPU suites leave it out
// (gpu_ops_test.cpp covers CUDA tensors).
inline bool cuda_device_present() {
#if KVATTN_WITH_CUDA
  return kvattn::cuda::cuda_available();
#else
  return false;
#endif
}
// The message such a call fails with here, for the argument `name` it names.
inline std::string no_cuda_message(const std::string& name) {
#if KVATTN_WITH_CUDA
  return "no CUDA device: ";  // "... (needed for <name> on cuda:0)"
#else
  return name + " is on cuda:0 but this build of kvattn has no CUDA backend; pass host (cpu) tensors";
#endif
}

}  // namespace ops_test
