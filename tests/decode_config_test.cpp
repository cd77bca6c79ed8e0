// The GPU decode kernel choice (src/cuda/decode_kernels.cpp) is a plain host function: checked here
// on every machine, GPU or not.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#if KVATTN_WITH_CUDA
#include "cuda/decode_kernels.h"
#include "kernels/variants/params.cuh"
#include "support/expect_error.h"
#include "support/kernel_choice.h"
#include "support/scoped_override.h"

namespace {

using kvattn::DType;
using kvattn::cuda::decode_smem_bytes;
using kvattn::cuda::decode_uses_prefill_kernels;
using kvattn_test::arch;
using kvattn_test::decode_choice;
using kvattn_test::h200_bulk;

bool decode_folds_in_kernel() { return kvattn::cuda::decode_folds_in_kernel(kvattn::detail::active_overrides()); }
namespace kernels = kvattn::kernels;

TEST(DecodeConfig, TensorCoresForHalfPrecisionKVWithMatchingQAndForFp8KV) {
  auto c = decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0);
  EXPECT_TRUE(c.tensor_cores);
  EXPECT_EQ(c.heads_per_cta, 4);
  EXPECT_EQ(c.page_size, 16);
  EXPECT_FALSE(decode_choice(DType::f32, DType::bf16, DType::bf16, 128, 128, 4, 16, 0).tensor_cores);
  EXPECT_FALSE(decode_choice(DType::bf16, DType::f16, DType::bf16, 128, 128, 4, 16, 0).tensor_cores);
  EXPECT_FALSE(decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, kvattn::kernels::kRope).tensor_cores);
  // fp8 KV under f16/bf16 q: f16 MMAs (decode_mma_kernel.cuh); f32 q and fused RoPE stay on CUDA cores.
  for (DType kv : {DType::e4m3, DType::e5m2})
    for (DType q : {DType::bf16, DType::f16}) {
      auto f = decode_choice(q, kv, DType::bf16, 128, 128, 8, 16, 0);
      EXPECT_TRUE(f.tensor_cores) << f.name();
      EXPECT_EQ(f.heads_per_cta, 8);
    }
  EXPECT_FALSE(decode_choice(DType::f32, DType::e4m3, DType::f32, 128, 128, 4, 16, 0).tensor_cores);
  EXPECT_FALSE(decode_choice(DType::bf16, DType::e4m3, DType::bf16, 128, 128, 4, 16, kvattn::kernels::kRope).tensor_cores);
}

TEST(DecodeConfig, HeadsPerCtaDividesTheGroup) {
  EXPECT_EQ(decode_choice(DType::f16, DType::f16, DType::f16, 64, 64, 7, 16, 0).heads_per_cta, 7);
  // Tensor cores take up to 32 heads (two M tiles) where head_dim_vo <= 128, 16 above.
  EXPECT_EQ(decode_choice(DType::f16, DType::f16, DType::f16, 64, 64, 32, 16, 0).heads_per_cta, 32);
  EXPECT_EQ(decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 64, 16, 0).heads_per_cta, 32);
  EXPECT_EQ(decode_choice(DType::bf16, DType::e4m3, DType::bf16, 128, 128, 24, 16, 0).heads_per_cta, 24);
  EXPECT_EQ(decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 20, 16, 0).heads_per_cta, 20);
  EXPECT_EQ(decode_choice(DType::bf16, DType::bf16, DType::bf16, 256, 256, 32, 16, 0).heads_per_cta, 16);
  EXPECT_EQ(decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 48, 16, 0).heads_per_cta, 24);
  EXPECT_EQ(decode_choice(DType::f16, DType::f32, DType::f16, 64, 64, 12, 16, 0).heads_per_cta, 6);
  EXPECT_EQ(decode_choice(DType::f16, DType::f32, DType::f16, 64, 64, 1, 16, 0).heads_per_cta, 1);
}

TEST(DecodeConfig, CausalBitDroppedAndPageSizeBakedOnlyForPowersOfTwo) {
  auto c = decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 3, kvattn::kernels::kCausal | kvattn::kernels::kSoftCap);
  EXPECT_EQ(c.features, uint32_t(kvattn::kernels::kSoftCap));
  EXPECT_EQ(c.page_size, 0);
  EXPECT_EQ(decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 256, 0).page_size, 0);
}

