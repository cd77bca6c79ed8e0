// The GPU prefill kernel choice (src/cuda/prefill_kernels.cpp) is a plain host function: checked
// here on every machine, GPU or not.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <set>
#include <string>

#if KVATTN_WITH_CUDA
#include "cuda/kernel_registry.h"
#include "cuda/prefill_kernels.h"
#include "kernels/prefill/smem_layout.cuh"
#include "kernels/variants/params.cuh"
#include "support/expect_error.h"
#include "support/kernel_choice.h"
#include "support/scoped_override.h"

namespace {

using kvattn::DType;
using kvattn::cuda::prefill_smem_bytes;
using kvattn::detail::tuning_name;
using kvattn_test::arch;
using kvattn_test::h200;
using kvattn_test::prefill_choice;
using kvattn_test::ScopedOverride;

// The active overrides with soft-cap's tanh forced to one form.
kvattn::detail::Overrides tanh_forced(kvattn::detail::TanhForm t) {
  kvattn::detail::Overrides o = kvattn::detail::active_overrides();
  o.prefill_tanh = t;
  return o;
}

TEST(PrefillConfig, PacksTheGroupAndSizesTheMTileByTheLongestRequest) {
  ScopedOverride mma_sync("KVATTN_PREFILL_TIER", "mma_sync");  // the mma.sync tier's table
  auto c = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, true, 16, 0, 4096);
  EXPECT_EQ(c.heads_per_cta, 4);
  EXPECT_EQ(c.rows(), 128);  // the default long shape (m2k64): 4 warps x 2 m-tiles, KV 64, 2 stages, 2 CTAs/SM
  EXPECT_EQ(c.warps, 4);
  EXPECT_EQ(c.m_tiles, 2);
  EXPECT_EQ(c.query_tokens(), 32);
  EXPECT_EQ(c.kv_tile, 64);
  EXPECT_EQ(c.stages, 2);
  EXPECT_EQ(c.min_blocks, 2);
  EXPECT_EQ(c.page_size, 16);
  // Rows that fill less than half of the long M tile: 16-row warps, as few as hold them.
  auto short_run = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 1, false, 0, 0, 40);
  EXPECT_EQ(short_run.m_tiles, 1);
  EXPECT_EQ(short_run.warps, 4);
  // One query token per request (decode-like appends): one warp holds the group's 8 rows, and the
  // decode shape's four KV warps split each 64-token tile (16 tokens each), 3 CTAs per SM, with
  // all five tuning bits.
  auto d = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 8, true, 16, 0, 1);
  EXPECT_EQ(d.warps, 1);
  EXPECT_EQ(d.kv_warps, 4);
  EXPECT_EQ(d.kv_tile, 64);
  EXPECT_EQ(d.stages, 2);
  EXPECT_EQ(d.min_blocks, 3);
  EXPECT_EQ(tuning_name(d.tuning), "lazy-swizzle-unroll-packp-lean");
  EXPECT_LE(3 * (prefill_smem_bytes(d) + 1024), h200().smem_per_sm);
  EXPECT_EQ(d.query_tokens(), 2);
  // A uniform decode batch: six KV warps (96-token tiles) at 2 CTAs per SM.
  auto uniform = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 8, true, 16, 0, 1, h200(), true);
  EXPECT_EQ(uniform.kv_warps, 6);
  EXPECT_EQ(uniform.kv_tile, 96);
  EXPECT_EQ(uniform.min_blocks, 2);
  EXPECT_EQ(tuning_name(uniform.tuning), "lazy-swizzle-unroll-packp-lean");
  EXPECT_NE(uniform.name(), d.name());
  // On Ada (99 KB per block, 100 KB per SM) the uniform variant's 107 KB shrink to what fits: 3 warps x 16 tokens.
  auto ada = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, true, 16, 0, 1, arch("sm_89"), true);
  EXPECT_LE(prefill_smem_bytes(ada), arch("sm_89").smem_per_block_optin);
  EXPECT_EQ(ada.kv_warps, 3);
  EXPECT_EQ(ada.kv_tile, 48);
  // Head dim 256 on Ada: 6 -> 3 -> 1 warps, tiles of 16 tokens per warp throughout.
  for (bool u : {false, true}) {
    auto wide_ada = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 256, 256, 4, true, 16, 0, 1, arch("sm_89"), u);
    EXPECT_LE(prefill_smem_bytes(wide_ada), arch("sm_89").smem_per_block_optin) << wide_ada.name();
    EXPECT_EQ(wide_ada.kv_tile % (16 * wide_ada.kv_warps), 0) << wide_ada.name();
    EXPECT_GE(wide_ada.kv_tile, 16) << wide_ada.name();
  }
  // Only one-warp shapes: a longer run ignores the flag.
  EXPECT_EQ(prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, true, 16, 0, 4096, h200(), true).name(),
            prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, true, 16, 0, 4096).name());
  // Head dim 256: 3 CTAs' stages do not fit, so the launch bound asks for what does (1).
  auto wide = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 256, 256, 4, true, 16, 0, 1);
  EXPECT_EQ(wide.kv_warps, 4);
  EXPECT_EQ(wide.min_blocks, 1);
  // fp8 KV: no swizzle (its tiles are converted), the other bits stay.
  EXPECT_EQ(tuning_name(prefill_choice(DType::bf16, DType::e4m3, DType::bf16, 128, 128, 4, true, 16, 0, 1).tuning),
            "lazy-unroll-packp-lean");
  EXPECT_EQ(prefill_choice(DType::f16, DType::f16, DType::f16, 64, 64, 1, false, 0, 0, 20).warps, 2);
  EXPECT_EQ(prefill_choice(DType::f16, DType::f16, DType::f16, 64, 64, 7, false, 0, 0, 1000).query_tokens(), 18);
}

