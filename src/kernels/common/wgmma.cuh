// Hopper (sm_90a) building blocks: warpgroup MMAs (wgmma.mma_async) with f32 accumulators and
// operands in f16 or bf16, their shared-memory matrix descriptors, and the fences around them.
//
// Layout contract (PTX ISA, "Asynchronous Warpgroup Level Matrix Shared Memory Layout"): every
// shared-memory operand here is stored in the 128-byte swizzle, in column blocks of 64 elements:
// element (row r, column c) of a tile of R rows sits at byte
//   (c / 64) R 128 + r 128 + (((c % 64) / 8) ^ (r % 8)) 16 + (c % 8) 2
// (swizzled_offset below), each block 1024-byte aligned. A K-major operand (Q, K: the reduction
// dimension contiguous) is read 16 columns per instruction at byte (c / 64) R 128 + (c % 64) 2
// with 1024 bytes between 8-row groups; an MN-major one (V in P V: the output dimension
// contiguous, the reduction over rows) 16 rows per instruction at byte r 128, with R 128 bytes
// between 64-column blocks and 1024 bytes between 8-row groups.
//
// Accumulators: a warpgroup's 64 x N tile, warp w of the group holding rows 16 w .. 16 w + 15 in
// the mma.sync m16n8 fragment order per 8 columns: d[4 n + j] is row g + 8 (j / 2), column
// 8 n + 2 t + j % 2 (g = lane / 4, t = lane % 4). A register operand A (64 x 16) is the mma.sync
// m16n8k16 A fragment of the warp's 16 rows.
#pragma once

#include "kernels/common/ptx.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "wgmma needs the sm_90a target (compile with -arch=sm_90a)"
#endif

namespace kvattn::kernels {

// Byte offset of element (r, c) in a 128-byte-swizzled tile of `rows` rows of 2-byte elements.
KVATTN_HD constexpr int swizzled_offset(int rows, int r, int c) {
  return (c / 64) * rows * 128 + r * 128 + ((((c % 64) / 8) ^ (r % 8)) * 16) + (c % 8) * 2;
}

// A shared-memory matrix descriptor: start address, leading and stride byte offsets (16-byte
// units), 128-byte swizzle (mode 1 in bits 62-63), base offset 0 (blocks are 1024-byte aligned).
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t smem_addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  return uint64_t((smem_addr & 0x3ffff) >> 4) | (uint64_t((leading_bytes >> 4) & 0x3fff) << 16) |
         (uint64_t((stride_bytes >> 4) & 0x3fff) << 32) | (uint64_t(1) << 62);
}
// K-major operand: the leading byte offset is unused with a swizzle (1 by convention).
__device__ __forceinline__ uint64_t wgmma_desc_k_major(uint32_t smem_addr) { return wgmma_desc(smem_addr, 16, 1024); }
// MN-major operand of `rows` rows (64-column blocks rows x 128 bytes apart).
__device__ __forceinline__ uint64_t wgmma_desc_mn_major(uint32_t smem_addr, int rows) {
  return wgmma_desc(smem_addr, uint32_t(rows) * 128, 1024);
}

