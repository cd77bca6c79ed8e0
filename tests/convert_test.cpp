// The library's host conversions (src/core/convert.h) against the tests' own decoders
// (support/dtype_codec.h): every bit pattern of f16, bf16, e4m3 and e5m2 decodes to the same value,
// every finite value round-trips, encoding rounds to the nearest value (ties to even), f16/bf16
// overflow to infinity, fp8 saturates at its largest finite value (NVIDIA's __NV_SATFINITE),
// and NaN stays NaN. The reference reads decoded inputs, so this is what lets it trust encode().
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/convert.h"
#include "support/dtype_codec.h"
#include "support/random.h"

namespace kvattn_test {
namespace {

namespace cv = kvattn::convert;
constexpr double kInf = std::numeric_limits<double>::infinity();

bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

TEST(Convert, KnownValuesOfTheTestDecoder) {
  EXPECT_EQ(decode_f16(0x3c00), 1.0);
  EXPECT_EQ(decode_f16(0x7bff), 65504.0);
  EXPECT_EQ(decode_f16(0x0001), std::ldexp(1.0, -24));
  EXPECT_EQ(decode_f16(0x03ff), std::ldexp(1023.0, -24));
  EXPECT_EQ(decode_f16(0xfc00), -kInf);
  EXPECT_TRUE(std::isnan(decode_f16(0x7e00)));
  EXPECT_EQ(decode_bf16(0x3f80), 1.0);
  EXPECT_EQ(decode_bf16(0x7f7f), std::ldexp(255.0, 127 - 7));
  EXPECT_EQ(decode_bf16(0x0001), std::ldexp(1.0, -133));
  EXPECT_EQ(decode_e4m3(0x7e), 448.0);
  EXPECT_EQ(decode_e4m3(0x01), std::ldexp(1.0, -9));
  EXPECT_EQ(decode_e4m3(0x08), std::ldexp(1.0, -6));
  EXPECT_EQ(decode_e4m3(0x78), 256.0);  // S.1111.000 is finite in e4m3fn
  EXPECT_TRUE(std::isnan(decode_e4m3(0x7f)));
  EXPECT_TRUE(std::isnan(decode_e4m3(0xff)));
  EXPECT_EQ(decode_e5m2(0x7b), 57344.0);
  EXPECT_EQ(decode_e5m2(0x01), std::ldexp(1.0, -16));
  EXPECT_EQ(decode_e5m2(0x7c), kInf);
  EXPECT_TRUE(std::isnan(decode_e5m2(0x7d)));
  EXPECT_EQ(decode_f32(0x3f800000u), 1.0);
  EXPECT_EQ(decode_f32(0x00000001u), std::ldexp(1.0, -149));
}

TEST(Convert, EveryBitPatternDecodesAlikeAndRoundTrips) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const auto h = uint16_t(b);
    ASSERT_TRUE(same_value(cv::f16_to_f32(h), decode_f16(h))) << "f16 0x" << std::hex << b;
    ASSERT_TRUE(same_value(cv::bf16_to_f32(h), decode_bf16(h))) << "bf16 0x" << std::hex << b;
    if (!std::isnan(decode_f16(h))) {
      ASSERT_EQ(cv::f32_to_f16(float(decode_f16(h))), h) << std::hex << b;
    }
    if (!std::isnan(decode_bf16(h))) {
      ASSERT_EQ(cv::f32_to_bf16(float(decode_bf16(h))), h) << std::hex << b;
    }
  }
  for (uint32_t b = 0; b < 0x100u; ++b) {
    const auto x = uint8_t(b);
    ASSERT_TRUE(same_value(cv::e4m3_to_f32(x), decode_e4m3(x))) << "e4m3 0x" << std::hex << b;
    ASSERT_TRUE(same_value(cv::e5m2_to_f32(x), decode_e5m2(x))) << "e5m2 0x" << std::hex << b;
    if (std::isfinite(decode_e4m3(x))) {
      ASSERT_EQ(cv::f32_to_e4m3(float(decode_e4m3(x))), x) << std::hex << b;
    }
    if (std::isfinite(decode_e5m2(x))) {
      ASSERT_EQ(cv::f32_to_e5m2(float(decode_e5m2(x))), x) << std::hex << b;
    }
  }
}