// The Hopper tier (PrefillTier::wgmma): sm_90a devices, long query runs of 2-byte K/V in the q
// dtype without RoPE, head dims multiples of 64; a producer warpgroup and two consumer
// warpgroups, 128 query rows, KV tiles of 128 tokens (64 above head dim 128), 2 stages.
TEST(PrefillConfig, HopperTierForLongRunsOnSm90a) {
  using kvattn::detail::PrefillTier;
  for (DType t : {DType::bf16, DType::f16})
    for (auto [dqk, dvo] : {std::pair{64, 64}, {128, 128}, {192, 128}, {256, 256}, {64, 128}})
      for (bool paged : {false, true})
        for (int group : {1, 4, 8}) {
          const auto c = prefill_choice(t, t, t, dqk, dvo, group, paged, 16, kvattn::kernels::kCausal, 4096);
          SCOPED_TRACE(c.name());
          EXPECT_EQ(c.tier, PrefillTier::wgmma);
          EXPECT_EQ(c.name().rfind("prefill_wgmma_", 0), 0u);
          EXPECT_EQ(c.threads(), 384);  // a producer warpgroup and two consumer warpgroups
          EXPECT_EQ(c.rows(), 128);
          EXPECT_EQ(c.query_tokens(), 128 / group);
          EXPECT_EQ(c.kv_tile, std::max(dqk, dvo) <= 128 ? 128 : 64);
          EXPECT_EQ(c.stages, 2);
          EXPECT_EQ(c.min_blocks, 1);
          EXPECT_LE(prefill_smem_bytes(c), h200().smem_per_block_optin);
          EXPECT_EQ(tuning_name(c.tuning), "lazy");
        }
  // Where it does not apply: fp8 K/V, fused RoPE, head dims off the 64-column blocks, short runs
  // (fewer than 64 packed rows), decode; and on every device without sm_90a.
  using namespace kvattn::kernels;
  auto tier_of = [](auto&&... args) { return prefill_choice(args...).tier; };
  EXPECT_EQ(tier_of(DType::bf16, DType::e4m3, DType::bf16, 128, 128, 4, true, 16, kCausal, 4096), PrefillTier::mma_sync);
  EXPECT_EQ(tier_of(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, true, 16, kCausal | kRope, 4096),
            PrefillTier::mma_sync);
  EXPECT_EQ(tier_of(DType::bf16, DType::bf16, DType::bf16, 96, 96, 4, false, 16, kCausal, 4096), PrefillTier::mma_sync);
  EXPECT_EQ(tier_of(DType::bf16, DType::bf16, DType::bf16, 128, 128, 1, false, 16, kCausal, 63), PrefillTier::mma_sync);
  EXPECT_EQ(tier_of(DType::bf16, DType::bf16, DType::bf16, 128, 128, 1, false, 16, kCausal, 64), PrefillTier::wgmma);
  EXPECT_EQ(tier_of(DType::bf16, DType::bf16, DType::bf16, 128, 128, 8, true, 16, kCausal, 1), PrefillTier::mma_sync);
  EXPECT_EQ(tier_of(DType::bf16, DType::bf16, DType::bf16, 128, 128, 8, true, 16, kCausal, 8), PrefillTier::wgmma);
  for (const char* a : {"sm_80", "sm_86", "sm_89"})
    EXPECT_EQ(tier_of(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, false, 16, kCausal, 4096, arch(a)),
              PrefillTier::mma_sync)
        << a;
  // KVATTN_PREFILL_TIER=mma_sync keeps the mma.sync tier on sm_90a (=wgmma is the default there).
  {
    ScopedOverride mma("KVATTN_PREFILL_TIER", "mma_sync");
    EXPECT_EQ(tier_of(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, false, 16, kCausal, 4096),
              PrefillTier::mma_sync);
  }
  {
    ScopedOverride wgmma("KVATTN_PREFILL_TIER", "wgmma");
    EXPECT_EQ(tier_of(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, false, 16, kCausal, 4096, arch("sm_80")),
              PrefillTier::mma_sync);  // where it cannot run
  }
  EXPECT_KVATTN_ERROR(ScopedOverride("KVATTN_PREFILL_TIER", "hopper"), "KVATTN_PREFILL_TIER");
  // The variants' tuning on the tier: the fixed shift for bf16 soft-cap (f16: the lazy rescale),
  // the whole-tile transform for ALiBi, tanh.approx for soft-cap unless KVATTN_PREFILL_TANH=exact.
  const auto capped = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 1, false, 16, kCausal | kSoftCap,
                                     4096, h200(), false, 30.0f);
  EXPECT_EQ(capped.tier, PrefillTier::wgmma);
  EXPECT_EQ(capped.tuning.softmax, kvattn::kernels::prefill::SoftmaxForm::fixed_shift);
  EXPECT_TRUE(capped.fast_tanh);
  EXPECT_EQ(prefill_choice(DType::f16, DType::f16, DType::f16, 128, 128, 1, false, 16, kCausal | kSoftCap, 4096, h200(),
                           false, 30.0f)
                .tuning.softmax,
            kvattn::kernels::prefill::SoftmaxForm::lazy_rescale);
  EXPECT_FALSE(prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 1, false, 16, kCausal | kSoftCap, 4096,
                              h200(), false, 30.0f, tanh_forced(kvattn::detail::TanhForm::exact))
                   .fast_tanh);
  EXPECT_TRUE(prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, false, 16, kCausal | kAlibi, 4096)
                  .tuning.whole_tile_transform);
}

// Presets list a Hopper-tier kernel for sm_90a only and its mma.sync twin (what the other archs
// choose) for the archs below, so CI compiles each tier where it runs.
TEST(PrefillConfig, PresetsCompileEachTierWhereItRuns) {
  auto names = [](const char* a) {
    std::set<std::string> n;
    for (const auto& s : kvattn::cuda::preset_specs("prefill", a)) n.insert(s.name);
    return n;
  };
  const auto hopper = names("sm_90a"), ampere = names("sm_80");
  int wgmma = 0;
  for (const std::string& n : hopper) wgmma += n.rfind("prefill_wgmma_", 0) == 0;
  EXPECT_GE(wgmma, 10);
  for (const std::string& n : ampere) EXPECT_NE(n.rfind("prefill_wgmma_", 0), 0u) << n;
  // What sm_80 has and sm_90a lacks are the twins of Hopper-tier kernels, mma.sync kernels all,
  // among them the long hd 128 causal ragged one (4 warps x 2 m-tiles; chosen for the H200's limits
  // as every preset kernel is).
  int below_only = 0;
  for (const std::string& n : ampere)
    if (!hopper.count(n)) {
      ++below_only;
      EXPECT_EQ(n.rfind("prefill_", 0), 0u) << n;
    }
  EXPECT_GE(below_only, 1);
  EXPECT_LE(below_only, wgmma);
  ScopedOverride mma_sync("KVATTN_PREFILL_TIER", "mma_sync");  // presets choose for the H200's limits
  const std::string twin =
      prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, false, 16, kvattn::kernels::kCausal, 4096)
          .name();
  EXPECT_TRUE(ampere.count(twin)) << twin;
  EXPECT_FALSE(hopper.count(twin)) << twin;
}

