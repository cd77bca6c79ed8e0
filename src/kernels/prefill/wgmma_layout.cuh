// Shared-memory layout of the Hopper prefill kernel (prefill_wgmma_kernel.cuh) as constexpr
// functions, so that the host launcher (src/cuda/prefill_kernels.cpp) and the kernel agree:
//
//   [ Q tile: 128 rows x DQK, 128-byte swizzled column blocks (common/wgmma.cuh)        ]
//   [ STAGES x (K tile: KV_TILE x DQK | V tile: KV_TILE x DVO), swizzled the same way   ]
//   [ paged KV only: 2 x KV_TILE K and V row offsets (8 + 8 bytes), a double buffer     ]
//   [ mbarriers: Q full; per stage K full, V full, K empty, V empty; the bad-page flag  ]
//
// Every tile starts on a 1024-byte boundary (the swizzle's period), so the descriptors' base
// offset is 0.
#pragma once

#include "kernels/common/host_device.cuh"

namespace kvattn::kernels::prefill {

struct WgmmaSmemLayout {
  int q = 0, stages = 0, stage_bytes = 0, v_in_stage = 0, ring = 0, barriers = 0, flag = 0, total = 0;
};

KVATTN_HD constexpr int align_up_to(int x, int a) { return (x + a - 1) / a * a; }

// rows: the M tile (two consumer warpgroups of 64 rows); 2-byte Q/K/V.
KVATTN_HD constexpr WgmmaSmemLayout wgmma_smem_layout(int dqk, int dvo, int rows, int kv_tile, int stages, bool paged) {
  WgmmaSmemLayout l;
  l.q = 0;
  l.stages = align_up_to(rows * dqk * 2, 1024);
  l.v_in_stage = align_up_to(kv_tile * dqk * 2, 1024);
  l.stage_bytes = l.v_in_stage + align_up_to(kv_tile * dvo * 2, 1024);
  l.ring = l.stages + stages * l.stage_bytes;
  l.barriers = l.ring + (paged ? 2 * kv_tile * 16 : 0);
  l.flag = l.barriers + (1 + 4 * stages) * 8;
  l.total = l.flag + 8;
  return l;
}

}  // namespace kvattn::kernels::prefill
