// The batch prefill/append kernel family (tensor cores, src/kernels/prefill/): which kernel a
// prefill problem runs (a plain host function, unit-tested on the CPU), its JIT specs and its
// shared-memory size.
#pragma once

#include <cstdint>
#include <string>

#include "cuda/jit.h"
#include "kernels/common/merge_rows.cuh"
#include "kvattn/dtype.h"

namespace kvattn::cuda {

// Everything that specialises one prefill kernel.
struct PrefillKernelConfig {
  DType q_dtype = DType::bf16, kv_dtype = DType::bf16, o_dtype = DType::bf16;
  int head_dim_qk = 128, head_dim_vo = 128;
  int heads_per_cta = 1;  // query heads of one KV head's group packed into the M tile (blockIdx.y: the rest)
  int warps = 4;
  int m_tiles = 1;        // 16-row MMA tiles per warp: M = 16 x m_tiles x warps
  int kv_warps = 1;       // warps splitting each KV tile for the same M rows (the decode shape)
  int kv_tile = 64;       // KV tokens per pipeline stage (kv_tile / kv_warps per warp)
  int stages = 2;
  int min_blocks = 1;     // __launch_bounds__ minimum CTAs per SM (caps registers per thread)
  bool paged = false;
  int page_size = 0;      // paged: baked in when a power of two <= 128, else 0 (read at run time)
  uint32_t features = 0;  // kernels::VariantFeature bits
  bool fast_tanh = false; // soft-cap through tanh.approx.f32 (only with the soft-cap feature)
  // Paged: the page ids come from a device-resident table, so the kernel checks each one (an id
  // outside [0, num_pages) poisons its item's rows and is reported). Host ids are checked by
  // plan()/run(), and their kernels skip the check: it cost page-1 prefill 5% (H200 at 4eb8450).
  bool checked_ids = false;
  // kernels::prefill::PrefillTuning bits: code-generation choices (lazy rescale, swizzled K/V,
  // unrolled Q K^T) that change speed, not results beyond rounding.
  uint32_t tuning = 0;