TEST(PrefillConfig, WideHeadsTakeEightWarpsAndOneCTAPerSM) {
  // The default long shape for head dims above 128: 8 warps x 1 m-tile, KV 64, 2 stages, 1 CTA/SM.
  auto c = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 256, 256, 1, false, 0, 0, 4096);
  EXPECT_EQ(c.warps, 8);
  EXPECT_EQ(c.kv_tile, 64);
  EXPECT_EQ(c.min_blocks, 1);
  auto m = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 192, 128, 1, false, 0, 0, 4096);
  EXPECT_EQ(m.warps, 8);
  EXPECT_EQ(m.kv_tile, 64);
  // A group wider than the usual M tile still gets one token per tile.
  auto g = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 256, 256, 128, false, 0, 0, 10);
  EXPECT_EQ(g.heads_per_cta, 128);
  EXPECT_EQ(g.warps, 8);
  EXPECT_EQ(g.query_tokens(), 1);
  EXPECT_EQ(prefill_choice(DType::bf16, DType::bf16, DType::bf16, 64, 64, 192, false, 0, 0, 10).heads_per_cta, 96);
}

// The kernel fits each device's shared memory, from the real limits of each architecture: A100
// (163 KB per block, 164 KB per SM) and Ada / sm_86 (99 KB per block, 100 KB per SM) get smaller
// KV tiles or fewer stages where the H200's choice would not fit (hd 208 m2k64 paged needs 169 KB;
// 128 x 112 needs more than 99 KB).
TEST(PrefillConfig, FitsTheDevicesSharedMemory) {
  ScopedOverride mma_sync("KVATTN_PREFILL_TIER", "mma_sync");  // the mma.sync tier's table
  int shrunk = 0;
  for (int dqk = 16; dqk <= 256; dqk += 16)
    for (int dvo : {dqk, 128})
      for (bool paged : {false, true})
        for (int64_t qo : {int64_t(1), int64_t(40), int64_t(4096)}) {
          SCOPED_TRACE(::testing::Message() << "hd " << dqk << "x" << dvo << (paged ? " paged" : " ragged") << " qo " << qo);
          const auto base = prefill_choice(DType::bf16, DType::bf16, DType::bf16, dqk, dvo, 4, paged, 16, 0, qo);
          for (const char* a : {"sm_80", "sm_86", "sm_89"}) {
            const kvattn::cuda::DeviceLimits limits = arch(a);
            const auto c = prefill_choice(DType::bf16, DType::bf16, DType::bf16, dqk, dvo, 4, paged, 16, 0, qo, limits);
            // Shapes whose smallest tile (KV 32, 2 stages) is still too big stay as they are, and
            // plan() names the shortfall; every other one fits its CTAs' share of the SM.
            auto smallest = base;
            smallest.kv_tile = 32;
            smallest.stages = 2;
            if (prefill_smem_bytes(smallest) <= limits.smem_per_block_optin)
              EXPECT_LE(prefill_smem_bytes(c), limits.smem_per_block_optin) << a;
            // A long shape fits its CTAs' share of the SM, asking for fewer CTAs where the tile
            // cannot shrink enough (Ada).
            if (c.kv_warps == 1 && c.rows() >= 128 && prefill_smem_bytes(smallest) <= limits.smem_per_block_optin)
              EXPECT_LE(prefill_smem_bytes(c), limits.smem_per_cta(c.min_blocks)) << a << " " << c.name();
            if (c.kv_warps == 1 && c.name() != base.name()) {
              ++shrunk;
              EXPECT_TRUE(c.kv_tile < base.kv_tile || c.stages < base.stages) << a;  // only the tile shrank
            }
          }
        }
  EXPECT_GT(shrunk, 0);  // some shapes needed it
}

// The architectures' limits as the table has them (the CUDA C++ Programming Guide's values).
TEST(PrefillConfig, DeviceLimitsOfEachArchitecture) {
  ScopedOverride mma_sync("KVATTN_PREFILL_TIER", "mma_sync");  // the mma.sync tier's table
  EXPECT_EQ(arch("sm_90a").smem_per_block_optin, 227 * 1024);
  EXPECT_EQ(arch("sm_90a").smem_per_sm, 228 * 1024);
  EXPECT_EQ(arch("sm_80").smem_per_block_optin, 163 * 1024);
  EXPECT_EQ(arch("sm_86").smem_per_sm, 100 * 1024);
  EXPECT_EQ(arch("sm_89").smem_per_block_optin, 99 * 1024);
  EXPECT_TRUE(arch("sm_90a").has_bulk_copies());
  EXPECT_FALSE(arch("sm_80").has_bulk_copies());
  EXPECT_EQ(arch("sm_90a").smem_per_cta(2), 113 * 1024);
  EXPECT_EQ(arch("sm_80").smem_per_cta(1), 163 * 1024);
  EXPECT_KVATTN_ERROR(arch("sm_75"), "no device limits known for arch 'sm_75'");
  // A common long prefill on each architecture fits its CTAs' share of the SM.
  const auto h = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, true, 16, 1, 4096);
  const auto a100 = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, true, 16, 1, 4096, arch("sm_80"));
  const auto ada = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, true, 16, 1, 4096, arch("sm_89"));
  EXPECT_EQ(h.kv_tile, 64);
  EXPECT_LE(prefill_smem_bytes(a100), arch("sm_80").smem_per_cta(a100.min_blocks)) << a100.name();
  EXPECT_LE(prefill_smem_bytes(ada), arch("sm_89").smem_per_cta(ada.min_blocks)) << ada.name();
  EXPECT_LE(ada.kv_tile, h.kv_tile);
}