TEST(DecodeConfig, SharedMemoryLeavesTwoCtasPerSm) {
  for (DType kv : {DType::f32, DType::bf16, DType::e4m3})
    for (int hd : {16, 64, 128, 256}) {
      auto c = decode_choice(DType::bf16, kv, DType::bf16, hd, hd, 8, 16, 0);
      // f32 rows of 256 elements: one CTA per SM (a 32-token tile of K and V is 130 KB).
      const int limit = kv == DType::f32 && hd == 256 ? 200 * 1024 : 112 * 1024;
      EXPECT_LE(decode_smem_bytes(c), limit) << c.name();
    }
}

// KVATTN_DECODE_KERNEL (or another variable) for one scope (the GPU tests may run in this process
// with KVATTN_DECODE_KERNEL=transposed or =bulk).
class DecodeKernelEnv : public kvattn_test::ScopedOverride {
 public:
  explicit DecodeKernelEnv(const char* value, const char* name = "KVATTN_DECODE_KERNEL") : ScopedOverride(name, value) {}
};

// fp8 K/V on sm_90: TMA boxes of 16 tokens x 128 bytes where head dims are whole 128-byte rows
// (128, 256) and pages a multiple of 16, else the row copies (head dim 64: 64-byte rows; page 1);
// the stages hold half the bytes of bf16's.
TEST(DecodeConfig, Fp8KVTakesTheBulkAndTmaKernelsOnSm90) {
  DecodeKernelEnv stages(nullptr, "KVATTN_DECODE_BULK_STAGES");
  DecodeKernelEnv grid(nullptr, "KVATTN_DECODE_GRID");
  DecodeKernelEnv env(nullptr);
  auto c = decode_choice(DType::bf16, DType::e4m3, DType::bf16, 128, 128, 4, 16, 0, true);
  EXPECT_TRUE(c.tensor_cores && c.bulk && c.tma);
  // Half the bytes per CTA: uniform batches keep 3 stages and split over three CTAs per SM.
  EXPECT_EQ(c.stages, 3);
  EXPECT_EQ(c.split_ctas_per_sm, 3);
  EXPECT_EQ(c.name(), "decode_mma_e4m3_qbf16_hd128_g4_p16_f0_tma");
  // 1 KB slack + 3 stages x 4 warps x 16 x (128 + 128) bytes + q 16 x 272 + 2 x 16 row scales + 12 barriers.
  EXPECT_EQ(decode_smem_bytes(c), 1024 + 3 * 4 * 16 * 256 + 16 * 272 + 128 + 96);
  // Skewed batches: 4 stages, two CTAs per SM.
  auto skewed = decode_choice(DType::bf16, DType::e4m3, DType::bf16, 128, 128, 4, 16, 0, true, true);
  EXPECT_EQ(skewed.stages, kvattn::cuda::kFp8DecodeSkewedStages);
  EXPECT_EQ(skewed.split_ctas_per_sm, 2);
  EXPECT_EQ(skewed.name(), "decode_mma_e4m3_qbf16_hd128_g4_p16_f0_tma_s4");
  EXPECT_LE(2 * (decode_smem_bytes(skewed) + 1024), 228 * 1024);
  // Head dim 256, skewed: 4 stages would leave one CTA per SM, so the 2-byte kernel's 2.
  auto hd256 = decode_choice(DType::f16, DType::e5m2, DType::f16, 256, 256, 4, 32, 0, true, true);
  EXPECT_TRUE(hd256.tma);
  EXPECT_EQ(hd256.stages, 2);
  EXPECT_LE(decode_smem_bytes(hd256), kvattn::cuda::kDecodeSmemPerCta);
  // An explicit stage count wins.
  {
    DecodeKernelEnv three("5", "KVATTN_DECODE_BULK_STAGES");
    EXPECT_EQ(decode_choice(DType::bf16, DType::e4m3, DType::bf16, 128, 128, 4, 16, 0, true, true).stages, 5);
  }
  auto hd64 = decode_choice(DType::bf16, DType::e4m3, DType::bf16, 64, 64, 4, 16, 0, true);
  EXPECT_TRUE(hd64.bulk && !hd64.tma);
  auto page1 = decode_choice(DType::bf16, DType::e5m2, DType::bf16, 128, 128, 4, 1, 0, true);
  EXPECT_TRUE(page1.bulk && !page1.tma);
  EXPECT_EQ(page1.name(), "decode_mma_e5m2_qbf16_hd128_g4_p1_f0_bulk");
  // 3 stages x 64 tokens x (144 + 144) padded rows + q + row scales + 12 barriers.
  EXPECT_EQ(decode_smem_bytes(page1), 3 * 64 * 288 + 16 * 272 + 128 + 96);
  // 2-byte K/V: one CTA per SM for the split, as measured.
  EXPECT_EQ(decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0, true).split_ctas_per_sm, 1);
  // Before sm_90: the cp.async tensor-core kernel; KVATTN_DECODE_KERNEL=transposed does not apply.
  auto ampere = decode_choice(DType::bf16, DType::e4m3, DType::bf16, 128, 128, 4, 16, 0, false);
  EXPECT_TRUE(ampere.tensor_cores && !ampere.bulk);
  EXPECT_EQ(ampere.split_ctas_per_sm, 1);
  EXPECT_EQ(decode_smem_bytes(ampere), 2 * 64 * 288 + 16 * 272 + 128 + 3 * 65 * 4);
  DecodeKernelEnv transposed("transposed");
  EXPECT_FALSE(decode_choice(DType::bf16, DType::e4m3, DType::bf16, 128, 128, 4, 16, 0, false).transposed);
}

