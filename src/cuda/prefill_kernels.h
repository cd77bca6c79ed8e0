// The batch prefill/append kernel family (tensor cores, src/kernels/prefill/): which kernel a
// prefill problem runs (a plain host function, unit-tested on the CPU), its JIT specs and its
// shared-memory size.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/overrides.h"
#include "cuda/device_limits.h"
#include "cuda/jit.h"
#include "cuda/kernel_variant.h"
#include "kernels/common/merge_rows.cuh"
#include "kernels/prefill/smem_layout.cuh"
#include "kvattn/dtype.h"

namespace kvattn::cuda {

// Everything that specialises one prefill kernel.
struct PrefillKernelConfig {
  // mma_sync: kernels/prefill/prefill_mma_kernel.cuh, `warps` x `kv_warps` warps. wgmma: the Hopper
  // tier (kernels/prefill/prefill_wgmma_kernel.cuh), a producer warpgroup and `warps` = 8 consumer
  // warps; m_tiles 1, kv_warps 1, and of the tuning only the softmax form and the whole-tile
  // transform apply.
  detail::PrefillTier tier = detail::PrefillTier::mma_sync;
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
  // Code-generation choices (lazy rescale, swizzled K/V, unrolled Q K^T, ...) that change speed,
  // not results beyond rounding (kernels/prefill/smem_layout.cuh).
  kernels::prefill::PrefillTuning tuning{};
  // The lazy rescale's threshold in log2 units (score_math.cuh); 0: the default (8).
  int lazy_log2 = 0;
  // A user variant composed with the built-in one of `features` (docs/VARIANTS.md).
  std::optional<UserVariantCode> user_variant;

