// Shared-memory layout of the tensor-core prefill kernel as plain constexpr functions, so that the
// host launcher (src/cuda/prefill_kernels.cpp) and the kernel compute the same sizes.
//
//   [ Q tile: M rows x pitch(DQK) in the MMA type                        ]
//   [ STAGES x (K tile | V tile), KV_TILE rows each, in the KV storage type ]
//   [ fp8 KV only: one K | V tile converted to the MMA type               ]
//   [ fused RoPE only: DQK/2 f32 frequencies                              ]
//   [ paged KV only: (STAGES + 1) x KV_TILE K and V row offsets, 2 x 8 bytes (a ring, one tile ahead) ]
//
// With KV warps (the decode shape), the warps' final states are merged through the stages, after
// the last tile: KV_WARPS - 1 states of M rows (O, m, d in f32); the total grows if they need more.
//
// Every row pitch is an odd number of 16-byte chunks, so the 8 rows one ldmatrix phase reads fall
// in 8 different 16-byte bank groups (no conflicts) and cp.async destinations stay 16-byte aligned;
// except K/V rows with the swizzle tuning (kTuneSwizzleKV): unpadded, chunk c of row r stored at
// chunk c ^ (r % 8), conflict-free by the XOR instead.
#pragma once

#include "kernels/common/host_device.cuh"

