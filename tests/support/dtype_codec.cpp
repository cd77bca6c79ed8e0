#include "support/dtype_codec.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/convert.h"  // encoding only

namespace kvattn_test {

namespace {
// A binary float with `ebits` exponent bits, `mbits` mantissa bits and the given bias;
// ieee_specials: the all-ones exponent means infinity (mantissa 0) or NaN. e4m3fn has no such
// exponent (its only NaN, S.1111.111, is handled by its caller).
double decode_minifloat(uint64_t bits, int ebits, int mbits, int bias, bool ieee_specials) {
  const bool neg = (bits >> (ebits + mbits)) & 1;
  const uint64_t e = (bits >> mbits) & ((uint64_t(1) << ebits) - 1);
  const uint64_t m = bits & ((uint64_t(1) << mbits) - 1);
  double v;
  if (ieee_specials && e == (uint64_t(1) << ebits) - 1) {
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    v = std::ldexp(double(m), 1 - bias - mbits);  // subnormal: 0.m * 2^(1 - bias)
  } else {
    v = std::ldexp(double(m) / double(uint64_t(1) << mbits) + 1.0, int(e) - bias);
  }
  return neg ? -v : v;
}
}  // namespace

double decode_f32(uint32_t bits) { return decode_minifloat(bits, 8, 23, 127, true); }
double decode_f16(uint16_t bits) { return decode_minifloat(bits, 5, 10, 15, true); }
double decode_bf16(uint16_t bits) { return decode_minifloat(bits, 8, 7, 127, true); }
double decode_e5m2(uint8_t bits) { return decode_minifloat(bits, 5, 2, 15, true); }
double decode_e4m3(uint8_t bits) {
  if ((bits & 0x7f) == 0x7f) return std::numeric_limits<double>::quiet_NaN();
  return decode_minifloat(bits, 4, 3, 7, false);
}

void encode(void* p, kvattn::DType t, int64_t i, double x) {
  kvattn::convert::store(p, t, i, float(x));  // double -> f32 is exact or rounds once (f32 case)
}

double decode(const void* p, kvattn::DType t, int64_t i) {
  using kvattn::DType;
  switch (t) {
    case DType::f32: {
      uint32_t b;
      std::memcpy(&b, static_cast<const char*>(p) + 4 * i, 4);
      return decode_f32(b);
    }
    case DType::f16:
    case DType::bf16: {
      uint16_t b;
      std::memcpy(&b, static_cast<const char*>(p) + 2 * i, 2);
      return t == DType::f16 ? decode_f16(b) : decode_bf16(b);
    }
    case DType::e4m3: return decode_e4m3(static_cast<const uint8_t*>(p)[i]);
    case DType::e5m2: return decode_e5m2(static_cast<const uint8_t*>(p)[i]);
    default: return std::numeric_limits<double>::quiet_NaN();
  }
}

double representable(double x, kvattn::DType t) {
  alignas(8) unsigned char buf[8];
  encode(buf, t, 0, x);
  return decode(buf, t, 0);
}

}  // namespace kvattn_test