  int threads() const { return warps * kv_warps * 32; }
  int rows() const { return warps * 16 * m_tiles; }
  // Query tokens per work item (the planner's TileShape::query_tokens).
  int query_tokens() const { return rows() / heads_per_cta; }
  std::string name() const;  // "prefill_bf16_hd128_g4_w4x2_k64_s2_b2_paged16_f1"
};

// The tile shape of long query runs (M rows >= 64): "warps x m_tiles, KV tile, stages, CTAs per
// SM", one set per head-dim class. Selected by the environment variable KVATTN_PREFILL_VARIANT
// (read at every plan; unknown names are errors):
//   name      head dims <= 64     <= 128             > 128
//   m2k32     4x2 k64 s2 b2       4x2 k32 s3 b2      4x1 k32 s2 b2
//   m2k64     4x2 k64 s3 b2       4x2 k64 s2 b2      8x1 k64 s2 b1   (default: measured fastest)
//   m1k64     8x1 k64 s2 b1       8x1 k64 s2 b1      8x1 k32 s2 b1
//   m2w8      8x2 k64 s2 b1       8x2 k32 s2 b1      8x1 k64 s2 b1
//   m2k48     4x2 k48 s3 b2       4x2 k48 s2 b2      8x1 k48 s2 b1
//   m2k48s3   4x2 k48 s3 b2       4x2 k48 s3 b2      8x1 k48 s2 b1
// Soft-cap's tanh is tanh.approx.f32 on the long shapes (relative error <= 2^-10.987, as FlashInfer)
// and exact (ex2 + rcp) on the short and decode shapes; KVATTN_PREFILL_TANH=exact|approx forces one.
// The long shapes also take tuning bits (prefill_tuning_for); KVATTN_PREFILL_TUNING=<0-2047>
// replaces them (an experiment knob, read at every plan), except that the soft-cap bits 256-1024
// are cleared wherever the fixed shift does not apply, and a knob without 256 clears them all.
struct PrefillTileShape {
  int warps, m_tiles, kv_tile, stages, min_blocks;
};
PrefillTileShape prefill_long_shape(const std::string& variant, int head_dim_qk, int head_dim_vo);
// KVATTN_PREFILL_VARIANT when set; else m2k64.
std::string prefill_variant_for();
// The tuning bits of a long-shape kernel (kernels::prefill::PrefillTuning; H200 on generated values
// at 29ac2ce and a073d20, docs/perf/HISTORY.md): the lazy rescale and the unrolled Q K^T
// everywhere; the swizzled K/V above head dim 128; at head dim 128 all five bits (P packed early
// and lean copies too) with one query head per CTA and for paged GQA-packed CTAs (except where
// those spill: custom masks, fp8 or RoPE K/V keep the lazy rescale only); lean copies also for
// ragged K/V at head dims 64 and 256; soft-cap lazy and unrolled only (through tanh.approx,
// fast_tanh, P packed early and lean copies too) where the fixed shift does not apply; where it
// does (choose_prefill_config: bf16, cap <= 54.7, 2-byte K/V without RoPE or a custom mask)
// soft-cap takes the five bits, the whole-tile transform and the tile in halves, in quarters above
// head dim 128 and through tanh.approx above hd 64 (at 7bc9489 and 1613d39; tanh.approx at hd 64
// runs halves on two stages instead). The kernel is latency-bound at 255 registers, so each bit
// moves a kernel by a few percent either way; each choice was measured, none is derived. kv_bytes:
// bytes of the KV storage type.
uint32_t prefill_tuning_for(uint32_t features, int head_dim_qk, int head_dim_vo, int kv_bytes, int heads_per_cta,
                            bool paged, bool fast_tanh = false);

// The heuristic (unit-tested in tests/prefill_config_test.cpp):
//  - tensor cores always: q is f16 or bf16 and the MMA type; KV is the same dtype or fp8 (e4m3,
//    e5m2: converted in shared memory, scales folded into sm_scale and the output);
//  - heads per CTA: the largest divisor of the GQA group up to 128 (the whole group, in practice);
//  - when the longest request's packed rows (max_qo_len x heads) fill at least half of the long
//    shape's M tile (and the group fits in it): the long shape above, its KV tile halved (to 32)
//    and then its stages cut (to 2) while its shared memory exceeds the per-CTA share of
//    min_blocks CTAs per SM (fp8 KV and RoPE add buffers) or max_smem_per_block (the device's
//    opt-in limit per block; the default is the H200's);
//  - otherwise one 16-row tile per warp, the fewest warps that hold the rows, at most 8 (4 for
//    head dims above 128), KV tiles of 64 tokens (32 for head dims above 128 or a single warp, or
//    when 64 exceeds max_smem_per_block), 2 stages;
//  - where one warp holds the rows (decode: one query token and the group), the decode shape
//    (prefill_decode_shape): kv_warps warps split each KV tile; `uniform_decode` (a decode batch
//    that decode_batch_is_skewed calls uniform, outside graph mode) takes its uniform variant;
//  - bf16 soft-cap (without ALiBi) with 0 < soft_cap <= 54.7 (cap_shift_fits; the variant's
//    value, 0 when unknown) takes kTuneCapShift unless KVATTN_PREFILL_TUNING clears it; every
//    other kernel has it cleared.
//  - soft-cap's tanh: `tanh` by_shape takes tanh.approx on the long shape and the exact form on
//    the others unless KVATTN_PREFILL_TANH forces one; exact and approx force one (the presets
//    compile both forms of the long kernel). A request's tanh form thus follows its batch's
//    longest query run (as its tile shape does); bf16 soft-cap through tanh.approx at hd 64 on
//    the default m2k64 takes two stages instead of three.
// Throws kvattn::Error naming the value for dtypes or head dims the GPU kernels do not take.
enum class TanhForm { by_shape, exact, approx };
PrefillKernelConfig choose_prefill_config(DType q, DType kv, DType o, int head_dim_qk, int head_dim_vo,
                                          int group_size, bool paged, int page_size, uint32_t features,
                                          int64_t max_qo_len, int64_t max_smem_per_block = 227 * 1024,
                                          bool uniform_decode = false, float soft_cap = 0.0f,
                                          TanhForm tanh = TanhForm::by_shape);

// The decode shape: KV warps, tokens per warp, stages and CTAs per SM (__launch_bounds__'s minimum)
// of a one-M-warp kernel. By default (H200 at 9fa4daf, docs/perf/HISTORY.md) 4 warps x 16 tokens
// at 3 CTAs per SM, and for uniform decode batches 6 x 16 at 2 (1.5-2.5% faster there, and with
// 2/3 of the workers the planner keeps whole requests; 5% slower on Zipf lengths). The environment
// variable KVATTN_PREFILL_DECODE_SHAPE="<kv_warps>x<tokens>s<stages>[b<ctas>]" replaces both
// (kv_warps 1, 2, 4, 6 or 8; tokens 16, 32 or 64; stages 2-4; CTAs 1-8; read at every plan;
// malformed values are errors).
struct PrefillDecodeShape {
  int kv_warps, warp_tokens, stages, min_blocks;
};
PrefillDecodeShape prefill_decode_shape(bool uniform_decode = false);

int prefill_smem_bytes(const PrefillKernelConfig& c);
KernelSpec prefill_spec(const PrefillKernelConfig& c, const std::string& arch);
// The merge of split rows for the same output dtype, head dim and softmax/sigmoid choice.
KernelSpec prefill_merge_spec(const PrefillKernelConfig& c, const std::string& arch);
inline constexpr int kPrefillMergeThreads = kernels::kMergeRowThreads;

}  // namespace kvattn::cuda
