// Element encodings for test inputs and outputs. Encoding (double -> stored bits) goes through the
// library's converter (src/core/convert.h): round-to-nearest-even, fp8 saturating. Decoding
// (stored bits -> double), which is what the reference reads, is written here again from the
// format definitions, so that a wrong library decoder cannot agree with itself.
#pragma once

#include <cstdint>

#include "kvattn/dtype.h"

namespace kvattn_test {

// Writes x, rounded to `t`, at element i of `p`.
void encode(void* p, kvattn::DType t, int64_t i, double x);
// Element i of `p`, decoded exactly (every f32/f16/bf16/fp8 value is a double).
double decode(const void* p, kvattn::DType t, int64_t i);
// decode(encode(x)): the value a kernel sees after x was stored as `t`.
double representable(double x, kvattn::DType t);

// The independent decoders, bit pattern -> value.
double decode_f32(uint32_t bits);
double decode_f16(uint16_t bits);
double decode_bf16(uint16_t bits);
double decode_e4m3(uint8_t bits);  // e4m3fn: bias 7, no infinities, S.1111.111 is NaN
double decode_e5m2(uint8_t bits);  // bias 15, IEEE-like infinities and NaNs

}  // namespace kvattn_test