// Two M tiles (17-32 heads per CTA) on every tensor-core family: the shared memory holds 32 q rows
// and each warp's 32 merge rows; the TMA kernel keeps 4 warps and 3 stages (two CTAs per SM).
TEST(DecodeConfig, LargeGroupsTakeTwoMTiles) {
  DecodeKernelEnv stages(nullptr, "KVATTN_DECODE_BULK_STAGES");
  DecodeKernelEnv grid(nullptr, "KVATTN_DECODE_GRID");
  DecodeKernelEnv env(nullptr);
  auto mqa = decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 32, 16, 0, true);
  EXPECT_TRUE(mqa.tma);
  EXPECT_EQ(mqa.heads_per_cta, 32);
  EXPECT_EQ(mqa.threads, 128);
  EXPECT_EQ(mqa.stages, 3);
  EXPECT_EQ(mqa.name(), "decode_mma_bf16_hd128_g32_p16_f0_tma");
  // 1 KB slack + 3 x 4 warps x 16 x 512 bytes (> the 4 x 32 x 130 x 4 of the merge) + q 32 x 272 + 12 barriers.
  EXPECT_EQ(decode_smem_bytes(mqa), 1024 + 3 * 4 * 16 * 512 + 32 * 272 + 96);
  EXPECT_LE(2 * (decode_smem_bytes(mqa) + 1024), 228 * 1024);
  auto fp8 = decode_choice(DType::bf16, DType::e4m3, DType::bf16, 128, 128, 32, 16, 0, true);
  // fp8, two M tiles: 5 stages of 4 x 16 x 256 bytes (more than the merge buffers' 4 x 32 x (128 + 2)
  // x 4), split over two CTAs per SM; q and its 2 x 32 scales; 20 barriers.
  EXPECT_EQ(fp8.stages, kvattn::cuda::kFp8DecodeLargeGroupStages);
  EXPECT_EQ(fp8.split_ctas_per_sm, 2);
  EXPECT_EQ(decode_smem_bytes(fp8), 1024 + 5 * 4 * 16 * 256 + 32 * 272 + 2 * 32 * 4 + 160);
  EXPECT_LE(2 * (decode_smem_bytes(fp8) + 1024), 228 * 1024);
  auto ampere = decode_choice(DType::f16, DType::f16, DType::f16, 128, 128, 32, 16, 0, false);
  EXPECT_EQ(decode_smem_bytes(ampere), 2 * 64 * 544 + 32 * 272 + 3 * 65 * 4);
  {
    DecodeKernelEnv transposed("transposed");
    EXPECT_EQ(decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 32, 16, 0).heads_per_cta, 16);
  }
}

TEST(DecodeConfig, EnvSelectsTheTransposedTensorCoreKernel) {
  {
    DecodeKernelEnv env(nullptr);
    auto c = decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0);
    EXPECT_FALSE(c.transposed);
    EXPECT_EQ(c.name(), "decode_mma_bf16_hd128_g4_p16_f0");
  }
  DecodeKernelEnv env("transposed");
  auto c = decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0);
  EXPECT_TRUE(c.tensor_cores);
  EXPECT_TRUE(c.transposed);
  EXPECT_EQ(c.name(), "decode_mma_bf16_hd128_g4_p16_f0_t");
  auto f16 = decode_choice(DType::f16, DType::f16, DType::f16, 256, 256, 16, 16, 0);
  EXPECT_TRUE(f16.transposed);
  EXPECT_EQ(f16.heads_per_cta, 16);  // two n-tiles of 8 heads in one CTA
  EXPECT_LE(decode_smem_bytes(f16), 112 * 1024) << f16.name();
  auto fp8 = decode_choice(DType::bf16, DType::e4m3, DType::bf16, 128, 128, 4, 16, 0);
  EXPECT_FALSE(fp8.transposed);  // 2-byte K/V only: fp8 keeps the ordinary tensor-core kernel
  EXPECT_EQ(fp8.name(), "decode_mma_e4m3_qbf16_hd128_g4_p16_f0");
}