namespace kvattn::kernels::prefill {

// Code-generation choices of the prefill kernel that do not change its results beyond rounding
// (PrefillKernelConfig::tuning; chosen per kernel from H200 measurements by
// cuda::prefill_tuning_for):
//  - kTuneLazyRescale: the online softmax keeps a stale row maximum as the reference of d and O
//    until the row grows by more than 2^8, so O is rescaled less often;
//  - kTuneSwizzleKV: unpadded, XOR-swizzled K/V rows (2-byte KV without RoPE, head dims a
//    multiple of 64): whole 128-byte lines per copy;
//  - kTuneUnrollQK: Q K^T fully unrolled over the head dim (else two k-steps per iteration);
//  - kTunePackP: P packed to the MMA type right after the softmax, so the f32 scores die there
//    (half the registers live across the wait for V; no spills at hd 128 with the other bits);
//  - kTuneLeanCopies: K/V copies without per-row index arithmetic (it was a fifth of the main
//    loop's instructions at hd 128): ragged rows step one pointer per thread, paged rows add
//    their ring offset to one pointer; bounds are checked only on a tile crossing the item's end;
//  - kTunePVByDim (with kTunePackP): P V walks V's dims outermost, so each lane's V address is
//    one XOR per 16 dims and the tokens' steps are constant ldmatrix offsets (an experiment:
//    within noise of 31 on hd 128; H200, 2026-11-30 at 370aabc);
//  - kTuneWholeTileTransform: soft-cap / ALiBi / sigmoid transform a tile no mask cuts in one
//    branch-free block, not one block per row (the per-row branch on `masked` split it in 8):
//    ALiBi +3.7%, soft-cap 2-3% slower (its MUFU work then sits among the Q K^T MMAs);
//  - kTuneRowSumMMA (softmax variants): the row sums d come from one more MMA per 16 keys, of the
//    packed P against ones, instead of one FADD per score, so d sums exactly the rounded weights
//    P V uses (O a weighted mean of V rows). An experiment (H200, 2026-11-30 at 10cb283):
//    hd 64 +3.5%, hd 128 page 16 +4%, but the rest 2-9% slower, and the LSE then carries the
//    weights' bf16 rounding (errors up to 1.7e-3 in log2 units, over the tests' tolerance), so no
//    kernel takes it;
//  - kTuneCapShift (bf16 soft-cap without ALiBi, caps up to 54.7: cap_shift_fits): the weights
//    are 2^(y - shift) with one fixed shift (cap_shift_log2) instead of the running row maximum
//    (the lazy rescale's bit then does nothing), so
//    the tile's chain S -> tanh -> exp has no maximum, no shuffle and no O rescale in it. The
//    host sets it wherever it applies (cuda::choose_prefill_config) and clears it elsewhere;
//  - kTuneHalfTiles: a tile in two halves of keys, Q K^T of both first, then each half's softmax
//    and P V, so that one half's MUFU work overlaps the other's MMAs (with kTuneCapShift the halves
//    share the fixed shift; else each half updates the running maximum, as a tile would: plain
//    softmax above hd 128: H200, 2026-12-01 at a97c407);
//    kTuneQuarterTiles: four parts instead (H200 at 7bc9489: hd 256 +7%, tanh.approx hd 128 +5%;
//    exact hd 128 -3%, hd 64 -3%). Parts are whole 16-key steps, so a 48-token tile goes whole
//    and a 32-token one in halves whatever the bits say.
enum PrefillTuning : unsigned {
  kTuneLazyRescale = 1u,
  kTuneSwizzleKV = 2u,
  kTuneUnrollQK = 4u,
  kTunePackP = 8u,
  kTuneLeanCopies = 16u,
  kTunePVByDim = 32u,
  kTuneWholeTileTransform = 64u,
  kTuneRowSumMMA = 128u,
  kTuneCapShift = 256u,
  kTuneHalfTiles = 512u,
  kTuneQuarterTiles = 1024u,
  kTuneAll = 2047u
};

// Soft-cap's fixed shift, in log2 units of the logits y = c L tanh(x / c) in [-c L, c L] (c the
// cap, L = log2 e). With P = 2^(y - shift) and shift = min(c L, 94 - c L), for c L <= 79 (caps up
// to 54.7):
//  - no weight exceeds 2^(c L - shift) <= 2^64 (d and O stay far from f32's 2^128 for any
//    kv_len x |v| below 2^64);
//  - a row's weights within 2^-32 of its largest are >= 2^(-c L - 32 - shift) >= 2^-126: normal
//    in f32 and bf16 (ex2.approx.ftz flushes below that), so they keep full relative precision;
//    the ones flushed weigh under 2^-32 of the row's largest each (under kv_len x 2^-32 together);
//  - a row's largest weight is >= 2^(-c L - shift) >= 2^-94, so O's products with |v| above 2^-32
//    stay normal. (max(0, c L - 64) would keep it >= 2^-64 up to cap 44, 2^-43 at cap 30, with
//    the same two bounds above; not yet run on a GPU: docs/DECISIONS.md, "Soft-cap".)
// f16 has no room for it: its weights span 2^-24 to 2^16, less than one capped row's range.
constexpr float kCapShiftMaxLog2 = 79.0f;
constexpr bool cap_shift_fits(float cap_log2) { return cap_log2 > 0.0f && cap_log2 <= kCapShiftMaxLog2; }
constexpr float cap_shift_log2(float cap_log2) { return cap_log2 < 94.0f - cap_log2 ? cap_log2 : 94.0f - cap_log2; }

constexpr int pitch_bytes(int row_bytes) { return ((row_bytes / 16) | 1) * 16; }
// Whether the swizzle applies: K/V copied as they are (no conversion, no RoPE) in rows of whole
// 128-byte lines.
constexpr bool swizzles_kv(bool tuned, int dqk, int dvo, int kv_bytes, bool rope) {
  return tuned && kv_bytes == 2 && !rope && dqk % 64 == 0 && dvo % 64 == 0;
}
constexpr int kv_pitch_bytes(int row_bytes, bool swizzled) { return swizzled ? row_bytes : pitch_bytes(row_bytes); }

// Bytes of the states the KV warps other than the first hand over: per warp and 16-row MMA tile, a
// thread's O fragments (DVO / 2 floats), m and d (2 each), stored lane-major (conflict-free). The
// row-sum tile of tuning bit 128 (4 floats more) is not counted: the kernel's static_assert checks
// the exact size against the layout (the stages hold it with room to spare).
constexpr int kv_warp_merge_bytes(int dvo, int rows, int kv_warps) {
  return (kv_warps - 1) * (rows / 16) * 32 * (dvo / 2 + 4) * 4;
}

struct SmemLayout {
  int q = 0, stages = 0, convert = 0, freq = 0, ring = 0, total = 0;
  int stage_bytes = 0;
};

// rows: the M tile; kv_bytes: bytes of the KV storage type (2, or 1 for fp8; the MMA type has 2).
constexpr SmemLayout smem_layout(int dqk, int dvo, int kv_bytes, int rows, int kv_tile,
                                 int stages, bool paged, bool rope, bool swizzled_kv = false, int kv_warps = 1) {
  SmemLayout l;
  l.q = 0;
  l.stages = rows * pitch_bytes(dqk * 2);
  l.stage_bytes = kv_tile * (kv_pitch_bytes(dqk * kv_bytes, swizzled_kv) + kv_pitch_bytes(dvo * kv_bytes, swizzled_kv));
  l.convert = l.stages + stages * l.stage_bytes;
  l.freq = l.convert + (kv_bytes != 2 ? kv_tile * (pitch_bytes(dqk * 2) + pitch_bytes(dvo * 2)) : 0);
  l.ring = l.freq + (rope ? (dqk / 2) * 4 : 0);
  l.total = l.ring + (paged ? (stages + 1) * kv_tile * 16 : 0);
  const int merge_end = l.stages + kv_warp_merge_bytes(dvo, rows, kv_warps);
  if (merge_end > l.total) l.total = merge_end;
  return l;
}

}  // namespace kvattn::kernels::prefill
