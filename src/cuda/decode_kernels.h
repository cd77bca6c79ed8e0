// The paged batch-decode kernel family: which kernel a decode problem runs (a plain host function,
// unit-tested on the CPU), its JIT specs, and its shared-memory size.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/overrides.h"
#include "cuda/device_limits.h"
#include "cuda/jit.h"
#include "cuda/kernel_variant.h"
#include "kernels/common/merge_rows.cuh"
#include "kvattn/dtype.h"

namespace kvattn::cuda {

// Everything that specialises one decode kernel.
struct DecodeKernelConfig {
  bool tensor_cores = false;  // DecodeMmaKernel (f16/bf16 KV) or DecodeKernel (CUDA cores)
  // Tensor cores only: DecodeMmaTKernel (tokens as MMA rows, heads as columns: half the MMAs per
  // KV byte for groups up to 8), selected by KVATTN_DECODE_KERNEL=transposed.
  bool transposed = false;
  // Tensor cores only: DecodeBulkKernel (K/V rows by cp.async.bulk completing on mbarriers,
  // `stages` deep; sm_90+), the default where the device has bulk copies.
  bool bulk = false;
  // Bulk only: DecodeTmaKernel (a warp's 16 K and V rows of one page as TMA tensor boxes, swizzled,
  // instead of 32 row copies), where pages hold a multiple of 16 tokens and the head dims are
  // multiples of 64. KVATTN_DECODE_KERNEL=bulk keeps the row copies, for measurements.
  bool tma = false;
  DType q_dtype = DType::bf16, kv_dtype = DType::bf16, o_dtype = DType::bf16;
  int head_dim_qk = 128, head_dim_vo = 128;
  int heads_per_cta = 4;      // query heads of one KV head's group per CTA (blockIdx.y splits the rest)
  int page_size = 0;          // baked in when a power of two <= 128, else 0 (read at run time)
  uint32_t features = 0;      // kernels::VariantFeature bits
  int stages = 2;
  int tile_tokens = 64;       // KV tokens per pipeline stage
  int threads = 128;
  // true: one CTA per worker runs the planner's list for that worker; false: one CTA per item.
  bool persistent = false;
  // L2 prefetch hint on the K/V copies, in bytes (64, 128 or 256; 0: none). A compile option.
  int l2_prefetch = 0;
  // One CTA per item: the CTAs per SM that the planner's split-KV fills (decode_default_workers).
  // Not part of the kernel: it shapes the plan.
  int split_ctas_per_sm = 1;
  // A user variant composed with the built-in one of `features` (not the transposed kernel).
  std::optional<UserVariantCode> user_variant;