// The bulk-copy kernels: the default on sm_90+ (the caller's bulk_copies flag) for f16/bf16 KV on
// tensor cores, TMA page boxes where pages and head dims allow, else row copies;
// KVATTN_DECODE_KERNEL=mma|transposed selects the others, =bulk the row copies (and changes nothing
// where the device has no bulk copies).
TEST(DecodeConfig, BulkKernelIsTheDefaultOnSm90ForHalfPrecisionKV) {
  DecodeKernelEnv stages(nullptr, "KVATTN_DECODE_BULK_STAGES");
  DecodeKernelEnv grid(nullptr, "KVATTN_DECODE_GRID");
  DecodeKernelEnv env(nullptr);
  auto c = decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0, /*bulk_copies=*/true);
  EXPECT_TRUE(c.tensor_cores);
  EXPECT_TRUE(c.bulk);
  EXPECT_FALSE(c.transposed);
  EXPECT_EQ(c.stages, 3);
  EXPECT_EQ(c.threads, 128);
  // Page 16: TMA page boxes (DecodeTmaKernel). 1 KB alignment slack + 3 x 4 warps x 16 x (128 + 128)
  // x 2 + q 16 x 272 + 12 barriers: two CTAs (plus 1 KB reserved each) per 228 KB SM.
  EXPECT_TRUE(c.tma);
  EXPECT_EQ(c.name(), "decode_mma_bf16_hd128_g4_p16_f0_tma");
  EXPECT_EQ(decode_smem_bytes(c), 103776);
  EXPECT_LE(2 * (decode_smem_bytes(c) + 1024), 228 * 1024);
  // Boxes need pages of a multiple of 16 tokens and head dims of a multiple of 64; elsewhere the
  // row copies (DecodeBulkKernel): 3 x 64 x (272 + 272) + q 16 x 272 + 12 barriers.
  for (int ps : {16, 32, 48, 128})
    EXPECT_TRUE(decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, ps, 0, true).tma) << ps;
  for (int ps : {1, 5, 8, 24}) {
    auto rows = decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, ps, 0, true);
    EXPECT_TRUE(rows.bulk && !rows.tma) << ps;
  }
  auto page1 = decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 1, 0, true);
  EXPECT_EQ(page1.name(), "decode_mma_bf16_hd128_g4_p1_f0_bulk");
  EXPECT_EQ(decode_smem_bytes(page1), 108896);
  auto hd80 = decode_choice(DType::bf16, DType::bf16, DType::bf16, 80, 80, 4, 16, 0, true);
  EXPECT_TRUE(hd80.bulk && !hd80.tma);
  // A sliding window's range starts off the 16-token grid (every tile would take the TMA kernel's
  // cp.async path): windows keep the row copies; soft-cap does not change the choice.
  auto window = decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, kvattn::kernels::kSlidingWindow, true);
  EXPECT_TRUE(window.bulk && !window.tma);
  EXPECT_TRUE(decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, kvattn::kernels::kSoftCap, true)
                  .tma);
  EXPECT_FALSE(decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0, false).tma);
  {
    DecodeKernelEnv rows("bulk");  // the row copies, for measurements
    auto r = decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0, true);
    EXPECT_TRUE(r.bulk && !r.tma);
    EXPECT_EQ(r.name(), "decode_mma_bf16_hd128_g4_p16_f0_bulk");
  }
  EXPECT_TRUE(decode_choice(DType::f16, DType::f16, DType::f16, 64, 64, 1, 16, 0, true).bulk);
  auto wide = decode_choice(DType::bf16, DType::bf16, DType::bf16, 256, 256, 8, 16, 0, true);
  EXPECT_TRUE(wide.bulk && wide.tma);
  EXPECT_EQ(wide.threads, 64);  // two warps keep two CTAs per SM at head dim 256
  EXPECT_LE(decode_smem_bytes(wide), 112 * 1024) << wide.name();
  // Not on devices before sm_90 (even when asked for), nor for anything off the tensor-core path.
  auto ampere = decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0, false);
  EXPECT_FALSE(ampere.bulk);
  EXPECT_EQ(ampere.stages, 2);
  EXPECT_EQ(ampere.name(), "decode_mma_bf16_hd128_g4_p16_f0");
  {
    DecodeKernelEnv asked("bulk");
    EXPECT_FALSE(decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0, false).bulk);
    EXPECT_TRUE(decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0, true).bulk);
  }
  EXPECT_TRUE(decode_choice(DType::bf16, DType::e4m3, DType::bf16, 128, 128, 4, 16, 0, true).bulk);
  EXPECT_FALSE(decode_choice(DType::f32, DType::f32, DType::f32, 128, 128, 4, 16, 0, true).bulk);
  EXPECT_FALSE(decode_choice(DType::f32, DType::bf16, DType::bf16, 128, 128, 4, 16, 0, true).bulk);
  EXPECT_FALSE(decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, kvattn::kernels::kRope, true).bulk);
  // KVATTN_DECODE_KERNEL=mma keeps the cp.async kernel on sm_90.
  {
    DecodeKernelEnv mma("mma");
    auto m = decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0, true);
    EXPECT_FALSE(m.bulk);
    EXPECT_FALSE(m.transposed);
    EXPECT_EQ(m.name(), "decode_mma_bf16_hd128_g4_p16_f0");
  }
  // KVATTN_DECODE_BULK_STAGES sets the depth (in the name unless 3).
  {
    DecodeKernelEnv four("4", "KVATTN_DECODE_BULK_STAGES");
    auto s4 = decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0, true);
    EXPECT_EQ(s4.stages, 4);
    EXPECT_EQ(s4.threads, 128);
    EXPECT_EQ(s4.name(), "decode_mma_bf16_hd128_g4_p16_f0_tma_s4");
    EXPECT_EQ(decode_smem_bytes(s4), 136576);
    EXPECT_EQ(decode_smem_bytes(decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 1, 0, true)),
              143744);
  }
  {
    DecodeKernelEnv two("2", "KVATTN_DECODE_BULK_STAGES");
    auto s2 = decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0, true);
    EXPECT_EQ(s2.name(), "decode_mma_bf16_hd128_g4_p16_f0_tma_s2");
    EXPECT_LE(3 * (decode_smem_bytes(s2) + 1024), 228 * 1024);  // three CTAs per SM
    auto rows2 = decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 1, 0, true);
    EXPECT_LE(3 * (decode_smem_bytes(rows2) + 1024), 228 * 1024);
  }
  {
    // 3 is the default depth: the same kernel as with the variable unset (wide rows keep 2 warps).
    DecodeKernelEnv three("3", "KVATTN_DECODE_BULK_STAGES");
    EXPECT_EQ(decode_choice(DType::bf16, DType::bf16, DType::bf16, 256, 256, 8, 16, 0, true).name(),
              wide.name());
  }
  // Checked when read, whatever kernel is chosen after.
  EXPECT_KVATTN_ERROR(DecodeKernelEnv bad_stages("7", "KVATTN_DECODE_BULK_STAGES"),
                      "KVATTN_DECODE_BULK_STAGES is a number from 2 to 6, not '7'");
}

