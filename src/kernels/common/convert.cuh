// Bit-exact scalar conversions between kvattn's float dtypes and f32, for host and device code.
// They reproduce the CPU backend's converters (src/core/convert.h) bit for bit, NaNs included:
// round-to-nearest-even everywhere, f16/bf16 overflow to infinity, fp8 saturating at its largest
// finite value (as NVIDIA's __NV_SATFINITE) with a NaN becoming 0x7f. Only integer operations, so
// the same function gives the same bits on any target (no dependence on the PTX cvt's NaN rules,
// and fp8 stores work on sm_80, which has no fp8 cvt). The GPU append kernel uses them, so a value
// appended on the GPU is the value the CPU appends; ptx.cuh's faster loads stay for the attention
// kernels (they agree with these on every non-NaN input). Unit-tested on the host against
// src/core/convert.h (GpuOpsConvert.*).
#pragma once

#include "kernels/common/host_device.cuh"

#if !defined(__CUDACC_RTC__)
#include <cstring>
#endif

namespace kvattn::kernels::cvt {

KVATTN_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

KVATTN_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// Index (0-based) of the highest set bit of x != 0.
KVATTN_HD int top_bit(uint32_t x) {
  int p = 0;
  while (x >>= 1) ++p;
  return p;
}

// x / 2^shift rounded to nearest, ties to even (shift >= 1; any x < 2^31).
KVATTN_HD uint32_t shift_round_even(uint32_t x, int shift) {
  if (shift >= 32) return 0;  // x < 2^31 <= half of 2^shift: rounds to 0
  const uint32_t q = x >> shift, rest = x & ((1u << shift) - 1u), half = 1u << (shift - 1);
  return q + ((rest > half || (rest == half && (q & 1u))) ? 1u : 0u);
}

// ---- to f32 (exact: every value of these formats is an f32) -----------------------------------
KVATTN_HD uint32_t bf16_to_f32_bits(uint16_t h) { return uint32_t(h) << 16; }

KVATTN_HD uint32_t f16_to_f32_bits(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return sign | 0x7f800000u | (mant << 13);  // inf, NaN (payload kept)
  if (exp == 0) {
    if (mant == 0) return sign;
    const int p = top_bit(mant);  // mant * 2^-24 = 1.f * 2^(p - 24)
    return sign | (uint32_t(p + 103) << 23) | ((mant << (23 - p)) & 0x7fffffu);
  }
  return sign | ((exp + 112) << 23) | (mant << 13);
}

// Minifloat with E exponent bits and M mantissa bits; kIeee: the all-ones exponent is inf/NaN
// (e5m2), else only S.1111.111 is NaN (e4m3fn). A NaN becomes the f32 quiet NaN with its sign.
template <int E, int M, bool kIeee>
KVATTN_HD uint32_t fp8_to_f32_bits(uint8_t x) {
  constexpr int bias = (1 << (E - 1)) - 1;
  constexpr uint32_t emax = (1u << E) - 1, mmax = (1u << M) - 1;
  const uint32_t sign = uint32_t(x & 0x80u) << 24, exp = (x >> M) & emax, mant = x & mmax;
  if (kIeee && exp == emax) return sign | (mant ? 0x7fc00000u : 0x7f800000u);
  if (!kIeee && exp == emax && mant == mmax) return sign | 0x7fc00000u;
  if (exp == 0) {
    if (mant == 0) return sign;
    const int p = top_bit(mant);  // mant * 2^(1 - bias - M) = 1.f * 2^(p + 1 - bias - M)
    return sign | (uint32_t(p + 1 - bias - M + 127) << 23) | ((mant << (23 - p)) & 0x7fffffu);
  }
  return sign | ((exp - bias + 127) << 23) | (mant << (23 - M));
}

KVATTN_HD uint32_t e4m3_to_f32_bits(uint8_t x) { return fp8_to_f32_bits<4, 3, false>(x); }
KVATTN_HD uint32_t e5m2_to_f32_bits(uint8_t x) { return fp8_to_f32_bits<5, 2, true>(x); }

// ---- from f32 ----------------------------------------------------------------------------------
KVATTN_HD uint16_t f32_to_bf16_bits(uint32_t u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

KVATTN_HD uint16_t f32_to_f16_bits(uint32_t u) {
  const uint32_t sign = (u >> 16) & 0x8000u, abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                                  // below 2^-14: subnormal or zero
    const uint32_t e = abs >> 23;
    if (e == 0) return uint16_t(sign);  // an f32 subnormal is far below 2^-25
    // abs = (2^23 + mant) * 2^(e - 150); in quanta of 2^-24: (2^23 + mant) * 2^(e - 126).
    const uint32_t sig = (abs & 0x7fffffu) | 0x800000u;
    return uint16_t(sign | shift_round_even(sig, int(126 - e)));  // 1024 is the smallest normal
  }
  const uint32_t mant = abs & 0x7fffffu, exp = (abs >> 23) - 112;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent
  return uint16_t(sign | h);
}

// Round to nearest even, saturating at the largest finite code kMaxCode; NaN -> 0x7f.
template <int E, int M, uint8_t kMaxCode>
KVATTN_HD uint8_t f32_to_fp8_bits(uint32_t u) {
  constexpr int bias = (1 << (E - 1)) - 1;
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7f;
  // The largest finite value, as f32 bits (e4m3fn: 448; e5m2: 57344).
  constexpr uint32_t max_bits =
      (uint32_t((kMaxCode >> M) - bias + 127) << 23) | (uint32_t(kMaxCode & ((1 << M) - 1)) << (23 - M));
  if (abs >= max_bits) return uint8_t(sign | kMaxCode);  // infinities included
  const int fe = int(abs >> 23);
  if (fe == 0) return sign;  // f32 subnormal or zero: far below half the smallest fp8 quantum
  const int ue = fe - 127;                         // abs = sig * 2^(ue - 23)
  const int e = ue > 1 - bias ? ue : 1 - bias;     // clamped to the subnormal range
  const uint32_t sig = (abs & 0x7fffffu) | 0x800000u;
  int e_out = e;
  uint32_t q = shift_round_even(sig, 23 - M + e - ue);  // quanta of 2^(e - M)
  if (q == (2u << M)) { ++e_out; q = 1u << M; }         // rounded up into the next binade
  if (q < (1u << M)) return uint8_t(sign | q);          // subnormal (or zero)
  const uint32_t code = (uint32_t(e_out + bias) << M) | (q - (1u << M));
  return uint8_t(sign | (code > kMaxCode ? kMaxCode : code));
}

KVATTN_HD uint8_t f32_to_e4m3_bits(uint32_t u) { return f32_to_fp8_bits<4, 3, 0x7e>(u); }
KVATTN_HD uint8_t f32_to_e5m2_bits(uint32_t u) { return f32_to_fp8_bits<5, 2, 0x7b>(u); }

// ---- typed element access (DT numbered as kvattn::DType: 0 f32, 1 f16, 2 bf16, 3 e4m3, 4 e5m2) --
template <int DT>
KVATTN_HD float load_f32(const void* p, int64_t i) {
  if constexpr (DT == 0) return static_cast<const float*>(p)[i];
  else if constexpr (DT == 1) return bits_f32(f16_to_f32_bits(static_cast<const uint16_t*>(p)[i]));
  else if constexpr (DT == 2) return bits_f32(bf16_to_f32_bits(static_cast<const uint16_t*>(p)[i]));
  else if constexpr (DT == 3) return bits_f32(e4m3_to_f32_bits(static_cast<const uint8_t*>(p)[i]));
  else return bits_f32(e5m2_to_f32_bits(static_cast<const uint8_t*>(p)[i]));
}

template <int DT>
KVATTN_HD void store_f32(void* p, int64_t i, float v) {
  if constexpr (DT == 0) static_cast<float*>(p)[i] = v;
  else if constexpr (DT == 1) static_cast<uint16_t*>(p)[i] = f32_to_f16_bits(f32_bits(v));
  else if constexpr (DT == 2) static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(f32_bits(v));
  else if constexpr (DT == 3) static_cast<uint8_t*>(p)[i] = f32_to_e4m3_bits(f32_bits(v));
  else static_cast<uint8_t*>(p)[i] = f32_to_e5m2_bits(f32_bits(v));
}

}  // namespace kvattn::kernels::cvt