  // "decode_mma_bf16_hd128_g4_p16_f0" ("..._t" when transposed, "..._bulk" or "..._bulk_s<stages>"
  // when bulk, the latter for stages other than 3; "..._tma" / "..._tma_s<stages>" likewise)
  std::string name() const;
  bool operator==(const DecodeKernelConfig&) const = default;
};

// What the decode kernel choice depends on (besides the device limits and the overrides).
struct DecodeProblemKey {
  DType q_dtype = DType::bf16, kv_dtype = DType::bf16, o_dtype = DType::bf16;
  int head_dim_qk = 128, head_dim_vo = 128;
  int group_size = 1;
  int page_size = 16;
  uint32_t features = 0;       // kernels::VariantFeature bits
  bool skewed_batch = false;   // decode_batch_is_skewed
  std::optional<UserVariantCode> user_variant;  // a user variant (docs/VARIANTS.md)
};

// The heuristic, from measurements on the H200 (docs/DECISIONS.md): tensor cores whenever the KV
// is f16/bf16, q has the same dtype and RoPE is not fused (the MMA needs both operands in one type;
// fused RoPE rotates K in f32 on the CUDA-core path). On tensor cores, where the device has bulk
// copies (DeviceLimits::has_bulk_copies: sm_90+) the bulk-copy kernel, 3 stages of 64 tokens,
// 4 warps, two CTAs per SM (measured 20-30% faster than cp.async on the H200); before sm_90 the
// cp.async kernel, 2 stages, three CTAs per SM. skewed_batch: the bulk kernel takes 2 stages,
// three CTAs per SM, where it otherwise takes 3 and two: measured on the H200 (2026-11-30 at
// 36f61d7, docs/perf/HISTORY.md), 2 stages lift 64 Zipf lengths from 3,541 to 3,797 GB/s and
// 1 x 32k + 63 x 512 from 2,931 to 3,225, but lower uniform batches (64 x 1016: 3,360 to 2,879;
// 64 x 4096: 3,945 to 3,861). At most half the SM's shared memory per CTA on the CUDA-core path
// and for the default warps (kDecodeSmemPerCta). Overrides: decode_kernel (mma|transposed|bulk
// pick a tensor-core kernel; bulk only where the device has it), decode_bulk_stages,
// decode_warps, decode_grid, decode_l2_prefetch.
// Throws kvattn::Error for head dims the GPU kernels do not take (a multiple of 16 up to 256) or a
// group that does not divide.
DecodeKernelConfig choose_decode(const DecodeProblemKey& key, const DeviceLimits& limits,
                                 const detail::Overrides& overrides = {});

// Whether split rows are folded inside the decode kernel by the last CTA of each merge entry
// (kernels/decode/split_fold.cuh; Overrides::decode_merge = fold), or by the separate merge kernel
// (the default: the in-kernel fold measured within a few percent of it on the H200, slower on
// single requests: 1 x 4096 -5%, 1 x 32k -1.5%; 2026-11-30, docs/perf/HISTORY.md "Decode
// experiments").
inline bool decode_folds_in_kernel(const detail::Overrides& o) { return o.decode_merge == detail::DecodeMerge::fold; }

// The most shared memory a decode CTA takes by default, so that two run per SM with room for
// the L1 (H200: 228 KB per SM; a smaller SM gets half of its own).
inline constexpr int64_t kDecodeSmemPerCta = 110 * 1024;

// fp8 K/V on the bulk-copy kernels: the ring's stages (where two CTAs per SM still fit; else the
// 2-byte default) and the CTAs per SM its split-KV fills, by batch and heads per CTA.
struct Fp8DecodeTuning {
  int stages = 3;
  int split_ctas_per_sm = 1;
};
inline constexpr int kFp8DecodeSkewedStages = 4;
inline constexpr int kFp8DecodeLargeGroupStages = 5;
Fp8DecodeTuning fp8_decode_tuning(bool skewed_batch, int heads_per_cta);

// A batch whose longest request has at least 4x the mean KV length (2 requests at least): the
// case where more, smaller CTAs balance better than deeper pipelines stream.
bool decode_batch_is_skewed(std::span<const int32_t> kv_len);

int decode_smem_bytes(const DecodeKernelConfig& c);

// The planner's default workers for the decode kernels. A persistent grid launches one CTA per
// worker: every resident slot (SMs x resident CTAs per SM / head chunks). With one CTA per item the
// block scheduler fills the slots itself and the workers only shape the split: one per SM (/ head
// chunks), rounded down to a multiple of the KV heads (one head per planner slice, plan.h
// "Slices") when that leaves at least two per head. Why one per SM: a one-wave batch split over
// both slots of an SM ran slower than one longer chunk per SM (H200: 16 x 4096 +8%, 16 x 512
// +21%, 1 x 4096 with 32/32 heads +19% at one per SM; multi-wave batches unchanged;
// 2026-11-30 at cd6e2d7, docs/perf/HISTORY.md). fp8 K/V streams half the bytes per CTA and fills
// DecodeKernelConfig::split_ctas_per_sm instead (fp8_decode_tuning).
int decode_default_workers(int sm_count, int resident_per_sm, int split_ctas_per_sm, int head_chunks, int num_kv_heads,
                           bool persistent);

// The batch of one decode plan, for the choice below (empty: no batch-dependent choice).
struct DecodeBatchShape {
  std::span<const int64_t> kv_len;  // tokens per request
  int num_kv_heads = 1;
  bool cuda_graph = false;  // a captured run() replays its kernels: no choice by lengths
};

// Whether BatchDecode runs as a batch prefill of one query per request on the mma.sync prefill
// kernels (their decode shape: the GQA group in the M tile, four warps splitting each KV tile),
// instead of on a decode kernel. Only where the prefill kernels take the head dims and dtypes
// with a kernel that fits max_smem_per_block, the decode kernel would be a tensor-core one
// (f16/bf16 KV, no fused RoPE) and the group has 4 to 16 heads; then:
//  - devices without bulk copies (sm_80/86/89, sm_120): always. On the H200 with the cp.async
//    decode kernel forced, the prefill kernels decoded 10-17% faster (docs/DECISIONS.md);
//  - devices with bulk copies (sm_90+): for long batches of plain softmax decode (no variant
//    feature but causal, which decode does not cut), outside CUDA-graph mode: at least 128
//    (request, KV head) pairs and a mean length of at least kLongDecodeMeanTokens. H200, 32/8, page
//    16 (2026-11-30 at de68c71, docs/perf/HISTORY.md): 64 x 4096 +6.5%, 64 x 32768 +9%, 256 x 4096
//    +5%, 16 x 32768 +10%, 64 Zipf lengths +7%, 64 x 2048 even; but 64 x 1016 -9%, 64 x 512 -16%
//    and 1 x 32768 -2.5% stay on the TMA decode kernel. The price: plan() balances 3 CTAs per SM by
//    splitting requests (64 x 4096: planner 8 us against 1 us), which a step that plans once for
//    all its layers pays once.
// The page table may be on the host or the device (both kernel families read device ids in
// place). Overrides::decode_kernel = prefill forces the prefill kernels, = decode the decode
// kernels' own choice, = mma|transposed|bulk one decode kernel.
inline constexpr int64_t kLongDecodeMeanTokens = 2048;
bool decode_uses_prefill_kernels(const DecodeProblemKey& key, const DeviceLimits& limits,
                                 const detail::Overrides& overrides = {}, const DecodeBatchShape& batch = {});
KernelSpec decode_spec(const DecodeKernelConfig& c, const std::string& arch);
// The merge of split rows for the same output dtype, head dim and softmax/sigmoid choice.
KernelSpec decode_merge_spec(const DecodeKernelConfig& c, const std::string& arch);
inline constexpr int kDecodeMergeThreads = kernels::kMergeRowThreads;

}  // namespace kvattn::cuda