TEST(PrefillConfig, PageSizeBakedOnlyForPowersOfTwo) {
  EXPECT_EQ(prefill_choice(DType::bf16, DType::bf16, DType::bf16, 64, 64, 1, true, 5, 0, 9).page_size, 0);
  EXPECT_EQ(prefill_choice(DType::bf16, DType::bf16, DType::bf16, 64, 64, 1, true, 1, 0, 9).page_size, 1);
  EXPECT_EQ(prefill_choice(DType::bf16, DType::bf16, DType::bf16, 64, 64, 1, false, 16, 0, 9).page_size, 0);
}

TEST(PrefillConfig, SharedMemoryFitsCommonShapes) {
  for (int hd : {64, 128, 256})
    for (DType kv : {DType::bf16, DType::e4m3}) {
      auto c = prefill_choice(DType::bf16, kv, DType::bf16, hd, hd, 4, true, 16, kvattn::kernels::kCausal | kvattn::kernels::kRope, 4096);
      // Each of the min_blocks CTAs an SM holds gets its share of the SM (less the driver's 1 KB per CTA).
      EXPECT_LE(prefill_smem_bytes(c), h200().smem_per_cta(c.min_blocks)) << c.name();
    }
}

TEST(PrefillConfig, UnsupportedDtypesAndDimsAreErrors) {
  EXPECT_KVATTN_ERROR(prefill_choice(DType::f32, DType::f32, DType::f32, 64, 64, 1, false, 0, 0, 1),
                      "q_dtype f32 is not supported by the GPU prefill kernels");
  EXPECT_KVATTN_ERROR(prefill_choice(DType::bf16, DType::f16, DType::bf16, 64, 64, 1, false, 0, 0, 1),
                      "kv_dtype f16 is not supported by the GPU prefill kernels with q_dtype bf16");
  EXPECT_KVATTN_ERROR(prefill_choice(DType::bf16, DType::bf16, DType::bf16, 72, 64, 1, false, 0, 0, 1),
                      "head dim 72 is not supported by the GPU prefill kernels");
  EXPECT_KVATTN_ERROR(prefill_choice(DType::bf16, DType::bf16, DType::bf16, 64, 512, 1, false, 0, 0, 1),
                      "head dim 512 is not supported by the GPU prefill kernels");
}

TEST(PrefillConfig, NamesAreDistinct) {
  ScopedOverride mma_sync("KVATTN_PREFILL_TIER", "mma_sync");  // the mma.sync tier's table
  auto a = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, true, 16, 1, 4096);
  auto b = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, false, 16, 1, 4096);
  auto c = prefill_choice(DType::bf16, DType::e4m3, DType::f32, 192, 128, 4, true, 16, 1, 4096);
  EXPECT_NE(a.name(), b.name());
  EXPECT_EQ(c.name(), "prefill_bf16_kve4m3_of32_hd192x128_g4_w8_k64_s2_paged16_f1_lazy-unroll");
  auto d = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 1, false, 0, 0, 4096);
  EXPECT_EQ(d.name(), "prefill_bf16_hd128_g1_w4x2_k64_s2_b2_ragged_f0_lazy-swizzle-unroll-packp-lean");
  // The entry symbol is the name as an identifier.
  EXPECT_EQ(kvattn::cuda::prefill_spec(d, "sm_90a").entry,
            "kvattn_prefill_bf16_hd128_g1_w4x2_k64_s2_b2_ragged_f0_lazy_swizzle_unroll_packp_lean");
}

// The lazy rescale's threshold (Overrides::prefill_lazy_log2, KVATTN_PREFILL_LAZY_LOG2) becomes a
// compile option, which is part of the JIT key, and the kernel's name says so; unset, the kernels
// take none (the threshold's default, 8, is in score_math.cuh).
TEST(PrefillConfig, LazyThresholdIsACompileOption) {
  auto choose = [] { return prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 1, false, 0, 0, 4096); };
  {
    ScopedOverride unset("KVATTN_PREFILL_LAZY_LOG2", nullptr);
    EXPECT_TRUE(kvattn::cuda::prefill_spec(choose(), "sm_90a").options.empty());
  }
  {
    ScopedOverride two("KVATTN_PREFILL_LAZY_LOG2", "2");
    const auto c = choose();
    const auto spec = kvattn::cuda::prefill_spec(c, "sm_90a");
    ASSERT_EQ(spec.options.size(), 1u);
    EXPECT_EQ(spec.options[0], "-DKVATTN_PREFILL_LAZY_LOG2=2.0f");
    EXPECT_NE(c.name().find("_lazylog2"), std::string::npos) << c.name();
  }
  for (const char* bad : {"0", "9", "2.5", "x"})
    EXPECT_KVATTN_ERROR(kvattn_test::override_from("KVATTN_PREFILL_LAZY_LOG2", bad),
                        std::string("KVATTN_PREFILL_LAZY_LOG2 is a number from 1 to 8, not '") + bad + "'");
}

