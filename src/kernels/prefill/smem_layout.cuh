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
// except K/V rows with the swizzle tuning (PrefillTuning::swizzle_kv): unpadded, chunk c of row r stored at
// chunk c ^ (r % 8), conflict-free by the XOR instead.
#pragma once

#include "kernels/common/host_device.cuh"

namespace kvattn::kernels::prefill {

// Code-generation choices of the prefill kernel that do not change its results beyond rounding
// (cuda::PrefillKernelConfig::tuning; chosen per kernel from H200 measurements by
// cuda::prefill_tuning_for). Host and device share these types; the host writes them into each
// kernel's generated configuration by name.
//  - softmax: running_max, the textbook online softmax; lazy_rescale keeps a stale row maximum
//    as the reference of d and O until the row grows by more than 2^8, so O is rescaled less
//    often; fixed_shift (bf16 soft-cap without ALiBi, caps up to 54.7: cap_shift_fits) makes the
//    weights 2^(y - shift) with one fixed shift (cap_shift_log2) instead of a row maximum, so the
//    tile's chain S -> tanh -> exp has no maximum, no shuffle and no O rescale in it (the host
//    picks it wherever it applies, cuda::choose_prefill);
//  - swizzle_kv: unpadded, XOR-swizzled K/V rows (2-byte KV without RoPE, head dims a multiple
//    of 64): whole 128-byte lines per copy;
//  - unroll_qk: Q K^T fully unrolled over the head dim (else two k-steps per iteration);
//  - pack_p: P packed to the MMA type right after the softmax, so the f32 scores die there (half
//    the registers live across the wait for V; no spills at hd 128 with the other choices);
//  - lean_copies: K/V copies without per-row index arithmetic (it was a fifth of the main loop's
//    instructions at hd 128): ragged rows step one pointer per thread, paged rows add their ring
//    offset to one pointer; bounds are checked only on a tile crossing the item's end;
//  - whole_tile_transform: soft-cap / ALiBi / sigmoid transform a tile no mask cuts in one
//    branch-free block, not one block per row (the per-row branch on `masked` split it in 8):
//    ALiBi +3.7%, soft-cap 2-3% slower (its MUFU work then sits among the Q K^T MMAs);
//  - split: a tile in two halves (or four quarters) of keys, Q K^T of all parts first, then each
//    part's softmax and P V, so that one part's MUFU work overlaps another's MMAs (with the fixed
//    shift the parts share it; else each part updates the running maximum, as a tile would).
//    Softmax variants only. Parts are whole 16-key steps, so a 48-token tile goes whole and a
//    32-token one in halves whatever the split says.
// Measured and not kept (docs/DECISIONS.md, "Prefill kernels"): P V with V's dims outermost
// (within noise) and the row sums from an MMA of P against ones (the LSE then carries the
// weights' rounding).
enum class SoftmaxForm : uint8_t { running_max, lazy_rescale, fixed_shift };
enum class TileSplit : uint8_t { whole, halves, quarters };

struct PrefillTuning {
  SoftmaxForm softmax = SoftmaxForm::running_max;
  bool swizzle_kv = false;
  bool unroll_qk = false;
  bool pack_p = false;
  bool lean_copies = false;
  bool whole_tile_transform = false;
  TileSplit split = TileSplit::whole;

  KVATTN_HD constexpr bool operator==(const PrefillTuning& o) const {
    return softmax == o.softmax && swizzle_kv == o.swizzle_kv && unroll_qk == o.unroll_qk && pack_p == o.pack_p &&
           lean_copies == o.lean_copies && whole_tile_transform == o.whole_tile_transform && split == o.split;
  }
  KVATTN_HD constexpr bool operator!=(const PrefillTuning& o) const { return !(*this == o); }
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
// thread's O fragments (DVO / 2 floats), m and d (2 each), stored lane-major (conflict-free); the
// kernel's static_assert checks the exact size against the layout.
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