// The default workers: one per SM for one CTA per item (rounded down to a multiple of the KV
// heads when that leaves two per head), every resident slot for the persistent grid.
TEST(DecodeConfig, DefaultWorkersAreOnePerSmForOneCtaPerItem) {
  using kvattn::cuda::decode_default_workers;
  EXPECT_EQ(decode_default_workers(132, 2, 1, 1, 8, false), 128);   // H200, 32/8 heads
  EXPECT_EQ(decode_default_workers(132, 3, 1, 1, 32, false), 128);  // residency does not matter
  EXPECT_EQ(decode_default_workers(132, 2, 1, 1, 1, false), 132);   // MQA: nothing to round
  EXPECT_EQ(decode_default_workers(132, 2, 1, 1, 67, false), 132);  // fewer than two per head: kept
  EXPECT_EQ(decode_default_workers(132, 2, 1, 2, 8, false), 64);    // two head chunks per KV head
  EXPECT_EQ(decode_default_workers(108, 2, 1, 1, 8, false), 104);   // A100
  EXPECT_EQ(decode_default_workers(132, 3, 3, 1, 8, false), 392);   // fp8: three CTAs per SM, rounded
  EXPECT_EQ(decode_default_workers(132, 3, 2, 1, 8, false), 264);   // fp8 skewed: two
  EXPECT_EQ(decode_default_workers(132, 2, 3, 1, 8, false), 264);   // never more than fit
  EXPECT_EQ(decode_default_workers(132, 2, 1, 1, 8, true), 264);    // persistent: every slot
  EXPECT_EQ(decode_default_workers(132, 2, 2, 1, 8, true), 264);    // (whatever the split asks)
  EXPECT_EQ(decode_default_workers(132, 0, 1, 1, 8, true), 132);    // occupancy unknown: one per SM
  EXPECT_EQ(decode_default_workers(1, 1, 1, 4, 8, false), 1);       // never zero
}

