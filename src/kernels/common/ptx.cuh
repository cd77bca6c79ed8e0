// Thin wrappers over the PTX instructions the kernels use: asynchronous global->shared copies and
// element conversions to and from f32 for every kvattn dtype (no CUDA toolkit headers needed, so
// NVRTC compiles the kernels with nothing but kvattn's embedded sources).
#pragma once

#include "kernels/common/host_device.cuh"

namespace kvattn::kernels {

// Dtype codes, numbered as kvattn::DType.
enum DTypeCode : int { kF32 = 0, kF16 = 1, kBF16 = 2, kE4M3 = 3, kE5M2 = 4 };

template <int DT>
struct DTypeInfo;
template <> struct DTypeInfo<kF32> { static constexpr int bytes = 4; };
template <> struct DTypeInfo<kF16> { static constexpr int bytes = 2; };
template <> struct DTypeInfo<kBF16> { static constexpr int bytes = 2; };
template <> struct DTypeInfo<kE4M3> { static constexpr int bytes = 1; };
template <> struct DTypeInfo<kE5M2> { static constexpr int bytes = 1; };

// ---- cp.async (sm_80+) ----------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// KVATTN_L2_PREFETCH (a JIT option: 64, 128 or 256) asks L2 to fetch that many bytes around each
// copy, so the neighbouring 16-byte copies of a row hit in L2.
#if defined(KVATTN_L2_PREFETCH) && KVATTN_L2_PREFETCH == 256
#define KVATTN_CP_ASYNC_16 "cp.async.cg.shared.global.L2::256B"
#elif defined(KVATTN_L2_PREFETCH) && KVATTN_L2_PREFETCH == 128
#define KVATTN_CP_ASYNC_16 "cp.async.cg.shared.global.L2::128B"
#elif defined(KVATTN_L2_PREFETCH) && KVATTN_L2_PREFETCH == 64
#define KVATTN_CP_ASYNC_16 "cp.async.cg.shared.global.L2::64B"
#else
#define KVATTN_CP_ASYNC_16 "cp.async.cg.shared.global"
#endif
// 16-byte copy; with valid == false the destination is zero-filled and nothing is read.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  asm volatile(KVATTN_CP_ASYNC_16 " [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(valid ? 16 : 0));
}
// The same by shared-state-space address (smem_addr).
__device__ __forceinline__ void cp_async_16(uint32_t smem, const void* gmem, bool valid) {
  asm volatile(KVATTN_CP_ASYNC_16 " [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(valid ? 16 : 0));
}
// 16-byte copy to a shared-state-space address (smem_addr): callers that step it by constants
// get them folded into the instruction's offset.
__device__ __forceinline__ void cp_async_16_to(uint32_t smem, const void* gmem) {
  asm volatile(KVATTN_CP_ASYNC_16 " [%0], [%1], 16;\n" ::"r"(smem), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ---- programmatic dependent launch (sm_90+; no-ops before) -----------------------------------
// A kernel launched after this one with programmatic stream serialization may start (and wait in
// wait_for_prerequisite_grid) once every CTA here has called allow_dependent_launch() or exited,
// which hides its launch behind this kernel's tail.
__device__ __forceinline__ void allow_dependent_launch() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// Waits until the preceding kernel has completed and its writes are visible; returns at once when
// this kernel was launched without programmatic stream serialization.
__device__ __forceinline__ void wait_for_prerequisite_grid() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// ---- conversions ------------------------------------------------------------------------------
__device__ __forceinline__ float f16_bits_to_f32(uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) {
  return __uint_as_float(uint32_t(h) << 16);
}
// fp8 -> f32 through f16 bit patterns: e5m2 is a truncated f16; e4m3's exponent bias is 7
// against f16's 15, so shift its bits into an f16 and scale by 2^8 (exact, subnormals included).
__device__ __forceinline__ float e5m2_to_f32(uint8_t x) { return f16_bits_to_f32(uint16_t(x) << 8); }
__device__ __forceinline__ float e4m3_to_f32(uint8_t x) {
  uint16_t h = uint16_t((uint16_t(x & 0x80) << 8) | (uint16_t(x & 0x7f) << 7));
  return f16_bits_to_f32(h) * 256.0f;
}

// Converts the N elements packed in `words` (N * bytes / 4 32-bit words) to f32.
template <int DT, int N>
__device__ __forceinline__ void unpack(const uint32_t* words, float* out) {
  if constexpr (DT == kF32) {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = __uint_as_float(words[i]);
  } else if constexpr (DT == kBF16) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      out[2 * i] = __uint_as_float(words[i] << 16);
      out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  } else if constexpr (DT == kF16) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      out[2 * i] = f16_bits_to_f32(uint16_t(words[i] & 0xffffu));
      out[2 * i + 1] = f16_bits_to_f32(uint16_t(words[i] >> 16));
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      uint8_t b = uint8_t(words[i / 4] >> (8 * (i % 4)));
      out[i] = DT == kE4M3 ? e4m3_to_f32(b) : e5m2_to_f32(b);
    }
  }
}

template <int DT>
__device__ __forceinline__ float load_as_f32(const void* p, int64_t i) {
  if constexpr (DT == kF32) return static_cast<const float*>(p)[i];
  else if constexpr (DT == kBF16) return bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
  else if constexpr (DT == kF16) return f16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
  else if constexpr (DT == kE4M3) return e4m3_to_f32(static_cast<const uint8_t*>(p)[i]);
  else return e5m2_to_f32(static_cast<const uint8_t*>(p)[i]);
}

template <int DT>
__device__ __forceinline__ void store_from_f32(void* p, int64_t i, float v) {
  if constexpr (DT == kF32) {
    static_cast<float*>(p)[i] = v;
  } else if constexpr (DT == kBF16) {
    uint16_t h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    static_cast<uint16_t*>(p)[i] = h;
  } else {
    static_assert(DT == kF16, "outputs are f32, f16 or bf16");
    uint16_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    static_cast<uint16_t*>(p)[i] = h;
  }
}

}  // namespace kvattn::kernels