// One M-row warp (decode: one query and the group) takes the decode shape: KVATTN_PREFILL_DECODE_SHAPE
// sets its KV warps, tokens per warp and stages; its name and template arguments say so, and its
// shared memory holds the KV warps' merge. Longer runs never take KV warps.
TEST(PrefillConfig, DecodeShapeKnob) {
  auto decode = [] { return prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, true, 16, 0, 1); };
  {
    ScopedOverride env("KVATTN_PREFILL_DECODE_SHAPE", "4x16s3");
    const auto c = decode();
    EXPECT_EQ(c.warps, 1);
    EXPECT_EQ(c.kv_warps, 4);
    EXPECT_EQ(c.kv_tile, 64);
    EXPECT_EQ(c.stages, 3);
    EXPECT_EQ(c.threads(), 128);
    EXPECT_NE(c.name().find("_w1_kw4_k64_s3"), std::string::npos) << c.name();
    const auto spec = kvattn::cuda::prefill_spec(c, "sm_90a");
    EXPECT_NE(spec.source.find("static constexpr int kv_warps = 4;"), std::string::npos) << spec.source;
    EXPECT_NE(spec.source.find("__launch_bounds__(128"), std::string::npos);
    // The merge of 3 warps' states (32 lanes x (64 O + 4) floats each) fits behind the stages' start.
    const auto layout = kvattn::kernels::prefill::smem_layout(128, 128, 2, c.rows(), c.kv_tile, c.stages, true, false,
                                                              true, c.kv_warps);
    EXPECT_EQ(kvattn::kernels::prefill::kv_warp_merge_bytes(128, 16, 4), 3 * 32 * 68 * 4);
    EXPECT_LE(layout.stages + kvattn::kernels::prefill::kv_warp_merge_bytes(128, 16, 4), layout.total);
    EXPECT_EQ(layout.total, prefill_smem_bytes(c));
    // Not for runs that need several M-row warps.
    const auto append = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, true, 16, 0, 32);
    EXPECT_EQ(append.kv_warps, 1);
    EXPECT_EQ(append.name().find("_kw"), std::string::npos);
  }
  {
    // A 64-token-per-warp shape whose stages do not fit a small device shrinks its tile and stages.
    ScopedOverride env("KVATTN_PREFILL_DECODE_SHAPE", "2x64s4");
    const auto c = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 256, 256, 4, true, 16, 0, 1, arch("sm_89"));
    EXPECT_EQ(c.kv_warps, 2);
    EXPECT_LE(prefill_smem_bytes(c), arch("sm_89").smem_per_block_optin);
    EXPECT_EQ(c.kv_tile % (16 * c.kv_warps), 0);
  }
  {
    ScopedOverride env("KVATTN_PREFILL_DECODE_SHAPE", "2x32s3");  // replaces the uniform variant too
    EXPECT_EQ(prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, true, 16, 0, 1, h200(), true).name(),
              decode().name());
  }
  {
    ScopedOverride env("KVATTN_PREFILL_DECODE_SHAPE", "6x16s2b2");  // 6 warps: 96-token tiles
    EXPECT_EQ(decode().kv_warps, 6);
    EXPECT_EQ(decode().kv_tile, 96);
    EXPECT_EQ(decode().threads(), 192);
  }
  {
    ScopedOverride env("KVATTN_PREFILL_DECODE_SHAPE", "4x16s2b3");
    EXPECT_EQ(decode().min_blocks, 3);
    EXPECT_NE(decode().name().find("_s2_b3"), std::string::npos) << decode().name();
  }
  for (const char* bad : {"3x16s2", "4x16", "4x8s2", "4x16s5", "4x64s2", "4x16s2x", "4x16s2b", "4x16s2b9", "x"}) {
    EXPECT_KVATTN_ERROR(kvattn_test::override_from("KVATTN_PREFILL_DECODE_SHAPE", bad), std::string("KVATTN_PREFILL_DECODE_SHAPE is <kv_warps 1|2|4|6|8>x<tokens 16|32|64>s<stages "
                                              "2-4>[b<CTAs per SM 1-8>] with at most 128 tokens per tile (e.g. 4x16s2), "
                                              "not '") + bad + "'");
  }
}

// Device-resident page ids take the checking twin of a paged kernel (`_dids`): its own name (the
// JIT cache key), its own template argument, and the default preset lists both of every paged
// kernel, so CI compiles them. The flag means nothing for ragged KV.
TEST(PrefillConfig, DeviceIdKernelsAreTwinsOfThePagedOnes) {
  ScopedOverride mma_sync("KVATTN_PREFILL_TIER", "mma_sync");  // the mma.sync tier's table
  auto host = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, true, 16, 1, 4096);
  EXPECT_FALSE(host.checked_ids);  // the choice itself never asks for checks
  auto device = host;
  device.checked_ids = true;
  EXPECT_EQ(host.name(), "prefill_bf16_hd128_g4_w4x2_k64_s2_b2_paged16_f1_lazy-swizzle-unroll-packp-lean");
  EXPECT_EQ(device.name(), "prefill_bf16_hd128_g4_w4x2_k64_s2_b2_paged16_dids_f1_lazy-swizzle-unroll-packp-lean");
  const auto host_spec = kvattn::cuda::prefill_spec(host, "sm_90a"), device_spec = kvattn::cuda::prefill_spec(device, "sm_90a");
  EXPECT_NE(host_spec.source.find("static constexpr bool checked_ids = false;"), std::string::npos) << host_spec.source;
  EXPECT_NE(device_spec.source.find("static constexpr bool checked_ids = true;"), std::string::npos) << device_spec.source;
  auto ragged = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 4, false, 0, 1, 4096);
  auto ragged_flagged = ragged;
  ragged_flagged.checked_ids = true;
  EXPECT_EQ(ragged.name(), ragged_flagged.name());
  EXPECT_NE(kvattn::cuda::prefill_spec(ragged_flagged, "sm_90a").source.find("static constexpr bool checked_ids = false;"),
            std::string::npos);

  std::set<std::string> names;
  for (const auto& k : kvattn::cuda::find_preset("default").kernels) names.insert(k.name);
  int paged = 0;
  for (const std::string& n : names) {
    if (n.find("prefill_") != 0 || n.find("_paged") == std::string::npos || n.find("_dids") != std::string::npos)
      continue;
    ++paged;
    std::string twin = n;
    twin.insert(twin.find("_f", twin.find("_paged")), "_dids");
    EXPECT_TRUE(names.count(twin)) << n << " has no device-id twin " << twin;
  }
  EXPECT_GE(paged, 8);
}

// Overrides::prefill_long_shape (KVATTN_PREFILL_VARIANT) picks the long shape; each test starts
// from no prefill overrides and sets its own (restored after).
// The mma.sync tier's long shapes and tunings (on sm_90a the Hopper tier takes these problems by
// default, so the fixture keeps the mma.sync tier).
class PrefillVariantEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    kvattn::detail::Overrides o;
    o.prefill_tier = kvattn::detail::PrefillTier::mma_sync;
    put(o);
  }
  void TearDown() override { scope_.reset(); }
  // Sets one variable as the environment would (nullptr: unset), keeping the others.
  void put(const char* name, const char* value) {
    kvattn::detail::Overrides o = scope_ ? scope_->get() : kvattn::detail::Overrides{};
    kvattn::detail::set_override(o, name, value);
    put(o);
  }
  void put(kvattn::detail::Overrides o) {
    scope_.reset();
    scope_.emplace(std::move(o));
  }
  void set(const char* v) { put("KVATTN_PREFILL_VARIANT", v); }
  std::optional<kvattn::detail::OverridesScope> scope_;
};