TEST(Convert, EdgeCases) {
  const double tiny16 = std::ldexp(1.0, -24);
  EXPECT_EQ(cv::f32_to_f16(65519.0f), 0x7bff);            // rounds down to max
  EXPECT_EQ(cv::f32_to_f16(65520.0f), 0x7c00);            // rounds up past max: inf
  EXPECT_EQ(cv::f32_to_f16(-1e6f), 0xfc00);
  EXPECT_EQ(cv::f32_to_f16(float(tiny16 / 2)), 0x0000);   // tie to even: 0
  EXPECT_EQ(cv::f32_to_f16(float(tiny16 * 1.5)), 0x0002); // tie to even: 2 quanta
  EXPECT_EQ(cv::f32_to_f16(float(tiny16 * 0.75)), 0x0001);
  EXPECT_EQ(cv::f32_to_f16(float(std::ldexp(1023.5, -24))), 0x0400);  // into the normal range
  EXPECT_EQ(cv::f32_to_f16(1.0f + 0x1p-11f), 0x3c00);     // tie to even
  EXPECT_EQ(cv::f32_to_f16(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(decode_f16(cv::f32_to_f16(NAN))));
  EXPECT_EQ(cv::f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);     // tie to even
  EXPECT_EQ(cv::f32_to_bf16(1.0f + 0x3p-8f), 0x3f82);
  EXPECT_EQ(cv::f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to inf
  EXPECT_EQ(cv::f32_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_TRUE(std::isnan(decode_bf16(cv::f32_to_bf16(NAN))));
  EXPECT_TRUE(std::isnan(decode_bf16(cv::f32_to_bf16(-NAN))));
  // fp8: saturation (including infinities) and subnormals.
  EXPECT_EQ(cv::f32_to_e4m3(464.0f), 0x7e);
  EXPECT_EQ(cv::f32_to_e4m3(1e9f), 0x7e);
  EXPECT_EQ(cv::f32_to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(cv::f32_to_e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(cv::f32_to_e4m3(0x1p-10f), 0x00);             // tie to even: 0
  EXPECT_EQ(cv::f32_to_e4m3(-0x1p-10f), 0x80);
  EXPECT_EQ(cv::f32_to_e4m3(0x3p-10f), 0x02);             // 1.5 quanta: tie to even 2
  EXPECT_EQ(cv::f32_to_e4m3(0x3p-11f), 0x01);             // 0.75 quanta: up to 1
  EXPECT_EQ(cv::f32_to_e4m3(0x1.ep-7f), 0x08);            // 7.5 quanta of 2^-9: rounds to 2^-6
  EXPECT_TRUE(std::isnan(decode_e4m3(cv::f32_to_e4m3(NAN))));
  EXPECT_EQ(cv::f32_to_e5m2(61440.0f), 0x7b);
  EXPECT_EQ(cv::f32_to_e5m2(INFINITY), 0x7b);
  EXPECT_EQ(cv::f32_to_e5m2(-1e30f), 0xfb);
  EXPECT_EQ(cv::f32_to_e5m2(0x1p-17f), 0x00);
  EXPECT_EQ(cv::f32_to_e5m2(0x1.8p-17f), 0x01);
  EXPECT_TRUE(std::isnan(decode_e5m2(cv::f32_to_e5m2(NAN))));
}

// The code nearest to x among finite codes of x's sign, ties to the even code (satfinite).
template <class Decode>
uint8_t nearest_fp8(double x, Decode decode) {
  int best = -1;
  double best_d = kInf;
  for (int c = 0; c < 256; ++c) {
    double v = decode(uint8_t(c));
    if (!std::isfinite(v) || bool(c & 0x80) != std::signbit(x)) continue;
    double d = std::abs(v - x);
    if (d < best_d || (d == best_d && (c & 1) == 0)) best = c, best_d = d;
  }
  return uint8_t(best);
}

// f16/bf16: the encoding of x is at least as near as both neighbouring codes, ties to even.
template <class Encode, class Decode>
::testing::AssertionResult rounds_to_nearest(float x, Encode encode, Decode decode) {
  const uint16_t c = encode(x);
  const double v = decode(c), err = std::abs(v - double(x));
  if (std::isinf(v)) return ::testing::AssertionSuccess();  // overflow checked in EdgeCases
  if (std::signbit(v) != std::signbit(x)) return ::testing::AssertionFailure() << "sign of " << x;
  for (int step : {-1, 1}) {
    const int n = (c & 0x7fff) + step;
    if (n < 0) continue;
    const double nv = decode(uint16_t((c & 0x8000) | n));
    if (std::isnan(nv)) continue;
    const double nerr = std::abs(nv - double(x));
    if (nerr < err || (nerr == err && (c & 1)))
      return ::testing::AssertionFailure() << x << " encoded as 0x" << std::hex << c << " (" << v
                                           << ") but 0x" << n << " (" << nv << ") is nearer or even";
  }
  return ::testing::AssertionSuccess();
}

TEST(Convert, RandomValuesRoundToNearestEven) {
  KVATTN_CASE_RNG(rng);
  for (int i = 0; i < 20000; ++i) {
    // Random sign, exponent over every binade of interest (incl. subnormals), random mantissa.
    const float x = float((rng.coin() ? -1 : 1) * std::ldexp(rng.uniform(1, 2), int(rng.integer(-30, 20))));
    ASSERT_TRUE(rounds_to_nearest(x, cv::f32_to_f16, decode_f16));
    ASSERT_TRUE(rounds_to_nearest(x, cv::f32_to_bf16, decode_bf16));
    ASSERT_EQ(cv::f32_to_e4m3(x), nearest_fp8(x, decode_e4m3)) << x;
    ASSERT_EQ(cv::f32_to_e5m2(x), nearest_fp8(x, decode_e5m2)) << x;
  }
}

TEST(Convert, LoadAndStoreDispatchEveryDtype) {
  using kvattn::DType;
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2}) {
    alignas(8) unsigned char buf[16] = {};
    for (int i = 0; i < 4; ++i) cv::store(buf, t, i, float(i) * 0.5f - 0.75f);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(double(cv::load(buf, t, i)), decode(buf, t, i)) << kvattn::dtype_name(t);
      EXPECT_EQ(decode(buf, t, i), representable(double(i) * 0.5 - 0.75, t));
    }
    float row[4];
    cv::load_row(buf, t, 4, row);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(double(row[i]), decode(buf, t, i));
  }
}

}  // namespace
}  // namespace kvattn_test
