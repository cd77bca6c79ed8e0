// Shared-memory layout of the tensor-core prefill kernel as plain constexpr functions, so that the
// host launcher (src/cuda/prefill_kernels.cpp) and the kernel compute the same sizes.
//
//   [ Q tile: M rows x pitch(DQK) in the MMA type                        ]
//   [ STAGES x (K tile | V tile), KV_TILE rows each, in the KV storage type ]
//   [ fp8 KV only: one K | V tile converted to the MMA type               ]
//   [ fused RoPE only: DQK/2 f32 frequencies                              ]
//   [ paged KV only: (STAGES + 1) x KV_TILE K and V row offsets, 2 x 8 bytes (a ring, one tile ahead) ]
//
// Every row pitch is an odd number of 16-byte chunks, so the 8 rows one ldmatrix phase reads fall
// in 8 different 16-byte bank groups (no conflicts) and cp.async destinations stay 16-byte aligned.
#pragma once

#include "kernels/common/host_device.cuh"

namespace kvattn::kernels::prefill {

constexpr int pitch_bytes(int row_bytes) { return ((row_bytes / 16) | 1) * 16; }

struct SmemLayout {
  int q = 0, stages = 0, convert = 0, freq = 0, ring = 0, total = 0;
  int stage_bytes = 0;
};

// rows: the M tile; kv_bytes: bytes of the KV storage type (2, or 1 for fp8; the MMA type has 2).
constexpr SmemLayout smem_layout(int dqk, int dvo, int kv_bytes, int rows, int kv_tile,
                                 int stages, bool paged, bool rope) {
  SmemLayout l;
  l.q = 0;
  l.stages = rows * pitch_bytes(dqk * 2);
  l.stage_bytes = kv_tile * (pitch_bytes(dqk * kv_bytes) + pitch_bytes(dvo * kv_bytes));
  l.convert = l.stages + stages * l.stage_bytes;
  l.freq = l.convert + (kv_bytes != 2 ? kv_tile * (pitch_bytes(dqk * 2) + pitch_bytes(dvo * 2)) : 0);
  l.ring = l.freq + (rope ? (dqk / 2) * 4 : 0);
  l.total = l.ring + (paged ? (stages + 1) * kv_tile * 16 : 0);
  return l;
}

}  // namespace kvattn::kernels::prefill