TEST_F(PrefillVariantEnv, EveryVariantFitsItsCTAsPerSM) {
  for (const char* v : {"m2k32", "m2k64", "m1k64", "m2w8", "m2k48", "m2k48s3"}) {
    set(v);
    for (int hd : {64, 128, 256})
      for (DType kv : {DType::bf16, DType::e4m3}) {
        auto c = prefill_choice(DType::bf16, kv, DType::bf16, hd, hd, 1, true, 16, kvattn::kernels::kCausal | kvattn::kernels::kRope, 16384);
        EXPECT_GE(c.rows(), 64) << v << " " << c.name();
        EXPECT_EQ(c.kv_tile % 16, 0) << v << " " << c.name();  // m2k48s3 paged once halved 48 to 24
        EXPECT_LE(prefill_smem_bytes(c), h200().smem_per_cta(c.min_blocks)) << v << " " << c.name();
        EXPECT_LE(c.m_tiles * hd, 2 * 128) << "a warp's O accumulator fits in registers: " << c.name();
      }
  }
  set("m1k64");
  EXPECT_EQ(prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 1, false, 0, 0, 16384).name(),
            "prefill_bf16_hd128_g1_w8_k64_s2_ragged_f0_lazy-swizzle-unroll-packp-lean");
  EXPECT_KVATTN_ERROR(set("nope"), "KVATTN_PREFILL_VARIANT is one of m2k64, m2k48, m2k48s3, m2k32, m1k64, m2w8, not 'nope'");
}

// Soft-cap takes m2k64 with the lazy rescale and the unrolled Q K^T (it took m2k48 before those:
// m2k64's kernel spilled); KVATTN_PREFILL_VARIANT still picks another shape.
TEST_F(PrefillVariantEnv, SoftCapTakesTheTunedK64Kernel) {
  using kvattn::kernels::kCausal;
  using kvattn::kernels::kSoftCap;
  put("KVATTN_PREFILL_TANH", "exact");
  auto cap = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 1, false, 0, kCausal | kSoftCap, 16384);
  EXPECT_EQ(cap.name(), "prefill_bf16_hd128_g1_w4x2_k64_s2_b2_ragged_f5_lazy-unroll");
  EXPECT_LE(prefill_smem_bytes(cap), h200().smem_per_cta(cap.min_blocks));
  set("m2k48");
  EXPECT_EQ(prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 1, false, 0, kSoftCap, 16384).kv_tile, 48);
}

// The tuning (prefill_tuning_for): per head-dim class, GQA packing and soft-cap, the swizzle only
// where K/V land as they are (2-byte KV, no RoPE, head dims a multiple of 64), short shapes none.
// Named as kernel names spell them (detail::tuning_name).
TEST_F(PrefillVariantEnv, TuningFollowsHeadDimVariantAndKVType) {
  using kvattn::kernels::kCausal;
  using kvattn::kernels::kCustomMask;
  using kvattn::kernels::kRope;
  using kvattn::kernels::kSoftCap;
  auto tuning = [](int dqk, int dvo, DType kv, uint32_t features, int64_t qo = 16384, int group = 1, bool paged = true) {
    return tuning_name(prefill_choice(DType::bf16, kv, DType::bf16, dqk, dvo, group, paged, 16, features, qo).tuning);
  };
  const std::string lazy_unrolled = "lazy-unroll", lazy_swizzled_unrolled = "lazy-swizzle-unroll";
  const std::string all5 = "lazy-swizzle-unroll-packp-lean";
  EXPECT_EQ(tuning(64, 64, DType::bf16, kCausal), lazy_unrolled);
  EXPECT_EQ(tuning(64, 64, DType::bf16, kCausal, 16384, 1, false), "lazy-unroll-lean");
  EXPECT_EQ(tuning(128, 128, DType::bf16, kCausal), all5);
  EXPECT_EQ(tuning(128, 128, DType::bf16, kCausal, 16384, 1, false), all5);
  EXPECT_EQ(tuning(128, 128, DType::bf16, kCausal, 16384, 4, false), lazy_unrolled);  // GQA-packed CTAs
  EXPECT_EQ(tuning(128, 128, DType::bf16, kCausal, 16384, 4), all5);  // paged GQA
  // Paged GQA kernels that spill with the other choices keep the lazy rescale only.
  EXPECT_EQ(tuning(128, 128, DType::bf16, kCausal | kCustomMask, 16384, 4), "lazy");
  EXPECT_EQ(tuning(128, 128, DType::e4m3, kCausal, 16384, 4), "lazy");
  EXPECT_EQ(tuning(128, 128, DType::bf16, kCausal | kRope, 16384, 4), "lazy");
  // Soft-cap without a known cap (no fixed shift): tanh.approx (the long shape's default) adds P
  // packed early and the lean copies; the exact form keeps the lazy rescale and the unrolled Q K^T.
  EXPECT_EQ(tuning(128, 128, DType::bf16, kCausal | kSoftCap), "lazy-unroll-packp-lean");
  put("KVATTN_PREFILL_TANH", "exact");
  EXPECT_EQ(tuning(128, 128, DType::bf16, kCausal | kSoftCap), lazy_unrolled);
  put("KVATTN_PREFILL_TANH", nullptr);
  // ALiBi transforms a mask-free tile in one block (measured faster); soft-cap and sigmoid do not.
  EXPECT_EQ(tuning(128, 128, DType::bf16, kCausal | kvattn::kernels::kAlibi, 16384, 4, false), "lazy-unroll-wholetile");
  EXPECT_EQ(tuning(128, 128, DType::bf16, kCausal | kvattn::kernels::kAlibi), all5 + "-wholetile");
  EXPECT_EQ(tuning(64, 64, DType::bf16, kvattn::kernels::kSigmoid), lazy_unrolled);
  EXPECT_EQ(tuning(256, 256, DType::bf16, kCausal), lazy_swizzled_unrolled);
  // Ragged 2-byte K/V above hd 128 goes by halves (plain softmax with a maximum per half).
  EXPECT_EQ(tuning(256, 256, DType::bf16, kCausal, 16384, 1, false), "lazy-swizzle-unroll-lean-halves");
  EXPECT_EQ(tuning(256, 256, DType::bf16, kCausal | kvattn::kernels::kAlibi, 16384, 1, false),
            "lazy-swizzle-unroll-lean-wholetile");
  EXPECT_EQ(tuning(192, 128, DType::bf16, kCausal), lazy_swizzled_unrolled);
  EXPECT_EQ(tuning(256, 256, DType::e4m3, kCausal), lazy_unrolled);  // fp8 is converted in smem
  EXPECT_EQ(tuning(256, 256, DType::bf16, kRope), lazy_unrolled);    // RoPE rotates K in place
  EXPECT_EQ(tuning(160, 160, DType::bf16, 0), lazy_unrolled);        // rows of 2.5 lines
  EXPECT_EQ(tuning(256, 256, DType::bf16, kCausal, 40), "none");     // short shapes of several warps: untuned
  EXPECT_EQ(tuning(256, 256, DType::bf16, kCausal, 1), all5);        // the decode shape: all five
  EXPECT_EQ(tuning(256, 256, DType::bf16, kRope, 1), "lazy-unroll-packp-lean");
  // The swizzled layout drops the K/V row padding.
  auto hd256 = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 256, 256, 1, false, 0, 0, 16384);
  auto plain = hd256;
  plain.tuning.swizzle_kv = false;
  EXPECT_EQ(prefill_smem_bytes(plain) - prefill_smem_bytes(hd256), 2 * hd256.kv_tile * 2 * 16);
  EXPECT_NE(plain.name(), hd256.name());
  // An overriding tuning replaces the long and decode shapes' own; the shift is taken away where it
  // does not apply, the parts stay.
  put("KVATTN_PREFILL_TUNING", "none");
  EXPECT_EQ(tuning(256, 256, DType::bf16, kCausal), "none");
  put("KVATTN_PREFILL_TUNING", "lazy,swizzle,unroll,packp,lean,wholetile");
  EXPECT_EQ(tuning(128, 128, DType::bf16, 0), "lazy-swizzle-unroll-packp-lean-wholetile");
  put("KVATTN_PREFILL_TUNING", "shift,swizzle,unroll,packp,lean,wholetile,quarters");
  EXPECT_EQ(tuning(128, 128, DType::bf16, 0), "lazy-swizzle-unroll-packp-lean-wholetile-quarters");
  for (const char* bad : {"2047", "x", "lazy,shift", "halves,quarters", "lazy,,unroll"})
    EXPECT_KVATTN_ERROR(put("KVATTN_PREFILL_TUNING", bad), "KVATTN_PREFILL_TUNING");
  EXPECT_KVATTN_ERROR(put("KVATTN_PREFILL_TUNING", "x"),
                      "KVATTN_PREFILL_TUNING is 'none' or a list of lazy|shift, swizzle, unroll, packp, lean, wholetile, "
                      "halves|quarters joined by ','");
  put("KVATTN_PREFILL_TUNING", nullptr);
}

