// Scalar conversions between kvattn's float dtypes and f32 on the host (the CPU backend's loads
// and stores). Rounding to narrower types is round-to-nearest-even; fp8 saturates to its max
// finite value (as NVIDIA's __nv_cvt_float_to_fp8 with __NV_SATFINITE).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kvattn/dtype.h"

namespace kvattn::convert {

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    float v = std::ldexp(float(mant), -24);
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}
inline uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f), sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);      // NaN
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);     // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                                     // below 2^-14: subnormal or zero
    float a = bits_f32(abs);
    float scaled = a * 16777216.0f;                            // units of 2^-24
    uint32_t m = uint32_t(std::nearbyint(scaled));             // ties to even (default mode)
    return uint16_t(sign | m);
  }
  uint32_t mant = abs & 0x7fffffu, exp = (abs >> 23) - 112;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

// Generic minifloat with `E` exponent bits and `M` mantissa bits.
template <int E, int M, bool kHasInf>
inline float fp8_to_f32(uint8_t x) {
  constexpr int bias = (1 << (E - 1)) - 1;
  int sign = x >> 7, exp = (x >> M) & ((1 << E) - 1), mant = x & ((1 << M) - 1);
  float v;
  if (kHasInf && exp == (1 << E) - 1) {
    v = mant ? NAN : INFINITY;
  } else if (!kHasInf && exp == (1 << E) - 1 && mant == (1 << M) - 1) {
    v = NAN;  // e4m3fn: S.1111.111 is the only NaN
  } else if (exp == 0) {
    v = std::ldexp(float(mant), 1 - bias - M);
  } else {
    v = std::ldexp(float(mant + (1 << M)), exp - bias - M);
  }
  return sign ? -v : v;
}
// Rounds to nearest even, saturating at the largest finite value (max_code: its encoding).
template <int E, int M, uint8_t kMaxCode>
inline uint8_t f32_to_fp8(float f) {
  constexpr int bias = (1 << (E - 1)) - 1;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  if (std::isnan(f)) return 0x7f;  // a NaN in both formats
  const float max_finite = std::fabs(fp8_to_f32<E, M, (kMaxCode != 0x7e)>(kMaxCode));
  float a = std::fabs(f);
  if (a >= max_finite) return uint8_t(sign | kMaxCode);
  int exp2;
  std::frexp(a, &exp2);              // a = m * 2^exp2, m in [0.5, 1)
  int e = std::max(exp2 - 1, 1 - bias);  // unbiased exponent, clamped to the subnormal range
  long q = std::lrint(std::ldexp(a, M - e));  // quanta of 2^(e - M), ties to even
  if (q == (2L << M)) { ++e; q = 1L << M; }   // rounded up into the next binade
  if (q < (1L << M)) return uint8_t(sign | q);  // subnormal (or zero)
  uint8_t code = uint8_t(((e + bias) << M) | (q - (1L << M)));
  return uint8_t(sign | (code > kMaxCode ? kMaxCode : code));
}

inline float e4m3_to_f32(uint8_t x) { return fp8_to_f32<4, 3, false>(x); }
inline float e5m2_to_f32(uint8_t x) { return fp8_to_f32<5, 2, true>(x); }
inline uint8_t f32_to_e4m3(float f) { return f32_to_fp8<4, 3, 0x7e>(f); }
inline uint8_t f32_to_e5m2(float f) { return f32_to_fp8<5, 2, 0x7b>(f); }

// Element `i` of a float-typed buffer as f32.
inline float load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::e4m3: return e4m3_to_f32(static_cast<const uint8_t*>(p)[i]);
    case DType::e5m2: return e5m2_to_f32(static_cast<const uint8_t*>(p)[i]);
    default: return NAN;
  }
}
inline void store(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = v; break;
    case DType::f16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::e4m3: static_cast<uint8_t*>(p)[i] = f32_to_e4m3(v); break;
    case DType::e5m2: static_cast<uint8_t*>(p)[i] = f32_to_e5m2(v); break;
    default: break;
  }
}

// n contiguous elements to f32 (the hot loop of the CPU backend: one switch per row).
inline void load_row(const void* p, DType t, int n, float* dst) {
  switch (t) {
    case DType::f32: std::memcpy(dst, p, sizeof(float) * n); break;
    case DType::f16: { auto s = static_cast<const uint16_t*>(p); for (int i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]); } break;
    case DType::bf16: { auto s = static_cast<const uint16_t*>(p); for (int i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]); } break;
    case DType::e4m3: { auto s = static_cast<const uint8_t*>(p); for (int i = 0; i < n; ++i) dst[i] = e4m3_to_f32(s[i]); } break;
    case DType::e5m2: { auto s = static_cast<const uint8_t*>(p); for (int i = 0; i < n; ++i) dst[i] = e5m2_to_f32(s[i]); } break;
    default: for (int i = 0; i < n; ++i) dst[i] = NAN;
  }
}
inline void store_row(void* p, DType t, int n, const float* src) {
  if (t == DType::f32) { std::memcpy(p, src, sizeof(float) * n); return; }
  for (int i = 0; i < n; ++i) store(p, t, i, src[i]);
}

}  // namespace kvattn::convert