// Skewed batches take the 2-stage bulk kernel (three CTAs per SM), the others 3 stages; the env
// override wins; graph mode never asks (DecodeRunner::plan).
TEST(DecodeConfig, SkewedBatchesTakeTwoBulkStages) {
  using kvattn::cuda::decode_batch_is_skewed;
  auto skewed = [](std::vector<int32_t> v) { return decode_batch_is_skewed(v); };
  EXPECT_FALSE(skewed({}));
  EXPECT_FALSE(skewed({32768}));                 // one request: nothing to balance
  EXPECT_FALSE(skewed(std::vector<int32_t>(64, 4096)));
  EXPECT_FALSE(skewed({0, 0, 0}));
  EXPECT_FALSE(skewed({1000, 100}));             // 1000 x 2 < 4 x 1100
  EXPECT_FALSE(skewed({4000, 0}));               // 2x the mean
  EXPECT_TRUE(skewed({4000, 0, 0, 0}));          // 4x the mean
  std::vector<int32_t> long_short(64, 512);
  long_short[0] = 32768;                         // 1 x 32k + 63 x 512: 32x the mean
  EXPECT_TRUE(skewed(long_short));
  std::vector<int32_t> zipf;                     // Zipf-like: rank i ~ 1 / i
  for (int i = 1; i <= 64; ++i) zipf.push_back(int32_t(55000 / i));
  EXPECT_TRUE(skewed(zipf));
  DecodeKernelEnv no_kernel(nullptr);
  DecodeKernelEnv no_stages(nullptr, "KVATTN_DECODE_BULK_STAGES");
  auto c = decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0, true, true);
  EXPECT_TRUE(c.bulk);
  EXPECT_EQ(c.stages, 2);
  EXPECT_EQ(decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0, true, false).stages, 3);
  // Without bulk copies the flag changes nothing.
  EXPECT_EQ(decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0, false, true).name(),
            decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0, false, false).name());
  DecodeKernelEnv four("4", "KVATTN_DECODE_BULK_STAGES");
  EXPECT_EQ(decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0, true, true).stages, 4);
}

// KVATTN_DECODE_KERNEL=decode keeps the decode kernels' own choice (TMA boxes on sm_90 at page 16).
TEST(DecodeConfig, DecodeOverrideIsTheDefaultChoice) {
  std::string unset, decode;
  {
    DecodeKernelEnv env(nullptr);
    unset = decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0, true).name();
  }
  {
    DecodeKernelEnv env("decode");
    decode = decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0, true).name();
  }
  EXPECT_EQ(decode, unset);
  EXPECT_NE(decode.find("_tma"), std::string::npos) << decode;
}

TEST(DecodeConfig, UnknownKernelOverrideIsAnError) {
  EXPECT_KVATTN_ERROR(DecodeKernelEnv env("fast"),
                      "KVATTN_DECODE_KERNEL is one of decode, mma, transposed, bulk, prefill, not 'fast'");
}

