// Element types that cross kvattn's API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvattn {

enum class DType : uint8_t {
  f32,
  f16,
  bf16,
  e4m3,  // fp8 e4m3fn (no infinities, max 448), as NVIDIA's __nv_fp8_e4m3
  e5m2,  // fp8 e5m2 (IEEE-like, max 57344), as NVIDIA's __nv_fp8_e5m2
  i32,
  u8,
};

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::e4m3: case DType::e5m2: case DType::u8: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::e4m3: return "e4m3";
    case DType::e5m2: return "e5m2";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
  }
  return "?";
}

constexpr bool is_float(DType t) { return t != DType::i32 && t != DType::u8; }
constexpr bool is_fp8(DType t) { return t == DType::e4m3 || t == DType::e5m2; }

// Parses "f32", "f16"/"fp16", "bf16", "e4m3"/"fp8_e4m3", "e5m2"/"fp8_e5m2", "i32", "u8"; throws kvattn::Error otherwise.
DType parse_dtype(std::string_view name);

}  // namespace kvattn