  int threads() const { return tier == detail::PrefillTier::wgmma ? (warps + 4) * 32 : warps * kv_warps * 32; }
  int rows() const { return warps * 16 * m_tiles; }
  // Query tokens per work item (the planner's TileShape::query_tokens).
  int query_tokens() const { return rows() / heads_per_cta; }
  // "prefill_bf16_hd128_g4_w4x2_k64_s2_b2_paged16_f1_lazy-swizzle-unroll-packp-lean",
  // "prefill_wgmma_bf16_hd128_g1_w8_k128_s2_ragged_f1_lazy"
  std::string name() const;
  bool operator==(const PrefillKernelConfig&) const = default;
};

// What the prefill kernel choice depends on (besides the device limits and the overrides).
struct PrefillProblemKey {
  DType q_dtype = DType::bf16, kv_dtype = DType::bf16, o_dtype = DType::bf16;
  int head_dim_qk = 128, head_dim_vo = 128;
  int group_size = 1;     // query heads per KV head
  bool paged = false;
  int page_size = 0;
  uint32_t features = 0;  // kernels::VariantFeature bits
  int64_t max_qo_len = 1; // the batch's longest query run
  bool uniform_decode = false;  // a decode batch decode_batch_is_skewed calls uniform (not graph mode)
  float soft_cap = 0.0f;  // the variant's cap (0: unknown or none)
  std::optional<UserVariantCode> user_variant;  // a user variant (docs/VARIANTS.md)
};

// The tile shape of long query runs (M rows >= 64), one row per head-dim class (<= 64, <= 128,
// > 128), named by PrefillLongShape (detail::Overrides::prefill_long_shape; m2k64 by default):
//   name      head dims <= 64     <= 128             > 128
//   m2k32     4x2 k64 s2 b2       4x2 k32 s3 b2      4x1 k32 s2 b2
//   m2k64     4x2 k64 s3 b2       4x2 k64 s2 b2      8x1 k64 s2 b1   (default: measured fastest)
//   m1k64     8x1 k64 s2 b1       8x1 k64 s2 b1      8x1 k32 s2 b1
//   m2w8      8x2 k64 s2 b1       8x2 k32 s2 b1      8x1 k64 s2 b1
//   m2k48     4x2 k48 s3 b2       4x2 k48 s2 b2      8x1 k48 s2 b1
//   m2k48s3   4x2 k48 s3 b2       4x2 k48 s3 b2      8x1 k48 s2 b1
struct PrefillTileShape {
  int warps, m_tiles, kv_tile, stages, min_blocks;
};
PrefillTileShape prefill_long_shape(detail::PrefillLongShape shape, int head_dim_qk, int head_dim_vo);

// The tuning of a long-shape kernel (H200 on generated values at 29ac2ce and a073d20,
// docs/perf/HISTORY.md): the lazy rescale and the unrolled Q K^T everywhere; the swizzled K/V
// above head dim 128; at head dim 128 all five (P packed early and lean copies too) with one
// query head per CTA and for paged GQA-packed CTAs (except where those spill: custom masks, fp8
// or RoPE K/V keep the lazy rescale only); lean copies also for ragged K/V at head dims 64 and
// 256; plain softmax over ragged 2-byte K/V above head dim 128 by halves; soft-cap lazy and
// unrolled only (through tanh.approx, fast_tanh, P packed early and lean copies too). Where the
// fixed shift applies (choose_prefill: bf16, cap <= 54.7, 2-byte K/V without RoPE or a custom
// mask) soft-cap takes shifted_soft_cap_tuning instead. The kernel is latency-bound at 255
// registers, so each choice moves a kernel by a few percent either way; each was measured, none
// is derived. kv_bytes: bytes of the KV storage type.
kernels::prefill::PrefillTuning prefill_tuning_for(uint32_t features, int head_dim_qk, int head_dim_vo, int kv_bytes,
                                                   int heads_per_cta, bool paged, bool fast_tanh = false);

// The heuristic (unit-tested in tests/prefill_config_test.cpp):
//  - the Hopper tier (PrefillTier::wgmma) on devices with sm_90a (DeviceLimits::has_wgmma) for long
//    query runs (packed rows >= 64, as the long shape) of 2-byte K/V in the q dtype without RoPE,
//    head dims multiples of 64 up to 256: 128 query rows, KV tiles of 128 tokens (64 above head
//    dim 128), 2 stages; the lazy rescale (the fixed shift for bf16 soft-cap), the whole-tile
//    transform for ALiBi, tanh.approx for soft-cap. Overrides::prefill_tier = mma_sync keeps the
//    mma.sync tier. Everything else below is the mma.sync tier;
//  - tensor cores always: q is f16 or bf16 and the MMA type; KV is the same dtype or fp8 (e4m3,
//    e5m2: converted in shared memory, scales folded into sm_scale and the output);
//  - heads per CTA: the largest divisor of the GQA group up to 128 (the whole group, in practice);
//  - when the longest request's packed rows (max_qo_len x heads) fill at least half of the long
//    shape's M tile (and the group fits in it): the long shape above, its KV tile halved (to 32)
//    and then its stages cut (to 2) while its shared memory exceeds each of min_blocks CTAs'
//    share of the SM (DeviceLimits::smem_per_cta; fp8 KV and RoPE add buffers);
//  - otherwise one 16-row tile per warp, the fewest warps that hold the rows, at most 8 (4 for
//    head dims above 128), KV tiles of 64 tokens (32 for head dims above 128 or a single warp, or
//    when 64 exceeds the device's per-block limit), 2 stages;
//  - where one warp holds the rows (decode: one query token and the group), the decode shape
//    (prefill_decode_shape): kv_warps warps split each KV tile; `uniform_decode` takes its
//    uniform variant;
//  - bf16 soft-cap (without ALiBi) with 0 < soft_cap <= 54.7 (cap_shift_fits) takes the fixed
//    shift (SoftmaxForm::fixed_shift) unless an overriding tuning names another softmax form;
//  - soft-cap's tanh: tanh.approx on the long shape, the exact form on the others, unless
//    Overrides::prefill_tanh forces one. A request's tanh form thus follows its batch's longest
//    query run (as its tile shape does); bf16 soft-cap through tanh.approx at hd 64 on the
//    default m2k64 takes two stages instead of three.
// Overrides: prefill_tier, prefill_long_shape, prefill_tuning (replaces every kernel's tuning, except that the
// fixed shift is taken away where it does not apply), prefill_tanh, prefill_decode_shape,
// prefill_lazy_log2. Throws kvattn::Error naming the value for dtypes or head dims the GPU
// kernels do not take.
PrefillKernelConfig choose_prefill(const PrefillProblemKey& key, const DeviceLimits& limits,
                                   const detail::Overrides& overrides = {});

// The decode shape: KV warps, tokens per warp, stages and CTAs per SM (__launch_bounds__'s minimum)
// of a one-M-warp kernel. By default (H200 at 9fa4daf, docs/perf/HISTORY.md) 4 warps x 16 tokens
// at 3 CTAs per SM, and for uniform decode batches 6 x 16 at 2 (1.5-2.5% faster there, and with
// 2/3 of the workers the planner keeps whole requests; 5% slower on Zipf lengths).
// Overrides::prefill_decode_shape replaces both.
detail::PrefillDecodeShape prefill_decode_shape(bool uniform_decode, const detail::Overrides& overrides = {});

int prefill_smem_bytes(const PrefillKernelConfig& c);
// The kernel's source: a named configuration (static constexpr members) and its entry point.
KernelSpec prefill_spec(const PrefillKernelConfig& c, const std::string& arch);
// The merge of split rows for the same output dtype, head dim and softmax/sigmoid choice.
KernelSpec prefill_merge_spec(const PrefillKernelConfig& c, const std::string& arch);
inline constexpr int kPrefillMergeThreads = kernels::kMergeRowThreads;

}  // namespace kvattn::cuda
