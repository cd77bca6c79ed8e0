// Tensor-core building blocks of the portable (sm_80+) tier: ldmatrix and mma.sync m16n8k16 with
// f32 accumulators, for f16 and bf16 operands, and the fp8 -> f16 unpacking of fp8 fragments.
#pragma once

#include "kernels/common/ptx.cuh"

namespace kvattn::kernels {

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}
// By shared-state-space address (smem_addr): constant steps fold into the instruction's offset.
__device__ __forceinline__ void ldmatrix_x4_trans_at(uint32_t (&r)[4], uint32_t smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}
// Two 8x8 matrices (lanes 0-15 give the row addresses).
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(smem)));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(smem)));
}

// D = A * B + D for a 16x16 (row) by 16x8 (col) tile; DT is kF16 or kBF16.
template <int DT>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (DT == kBF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(DT == kF16, "mma operands are f16 or bf16");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two f32 values as a packed f16x2 / bf16x2 register (low half = lo).
template <int DT>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (DT == kBF16)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// ---- fp8 fragments -----------------------------------------------------------------------------
// Every e4m3 and e5m2 value is exact in f16 (normal there, subnormals included), so fp8 K/V feed
// f16 MMAs without rounding. e5m2 is the high byte of an f16 (a byte move); e4m3 takes the sm_89+
// conversion instruction, or on older devices the bit-exact scalar path.

// prmt: bytes of {b, a} (indices 0-3 from a, 4-7 from b) picked by the four selector nibbles.
__device__ __forceinline__ uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}
// The f16x2 of bytes `sel_lo` and `sel_hi` of x (byte indices 0-3), low half from sel_lo.
template <int FP8, int SEL_LO, int SEL_HI>
__device__ __forceinline__ uint32_t fp8_pair_to_f16x2(uint32_t x) {
  static_assert(FP8 == kE4M3 || FP8 == kE5M2, "fp8 is e4m3 or e5m2");
  if constexpr (FP8 == kE5M2) {
    // Each byte into the high byte of its f16 half (selector 4: a zero byte of the second operand).
    return byte_perm(x, 0u, 0x0404u | (SEL_LO << 4) | (SEL_HI << 12));
  } else {
#if __CUDA_ARCH__ >= 890
    const uint32_t pair = byte_perm(x, 0u, SEL_LO | (SEL_HI << 4) | 0x4400u);
    uint32_t r;
    asm("{ .reg .b16 lo, hi;\n"
        "  mov.b32 {lo, hi}, %1;\n"
        "  cvt.rn.f16x2.e4m3x2 %0, lo;\n"
        "}\n"
        : "=r"(r)
        : "r"(pair));
    return r;
#else
    return pack2<kF16>(e4m3_to_f32(uint8_t(x >> (8 * SEL_LO))), e4m3_to_f32(uint8_t(x >> (8 * SEL_HI))));
#endif
  }
}

}  // namespace kvattn::kernels