// Orders this thread's register and shared-memory accesses before the warpgroup's next wgmma.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups of this warpgroup are pending. The accumulators are
// named so that the compiler keeps their uses after the wait.
template <int N, int R>
__device__ __forceinline__ void wgmma_wait(float (&d)[R]) {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Register donation between warpgroups (setmaxnreg): the producer gives registers back, the
// consumers take them; each warpgroup runs one, as one branch of an if/else.
template <int REGS>
__device__ __forceinline__ void warpgroup_release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void warpgroup_take_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

// Operand lists of the m64nNk16 forms (inline asm takes no lists, so each shape is written out):
// D registers, then A (descriptor, or four registers), the B descriptor and scale-d.
#define KVATTN_WG_D_N64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define KVATTN_WG_OUT_N64(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define KVATTN_WG_SS_PRED_N64 "setp.ne.b32 p, %34, 0;\n"
#define KVATTN_WG_SS_AB_N64 ", %32, %33, p, 1, 1, 0, 0;\n"
#define KVATTN_WG_RS_PRED_N64 "setp.ne.b32 p, %37, 0;\n"
#define KVATTN_WG_RS_AB_N64 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n"
#define KVATTN_WG_D_N128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define KVATTN_WG_OUT_N128(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define KVATTN_WG_SS_PRED_N128 "setp.ne.b32 p, %66, 0;\n"
#define KVATTN_WG_SS_AB_N128 ", %64, %65, p, 1, 1, 0, 0;\n"
#define KVATTN_WG_RS_PRED_N128 "setp.ne.b32 p, %69, 0;\n"
#define KVATTN_WG_RS_AB_N128 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n"
#define KVATTN_WG_D_N256 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define KVATTN_WG_OUT_N256(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define KVATTN_WG_SS_PRED_N256 "setp.ne.b32 p, %130, 0;\n"
#define KVATTN_WG_SS_AB_N256 ", %128, %129, p, 1, 1, 0, 0;\n"
#define KVATTN_WG_RS_PRED_N256 "setp.ne.b32 p, %133, 0;\n"
#define KVATTN_WG_RS_AB_N256 ", {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n"

#define KVATTN_WGMMA_SS(N, TYPE)                                                                 \
  asm volatile("{\n.reg .pred p;\n" KVATTN_WG_SS_PRED_N##N                                     \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " KVATTN_WG_D_N##N \
                   KVATTN_WG_SS_AB_N##N "}\n"                                                  \
               : KVATTN_WG_OUT_N##N(d)                                                         \
               : "l"(a), "l"(b), "r"(scale_d))
#define KVATTN_WGMMA_RS(N, TYPE)                                                                 \
  asm volatile("{\n.reg .pred p;\n" KVATTN_WG_RS_PRED_N##N                                     \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " KVATTN_WG_D_N##N \
                   KVATTN_WG_RS_AB_N##N "}\n"                                                  \
               : KVATTN_WG_OUT_N##N(d)                                                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d))

// D (64 x N) = A B + (scale_d ? D : 0), A and B K-major in shared memory (descriptors).
template <int DT, int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t a, uint64_t b, int scale_d) {
  static_assert(DT == kBF16 || DT == kF16, "wgmma operands are f16 or bf16 here");
  if constexpr (N == 64) {
    if constexpr (DT == kBF16) KVATTN_WGMMA_SS(64, "bf16"); else KVATTN_WGMMA_SS(64, "f16");
  } else if constexpr (N == 128) {
    if constexpr (DT == kBF16) KVATTN_WGMMA_SS(128, "bf16"); else KVATTN_WGMMA_SS(128, "f16");
  } else {
    static_assert(N == 256, "N is 64, 128 or 256");
    if constexpr (DT == kBF16) KVATTN_WGMMA_SS(256, "bf16"); else KVATTN_WGMMA_SS(256, "f16");
  }
}
// D (64 x N) = A B + (scale_d ? D : 0), A in registers (the m16n8k16 A fragment of the warp's
// rows), B MN-major in shared memory (transposed: the descriptor's rows are the reduction).
template <int DT, int N>
__device__ __forceinline__ void wgmma_rs_mn(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b, int scale_d) {
  static_assert(DT == kBF16 || DT == kF16, "wgmma operands are f16 or bf16 here");
  if constexpr (N == 64) {
    if constexpr (DT == kBF16) KVATTN_WGMMA_RS(64, "bf16"); else KVATTN_WGMMA_RS(64, "f16");
  } else if constexpr (N == 128) {
    if constexpr (DT == kBF16) KVATTN_WGMMA_RS(128, "bf16"); else KVATTN_WGMMA_RS(128, "f16");
  } else {
    static_assert(N == 256, "N is 64, 128 or 256");
    if constexpr (DT == kBF16) KVATTN_WGMMA_RS(256, "bf16"); else KVATTN_WGMMA_RS(256, "f16");
  }
}

#undef KVATTN_WGMMA_SS
#undef KVATTN_WGMMA_RS

}  // namespace kvattn::kernels
