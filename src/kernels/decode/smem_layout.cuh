// Shared-memory sizes of the decode kernels as plain constexpr functions, so the host launcher and
// the kernels compute the same number from the same formula.
#pragma once

#include "kernels/common/host_device.cuh"

namespace kvattn::kernels::decode {

constexpr int odd_chunks(int bytes) { return (bytes / 16) | 1; }  // row pitch in 16-byte chunks
constexpr int max_of(int a, int b) { return a > b ? a : b; }

// CUDA-core kernel: K/V stages, the token-group reduction (aliasing the stages), q, scores, m/d/scale.
constexpr int simt_smem_bytes(int kv_bytes, int dqk, int dvo, int gh, int tile, int stages,
                              int threads) {
  return max_of(stages * tile * (odd_chunks(dqk * kv_bytes) + odd_chunks(dvo * kv_bytes)) * 16,
                (threads / (dvo / 8)) * gh * dvo * 4) +
         (gh * dqk + gh * tile + 3 * gh) * 4;
}

// Tensor-core kernel: K/V stages (or the warps' merge buffers), q [16 m_tiles][pitch] in the MMA
// type (and, for fp8 K/V, each row's two power-of-two scales), page-id ring. kv_bytes: 2
// (f16/bf16) or 1 (fp8); m_tiles: 16-row M tiles of query heads per CTA (1, or 2 for groups of
// 17-32 heads).
constexpr int mma_tile_tokens(int warps) { return warps * 16; }
constexpr int mma_q_bytes(int dqk, int kv_bytes, int m_tiles = 1) {
  return m_tiles * 16 * (odd_chunks(dqk * 2) * 16 + (kv_bytes == 1 ? 2 * 4 : 0));
}
constexpr int mma_stage_bytes(int dqk, int dvo, int warps, int kv_bytes) {
  return mma_tile_tokens(warps) * (odd_chunks(dqk * kv_bytes) + odd_chunks(dvo * kv_bytes)) * 16;
}
constexpr int mma_merge_bytes(int dvo, int warps, int m_tiles) { return warps * m_tiles * 16 * (dvo + 2) * 4; }
constexpr int mma_smem_bytes(int dqk, int dvo, int stages, int warps, int kv_bytes = 2, int m_tiles = 1) {
  return max_of(stages * mma_stage_bytes(dqk, dvo, warps, kv_bytes), mma_merge_bytes(dvo, warps, m_tiles)) +
         mma_q_bytes(dqk, kv_bytes, m_tiles) + (stages + 1) * (mma_tile_tokens(warps) + 1) * 4;
}
// Transposed tensor-core kernel: the same, with merge buffers of pitch dvo + 4 per head.
constexpr int mma_t_smem_bytes(int dqk, int dvo, int stages, int warps) {
  return max_of(stages * mma_tile_tokens(warps) * (odd_chunks(dqk * 2) + odd_chunks(dvo * 2)) * 16,
                warps * 16 * (dvo + 6) * 4) +
         16 * odd_chunks(dqk * 2) * 16 + (stages + 1) * (mma_tile_tokens(warps) + 1) * 4;
}

// Tensor-core kernel with bulk copies (DecodeBulkKernel, experimental): the same padded K/V stages
// (or merge buffers) and q, and one 8-byte mbarrier per stage and warp instead of the page-id ring.
constexpr int bulk_smem_bytes(int dqk, int dvo, int stages, int warps, int kv_bytes = 2, int m_tiles = 1) {
  return max_of(stages * mma_stage_bytes(dqk, dvo, warps, kv_bytes), mma_merge_bytes(dvo, warps, m_tiles)) +
         mma_q_bytes(dqk, kv_bytes, m_tiles) + stages * warps * 8;
}

// Tensor-core kernel with TMA boxes (DecodeTmaKernel): 1024 bytes of alignment slack, unpadded
// swizzled K/V stages (or the merge buffers), q, one mbarrier per stage and warp.
constexpr int tma_smem_bytes(int dqk, int dvo, int stages, int warps, int kv_bytes = 2, int m_tiles = 1) {
  return 1024 + max_of(stages * warps * 16 * (dqk + dvo) * kv_bytes, mma_merge_bytes(dvo, warps, m_tiles)) +
         mma_q_bytes(dqk, kv_bytes, m_tiles) + stages * warps * 8;
}

}  // namespace kvattn::kernels::decode