// Split rows fold in the separate merge kernel unless KVATTN_DECODE_MERGE=fold asks for the
// in-kernel fold; other values are errors.
// BatchDecode on the prefill kernels (decode_kernels.h documents why): only where the decode
// kernel would be the cp.async tensor-core one, the group has 4-16 heads and the prefill kernels
// take the problem within the device's shared memory (wherever the page table lives);
// KVATTN_DECODE_KERNEL forces either way (never past what the prefill kernels take).
TEST(DecodeConfig, DecodeRunsOnThePrefillKernelsOnlyWhereTheyWereFaster) {
  const DType bf = DType::bf16, f16 = DType::f16, e4 = DType::e4m3;
  constexpr int64_t kA100 = 163 * 1024, kAda = 99 * 1024;  // opt-in shared memory per block
  // (q, kv, head dims, group, features, bulk copies, shared memory): page size 16.
  // The architecture's limits for the per-block limits named here, the H200's (with or without
  // bulk copies) for the others.
  auto limits = [](bool bulk, int64_t smem) {
    if (smem == kA100) return arch("sm_80");
    if (smem == kAda) return arch("sm_89");
    kvattn::cuda::DeviceLimits l = h200_bulk(bulk);
    l.smem_per_block_optin = smem;
    return l;
  };
  auto key = [](DType q, DType kv, int dqk, int dvo, int group, uint32_t f) {
    kvattn::cuda::DecodeProblemKey k;
    k.q_dtype = k.o_dtype = q;
    k.kv_dtype = kv;
    k.head_dim_qk = dqk;
    k.head_dim_vo = dvo;
    k.group_size = group;
    k.page_size = 16;
    k.features = f;
    return k;
  };
  auto route = [&](DType q, DType kv, int dqk, int dvo, int group, uint32_t f, bool bulk, int64_t smem) {
    return decode_uses_prefill_kernels(key(q, kv, dqk, dvo, group, f), limits(bulk, smem),
                                       kvattn::detail::active_overrides());
  };
  {
    DecodeKernelEnv env(nullptr);
    // A device without bulk copies (sm_80/86/89, sm_120): GQA groups of 4 to 16.
    EXPECT_TRUE(route(bf, bf, 128, 128, 4, 0, false, kA100));
    EXPECT_TRUE(route(f16, f16, 64, 64, 8, kernels::kSoftCap, false, kAda));
    EXPECT_TRUE(route(bf, bf, 128, 128, 16, kernels::kSlidingWindow, false, kAda));
    EXPECT_FALSE(route(bf, bf, 128, 128, 1, 0, false, kA100));  // MHA
    EXPECT_FALSE(route(bf, bf, 128, 128, 2, 0, false, kA100));
    EXPECT_FALSE(route(bf, bf, 128, 128, 64, 0, false, kAda));  // wide groups: not measured
    // The bulk-copy decode kernel (sm_90, sm_100) is as fast or faster, but for long batches.
    EXPECT_FALSE(route(bf, bf, 128, 128, 4, 0, true, 227 * 1024));
    auto long_route = [&](std::vector<int64_t> lens, uint32_t f = 0, bool graph = false, int group = 4,
                          DType kv = DType::bf16) {
      kvattn::cuda::DecodeBatchShape b;
      b.kv_len = lens;
      b.num_kv_heads = 8;
      b.cuda_graph = graph;
      return decode_uses_prefill_kernels(key(bf, kv, 128, 128, group, f), kvattn_test::h200(),
                                         kvattn::detail::active_overrides(), b);
    };
    EXPECT_TRUE(long_route(std::vector<int64_t>(64, 4096)));
    EXPECT_TRUE(long_route(std::vector<int64_t>(16, 32768)));  // 128 (request, KV head) pairs
    EXPECT_TRUE(long_route(std::vector<int64_t>(64, 2048)));   // the mean at the threshold
    EXPECT_TRUE(long_route(std::vector<int64_t>(64, 4096), kernels::kCausal));  // decode: causal cuts nothing
    EXPECT_FALSE(long_route(std::vector<int64_t>(64, 2047)));  // short: the decode kernels
    EXPECT_FALSE(long_route(std::vector<int64_t>(64, 1016)));
    EXPECT_FALSE(long_route(std::vector<int64_t>(1, 32768)));  // too few pairs to fill the SMs
    EXPECT_FALSE(long_route(std::vector<int64_t>(15, 32768)));
    EXPECT_FALSE(long_route({}));
    EXPECT_FALSE(long_route(std::vector<int64_t>(64, 4096), 0, /*graph=*/true));  // a captured run() keeps its kernels
    EXPECT_FALSE(long_route(std::vector<int64_t>(64, 4096), kernels::kSoftCap));  // variants: not measured
    EXPECT_FALSE(long_route(std::vector<int64_t>(64, 4096), kernels::kSlidingWindow));
    EXPECT_FALSE(long_route(std::vector<int64_t>(64, 4096), 0, false, 1));  // MHA
    EXPECT_FALSE(long_route(std::vector<int64_t>(64, 4096), 0, false, 4, e4));  // fp8 KV
    // Not the tensor-core decode kernel: fp8 KV, fused RoPE, mixed q/KV types, f32.
    EXPECT_FALSE(route(bf, e4, 128, 128, 4, 0, false, kA100));
    EXPECT_FALSE(route(bf, bf, 128, 128, 4, kernels::kRope, false, kA100));
    EXPECT_FALSE(route(f16, bf, 128, 128, 4, 0, false, kA100));
    EXPECT_FALSE(route(DType::f32, DType::f32, 128, 128, 4, 0, false, kA100));
    // Head dims the prefill kernels do not take stay on the decode kernels (and their errors).
    EXPECT_FALSE(route(bf, bf, 512, 512, 4, 0, false, kA100));
    EXPECT_FALSE(route(bf, bf, 128, 320, 4, 0, false, kA100));
    EXPECT_FALSE(route(bf, bf, 72, 72, 4, 0, false, kA100));
    // The page table's place does not matter: both kernel families read device ids in place.
    // A prefill kernel that would not fit the device's shared memory.
    EXPECT_FALSE(route(bf, bf, 128, 128, 4, 0, false, 16 * 1024));
  }
  {
    DecodeKernelEnv env("prefill");
    EXPECT_TRUE(route(bf, bf, 128, 128, 1, 0, true, kA100));
    EXPECT_TRUE(route(bf, e4, 128, 128, 4, kernels::kRope, true, kA100));
    EXPECT_FALSE(route(DType::f32, DType::f32, 128, 128, 4, 0, true, kA100));  // unsupported there
    EXPECT_FALSE(route(bf, bf, 512, 512, 4, 0, true, kA100));
    EXPECT_FALSE(route(bf, bf, 128, 120, 4, 0, true, kA100));
    // hd 256, group 64: the 64-token KV tile needs 200 KB; A100 (163 KB) takes it with 32-token
    // tiles (137 KB), Ada (99 KB) not at all.
    EXPECT_TRUE(route(bf, bf, 256, 256, 64, 0, true, kA100));
    EXPECT_FALSE(route(bf, bf, 256, 256, 64, 0, true, kAda));
  }
  for (const char* kernel : {"mma", "transposed", "bulk", "decode"}) {
    DecodeKernelEnv env(kernel);
    EXPECT_FALSE(route(bf, bf, 128, 128, 4, 0, false, kA100)) << kernel;
  }
  EXPECT_KVATTN_ERROR(DecodeKernelEnv env("prefil"),
                      "KVATTN_DECODE_KERNEL is one of decode, mma, transposed, bulk, prefill, not 'prefil'");
}