// Soft-cap's fixed shift (SoftmaxForm::fixed_shift): bf16 soft-cap without ALiBi or sigmoid and a
// cap up to 54.7 (c log2 e <= 79), in every shape; nowhere else, whatever an overriding tuning
// says; an override can decline it for A/B runs. The shift keeps weights <= 2^64 and the ones that
// matter normal (smem_layout.cuh).
TEST_F(PrefillVariantEnv, SoftCapShiftWhereItsRangeFits) {
  using namespace kvattn::kernels::prefill;
  using kvattn::kernels::kAlibi;
  using kvattn::kernels::kCausal;
  using kvattn::kernels::kSigmoid;
  using kvattn::kernels::kSoftCap;
  auto shifted = [](DType q, uint32_t features, float cap, int64_t qo = 16384) {
    const DType kv = q;
    return prefill_choice(q, kv, q, 128, 128, 4, true, 16, features, qo, h200(), false, cap).tuning.softmax ==
           SoftmaxForm::fixed_shift;
  };
  for (int64_t qo : {int64_t(16384), int64_t(8), int64_t(1)}) {  // long, short (32 rows) and decode shapes
    EXPECT_TRUE(shifted(DType::bf16, kCausal | kSoftCap, 30.0f, qo)) << qo;
    EXPECT_TRUE(shifted(DType::bf16, kSoftCap, 54.7f, qo)) << qo;
    EXPECT_FALSE(shifted(DType::bf16, kSoftCap, 54.8f, qo)) << qo;   // 54.8 log2 e = 79.06: over 2^64
    EXPECT_FALSE(shifted(DType::f16, kSoftCap, 30.0f, qo)) << qo;    // f16 cannot hold the range
    EXPECT_FALSE(shifted(DType::bf16, kSoftCap | kAlibi, 30.0f, qo)) << qo;  // ALiBi logits are unbounded
    EXPECT_FALSE(shifted(DType::bf16, kSoftCap | kSigmoid, 30.0f, qo)) << qo;
    EXPECT_FALSE(shifted(DType::bf16, kCausal, 30.0f, qo)) << qo;     // no soft-cap feature
    EXPECT_FALSE(shifted(DType::bf16, kSoftCap, 0.0f, qo)) << qo;     // cap unknown
  }
  EXPECT_TRUE(cap_shift_fits(79.0f));
  EXPECT_FALSE(cap_shift_fits(79.01f));
  EXPECT_FLOAT_EQ(cap_shift_log2(43.0f), 43.0f);  // cap 30: weights <= 1
  EXPECT_FLOAT_EQ(cap_shift_log2(72.0f), 22.0f);  // cap 50: weights <= 2^50, a row's largest >= 2^-94
  // The fp8 KV kernels compute in bf16 too.
  EXPECT_EQ(prefill_choice(DType::bf16, DType::e4m3, DType::bf16, 128, 128, 4, true, 16, kSoftCap, 4096, h200(), false,
                           50.0f).tuning.softmax,
            SoftmaxForm::fixed_shift);
  auto name = [](const kvattn::detail::Overrides& o) {
    return prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 1, false, 0, kCausal | kSoftCap, 16384,
                          h200(), false, 30.0f, o).name();
  };
  EXPECT_EQ(name(kvattn::detail::active_overrides()),  // the fixture's mma.sync tier
            "prefill_bf16_hd128_g1_w4x2_k64_s2_b2_ragged_f5_tanh-approx_shift-swizzle-unroll-packp-lean-wholetile-quarters");
  EXPECT_EQ(name(tanh_forced(kvattn::detail::TanhForm::exact)),
            "prefill_bf16_hd128_g1_w4x2_k64_s2_b2_ragged_f5_shift-swizzle-unroll-packp-lean-wholetile-halves");
  // The long shape's tuning with the shift (measured on the H200 at 7bc9489): the other four
  // choices, the whole-tile transform and halves; quarters above hd 128 and with tanh.approx; fp8,
  // RoPE, custom masks and f16 keep their tuning (with the shift where it applies), short and
  // decode shapes add the shift.
  auto bits = [](DType q, DType kv, int hd, uint32_t features, int64_t qo = 16384, int group = 1) {
    return tuning_name(prefill_choice(q, kv, q, hd, hd, group, false, 0, features, qo, h200(), false, 30.0f).tuning);
  };
  put("KVATTN_PREFILL_TANH", "exact");
  const std::string halves = "shift-swizzle-unroll-packp-lean-wholetile-halves";
  const std::string quarters = "shift-swizzle-unroll-packp-lean-wholetile-quarters";
  EXPECT_EQ(bits(DType::bf16, DType::bf16, 64, kCausal | kSoftCap), halves);
  EXPECT_EQ(bits(DType::bf16, DType::bf16, 128, kCausal | kSoftCap, 16384, 4), halves);
  EXPECT_EQ(bits(DType::bf16, DType::bf16, 256, kCausal | kSoftCap), quarters);
  EXPECT_EQ(bits(DType::bf16, DType::e4m3, 128, kCausal | kSoftCap), "shift-unroll");
  EXPECT_EQ(bits(DType::bf16, DType::bf16, 128, kvattn::kernels::kRope | kSoftCap), "shift-unroll");
  EXPECT_EQ(bits(DType::f16, DType::f16, 128, kCausal | kSoftCap), "lazy-unroll");
  EXPECT_EQ(bits(DType::bf16, DType::bf16, 128, kCausal | kSoftCap, 20), "shift");
  EXPECT_EQ(bits(DType::bf16, DType::bf16, 128, kCausal | kSoftCap, 1, 4).find("halves"), std::string::npos);  // decode
  put("KVATTN_PREFILL_TANH", nullptr);  // the long shape's tanh.approx: quarters, but halves on two stages at hd 64
  for (int hd : {128, 256}) EXPECT_EQ(bits(DType::bf16, DType::bf16, hd, kCausal | kSoftCap), quarters);
  EXPECT_EQ(bits(DType::bf16, DType::bf16, 64, kCausal | kSoftCap), halves);
  auto stages = [](int hd, uint32_t features) {
    return prefill_choice(DType::bf16, DType::bf16, DType::bf16, hd, hd, 1, false, 0, features, 16384, h200(), false,
                          30.0f).stages;
  };
  EXPECT_EQ(stages(64, kCausal | kSoftCap), 2);
  EXPECT_EQ(stages(64, kCausal), 3);  // m2k64's three at hd 64 otherwise
  put("KVATTN_PREFILL_TANH", "exact");
  EXPECT_EQ(stages(64, kCausal | kSoftCap), 3);
  put("KVATTN_PREFILL_TANH", nullptr);
  EXPECT_EQ(bits(DType::bf16, DType::bf16, 128, kCausal | kSoftCap, 20), "shift");
  put("KVATTN_PREFILL_TUNING", "lazy,unroll");  // declines it
  EXPECT_FALSE(shifted(DType::bf16, kSoftCap, 30.0f));
  put("KVATTN_PREFILL_TUNING", "shift,unroll");
  EXPECT_TRUE(shifted(DType::bf16, kSoftCap, 30.0f));
  EXPECT_FALSE(shifted(DType::bf16, kSoftCap, 60.0f));  // cannot force it past its range
  put("KVATTN_PREFILL_TUNING", nullptr);
}