TEST(DecodeConfig, SplitRowsFoldInKernelOnlyWhenAsked) {
  {
    DecodeKernelEnv env(nullptr, "KVATTN_DECODE_MERGE");
    EXPECT_FALSE(decode_folds_in_kernel());
  }
  {
    DecodeKernelEnv env("fold", "KVATTN_DECODE_MERGE");
    EXPECT_TRUE(decode_folds_in_kernel());
  }
  {
    DecodeKernelEnv env("kernel", "KVATTN_DECODE_MERGE");
    EXPECT_FALSE(decode_folds_in_kernel());
  }
  EXPECT_KVATTN_ERROR(DecodeKernelEnv env("later", "KVATTN_DECODE_MERGE"),
                      "KVATTN_DECODE_MERGE is one of kernel, fold, not 'later'");
}

TEST(DecodeConfig, GridOverrideIsCheckedByName) {
  {
    DecodeKernelEnv env("workers", "KVATTN_DECODE_GRID");
    EXPECT_TRUE(decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0, true).persistent);
  }
  {
    DecodeKernelEnv env("items", "KVATTN_DECODE_GRID");
    EXPECT_FALSE(decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, 0, true).persistent);
  }
  EXPECT_KVATTN_ERROR(DecodeKernelEnv env("persistent", "KVATTN_DECODE_GRID"),
                      "KVATTN_DECODE_GRID is one of items, workers, not 'persistent'");
}

TEST(DecodeConfig, UnsupportedShapesAreErrors) {
  EXPECT_KVATTN_ERROR(decode_choice(DType::bf16, DType::bf16, DType::bf16, 512, 512, 4, 16, 0),
                      "head dim 512 is not supported by the GPU decode kernels");
  EXPECT_KVATTN_ERROR(decode_choice(DType::bf16, DType::bf16, DType::bf16, 72, 72, 4, 16, 0),
                      "head dim 72");
  EXPECT_KVATTN_ERROR(decode_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, 16, kvattn::kernels::kCustomMask),
                      "custom masks are not supported by decode");
}

}  // namespace
#endif