// Soft-cap's tanh by default: tanh.approx on the long shape (MUFU-bound), exact on the short and
// decode shapes (memory-bound); Overrides::prefill_tanh (KVATTN_PREFILL_TANH) forces one form on
// every shape (the presets' exact twins use it too).
TEST_F(PrefillVariantEnv, SoftCapTanhFormByShape) {
  using kvattn::detail::TanhForm;
  using kvattn::kernels::kSoftCap;
  auto approx = [](int64_t qo, int group, std::optional<TanhForm> tanh = std::nullopt) {
    return prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, group, true, 16, kSoftCap, qo, h200(), false,
                          30.0f, tanh ? tanh_forced(*tanh) : kvattn::detail::active_overrides())
        .fast_tanh;
  };
  EXPECT_TRUE(approx(16384, 1));
  EXPECT_TRUE(approx(16, 4));    // 64 packed rows: the long shape
  EXPECT_FALSE(approx(20, 1));   // short
  EXPECT_FALSE(approx(1, 4));    // decode
  EXPECT_FALSE(approx(16384, 1, TanhForm::exact));
  EXPECT_TRUE(approx(20, 1, TanhForm::approx));
  put("KVATTN_PREFILL_TANH", "exact");
  EXPECT_FALSE(approx(16384, 1));
  put("KVATTN_PREFILL_TANH", "approx");
  EXPECT_TRUE(approx(20, 1));
  EXPECT_TRUE(approx(1, 4));
  // Without soft-cap there is no tanh to name.
  EXPECT_FALSE(prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 1, true, 16, 1, 16384).fast_tanh);
}

TEST_F(PrefillVariantEnv, FastTanhOnlyNamesSoftCapKernels) {
  put("KVATTN_PREFILL_TANH", "approx");
  auto a = prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 1, false, 0, kvattn::kernels::kSoftCap, 16384);
  EXPECT_TRUE(a.fast_tanh);
  EXPECT_NE(a.name().find("_tanh-approx"), std::string::npos);
  // tanh.approx soft-cap takes P packed early and the lean copies (the exact form does not).
  EXPECT_EQ(tuning_name(a.tuning), "lazy-unroll-packp-lean");
  EXPECT_FALSE(prefill_choice(DType::bf16, DType::bf16, DType::bf16, 128, 128, 1, false, 0, 1, 16384).fast_tanh);
  EXPECT_KVATTN_ERROR(put("KVATTN_PREFILL_TANH", "fast"), "KVATTN_PREFILL_TANH is one of exact, approx, not 'fast'");
}

}  // namespace
#endif
