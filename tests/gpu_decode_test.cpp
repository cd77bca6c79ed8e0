// BatchDecode on the GPU against the float64 reference: the CPU suite's case grid (dtypes, group
// sizes, page sizes, layouts, storage, strided views, short and empty requests, head dims,
// variants) run through the CUDA backend, plus split-KV batches, CUDA-graph replay with re-plans,
// and the GPU-only errors. Every case skips where there is no CUDA device (CI), with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <span>

#include "support/attention_case.h"
#include "support/device_mirror.h"
#include "support/gpu_skip.h"
#include "support/expect_error.h"
#include "support/paged_kv.h"
#include "support/scoped_override.h"

#if KVATTN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvattn_test {
namespace {

using kvattn::DType;
using kvattn::KVLayout;

std::vector<std::pair<int64_t, int64_t>> lens_of(Rng& rng, int B, int64_t lo, int64_t hi) {
  std::vector<std::pair<int64_t, int64_t>> lens;
  for (int b = 0; b < B; ++b) lens.push_back({1, rng.integer(lo, hi)});
  return lens;
}

// The tensor-core kernel rounds the softmax weights to the MMA type before P V (the MMA takes
// f16/bf16 operands): a relative 2^-9 (bf16) or 2^-11 (f16) per weight, on top of the f32
// accumulation the default tolerance covers. fp8 KV under f16/bf16 q runs f16 MMAs (K, V and
// power-of-two scaled q exact in f16): P in f16.
AttnCase gpu_case(DType q, DType kv) {
  AttnCase c;
  c.on_gpu = true;
  c.q_dtype = q;
  c.kv_dtype = kv;
  const bool fp8_kv = kv == DType::e4m3 || kv == DType::e5m2;
  if (q == kv && kv == DType::bf16) c.tolerance.accumulation = 0x1p-8;
  if ((q == kv && kv == DType::f16) || (fp8_kv && (q == DType::f16 || q == DType::bf16)))
    c.tolerance.accumulation = 0x1p-10;
  return c;
}

// Under KVATTN_DECODE_KERNEL=prefill (scripts/gpu-check's loop, GpuDecode.OnThePrefillKernels)
// the cases the prefill kernels take run on them (cuda::decode_uses_prefill_kernels), with their
// arithmetic: P rounded to q's dtype, fp8 KV included, and RoPE-rotated q and k rounded to it for
// the MMA. The tolerances are the prefill suite's (gpu_prefill_test.cpp) for those cases.
void run_gpu_decode_case(AttnCase c, Rng& rng) {
  // A custom mask runs on the prefill kernels without being forced.
  const bool forced_prefill =
      kvattn_test::current_overrides().decode_kernel == kvattn::detail::DecodeKernelChoice::prefill ||
      c.variant.custom_mask;
  const bool half_q = c.q_dtype == DType::f16 || c.q_dtype == DType::bf16;
  const DType kv = c.kv_dtype.value_or(c.q_dtype);
  if (forced_prefill && half_q &&
      (kv == c.q_dtype || kv == DType::e4m3 || kv == DType::e5m2)) {
    c.tolerance.accumulation = std::max(c.tolerance.accumulation, c.q_dtype == DType::bf16 ? 0x1p-8 : 0x1p-10);
    if (c.variant.rope) {
      c.tolerance.accumulation = std::max(c.tolerance.accumulation, 0x1p-6);
      c.tolerance.lse_abs = std::max(c.tolerance.lse_abs, 4e-3);
    }
  }
  run_decode_case(c, rng);
}

// BatchDecode (on the prefill kernels, where the caller forces them): 5 requests of 0-700 tokens
// and one of long_len (split), 2 KV heads of head dim 128, bf16, against float64.
void run_prefill_route_case(int group, int page_size, KVLayout layout, int64_t long_len) {
  KVATTN_CASE_RNG(rng);
  AttnCase c = gpu_case(DType::bf16, DType::bf16);
  c.lens = lens_of(rng, 5, 0, 700);
  c.lens.push_back({1, long_len});
  c.num_kv_heads = 2;
  c.num_qo_heads = 2 * group;
  c.head_dim_qk = 128;
  c.page_size = page_size;
  c.layout = layout;
  run_gpu_decode_case(c, rng);
}

// Each variant on a small GQA batch (8/2 heads, head dim 64, page 16, 3 requests of 0-400
// tokens) for each KV dtype; accumulation > 0 replaces gpu_case's accumulation tolerance.
void run_variant_cases(std::span<const kvattn::Variant> variants, DType q, std::initializer_list<DType> kvs,
                       double accumulation = 0) {
  for (const auto& v : variants)
    for (DType kv : kvs) {
      KVATTN_CASE_RNG(rng);
      AttnCase c = gpu_case(q, kv);
      if (accumulation > 0) c.tolerance.accumulation = accumulation;
      c.lens = lens_of(rng, 3, 0, 400);
      c.num_qo_heads = 8;
      c.num_kv_heads = 2;
      c.head_dim_qk = 64;
      c.page_size = 16;
      c.variant = v;
      SCOPED_TRACE(v.describe());
      run_gpu_decode_case(c, rng);
    }
}

TEST(GpuDecode, EveryDtypeCombination) {
  SKIP_WITHOUT_GPU();
  for (DType q : {DType::f32, DType::f16, DType::bf16})
    for (DType kv : {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2})
      for (DType o : {DType::f32, DType::bf16}) {
        KVATTN_CASE_RNG(rng);
        AttnCase c = gpu_case(q, kv);
        c.lens = lens_of(rng, 3, 1, 200);
        c.num_qo_heads = 8;
        c.num_kv_heads = 2;
        c.head_dim_qk = 64;
        c.o_dtype = o;
        run_gpu_decode_case(c, rng);
      }
}

TEST(GpuDecode, GroupSizesPageSizesLayouts) {
  SKIP_WITHOUT_GPU();
  for (int group : {1, 4, 7, 8, 16})
    for (int ps : {1, 3, 16})
      for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
        KVATTN_CASE_RNG(rng);
        AttnCase c = gpu_case(DType::bf16, DType::bf16);
        c.lens = lens_of(rng, 4, 0, 150);
        c.num_kv_heads = 2;
        c.num_qo_heads = 2 * group;
        c.head_dim_qk = 128;
        c.page_size = ps;
        c.layout = layout;
        c.store = group % 2 ? KVStore::paged_combined : KVStore::paged;
        run_gpu_decode_case(c, rng);
      }
}

// The page-box kernel of sm_90+ (DecodeTmaKernel: pages of a multiple of 16 tokens, head dims of
// multiples of 64): page sizes 16 to 64 in both layouts, partial last pages, head dims 64 to 256,
// split chunks (one-tile chunks too), a sliding window (which keeps the row copies: its range
// starts off the 16-token grid), soft-cap, and with KVATTN_DECODE_TMA_BOXES=0 every tile on the
// TMA kernel's cp.async path into the same swizzled layout.
// Where the device has no bulk copies the same cases run on the cp.async kernels.
TEST(GpuDecode, PageBoxesAndTheirFallback) {
  SKIP_WITHOUT_GPU();
  for (const char* boxes : {"1", "0"}) {
    ScopedOverride env("KVATTN_DECODE_TMA_BOXES", boxes);
    SCOPED_TRACE(std::string("KVATTN_DECODE_TMA_BOXES=") + boxes);
    for (int ps : {16, 32, 48, 64})
      for (KVLayout layout : {KVLayout::NHD, KVLayout::HND})
        for (int hd : {64, 128, 256}) {
          if (hd != 128 && ps != 16) continue;
          KVATTN_CASE_RNG(rng);
          AttnCase c = gpu_case(DType::bf16, DType::bf16);
          c.lens = lens_of(rng, 4, 1, 700);
          c.num_qo_heads = 16;
          c.num_kv_heads = 4;
          c.head_dim_qk = hd;
          c.page_size = ps;
          c.layout = layout;
          c.store = ps == 32 ? KVStore::paged_combined : KVStore::paged;
          if (ps == 48) c.scheduler.fixed_split_size = 128;
          if (ps == 64) c.scheduler.fixed_split_size = 64;  // one-tile chunks
          run_gpu_decode_case(c, rng);
        }
    for (const kvattn::Variant& v : {kvattn::variants::sliding_window(100), kvattn::variants::soft_cap(5.0f)}) {
      KVATTN_CASE_RNG(rng);
      AttnCase c = gpu_case(DType::f16, DType::f16);
      c.lens = {{1, 1500}, {1, 333}, {1, 16}, {1, 0}};
      c.num_qo_heads = 32;
      c.num_kv_heads = 8;
      c.head_dim_qk = 128;
      c.page_size = 16;
      c.variant = v;
      c.scheduler.fixed_split_size = 256;
      SCOPED_TRACE(v.describe());
      run_gpu_decode_case(c, rng);
    }
  }
}

TEST(GpuDecode, ShortEmptyAndLongRequests) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> batches = {
      {}, {{1, 0}}, {{1, 1}}, {{1, 0}, {1, 1}, {1, 0}}, {{1, 63}, {1, 64}, {1, 65}, {1, 0}},
      {{1, 5000}, {1, 3}, {1, 700}}, {{1, 20000}}};
  for (const auto& lens : batches)
    for (DType kv : {DType::bf16, DType::e4m3}) {
      KVATTN_CASE_RNG(rng);
      AttnCase c = gpu_case(DType::bf16, kv);
      c.lens = lens;
      c.num_qo_heads = 8;
      c.num_kv_heads = 2;
      c.head_dim_qk = 128;
      c.page_size = 16;
      run_gpu_decode_case(c, rng);
    }
}

// Skewed batches (longest >= 4x the mean) take the 2-stage bulk kernel on sm_90+
// (cuda::decode_batch_is_skewed): the same grid of dtypes and group sizes through it.
// fp8 K/V on the tensor-core kernels (f16 MMAs with the fragment permutations of
// decode_mma_kernel.cuh): e4m3 and e5m2 under bf16 and f16 q; head dims with an even and an odd
// number of 16-dim chunks (80: the x2 ldmatrix tails) up to 256; groups 1-16; pages of 1 (row
// copies), 16 and 32 (TMA boxes at head dims of 128-byte rows) in both layouts; device page ids;
// split chunks; the decode variants; and bf16 q rows far outside f16's range (2^20) or below its
// normals (2^-24) in one CTA, with sm_scale bringing the large rows' logits back to the usual range:
// each row is scaled into f16 by its own power of two.
TEST(GpuDecode, Fp8OnTensorCores) {
  SKIP_WITHOUT_GPU();
  for (DType kv : {DType::e4m3, DType::e5m2})
    for (DType q : {DType::bf16, DType::f16})
      for (int hd : {64, 80, 128, 256})
        for (int group : {1, 4, 16}) {
          if (hd != 128 && group == 16) continue;
          for (int ps : {1, 16, 32}) {
            if (hd != 128 && ps == 32) continue;
            KVATTN_CASE_RNG(rng);
            AttnCase c = gpu_case(q, kv);
            c.lens = lens_of(rng, 4, 0, 600);
            c.lens.push_back({1, 2100});
            c.num_kv_heads = 2;
            c.num_qo_heads = 2 * group;
            c.head_dim_qk = hd;
            c.page_size = ps;
            c.layout = ps == 16 ? KVLayout::HND : KVLayout::NHD;
            c.device_page_table = ps != 1;
            if (ps == 32) c.scheduler.fixed_split_size = 256;
            run_gpu_decode_case(c, rng);
          }
        }
  // Rows of very different magnitudes in one CTA (bf16 q only: f16 q cannot hold 2^20).
  for (DType kv : {DType::e4m3, DType::e5m2})
    for (int hd : {128, 80}) {
      KVATTN_CASE_RNG(rng);
      AttnCase c = gpu_case(DType::bf16, kv);
      c.lens = {{1, 700}, {1, 33}, {1, 1200}};
      c.num_kv_heads = 2;
      c.num_qo_heads = 16;
      c.head_dim_qk = hd;
      c.q_head_scales = {0x1p20, 1.0, 0x1p-24, 0x1p20, 0x1p4};
      c.variant = kvattn::Variant{}.with_sm_scale(float(0x1p-20 / std::sqrt(double(hd))));
      run_gpu_decode_case(c, rng);
    }
  const kvattn::Variant variants[] = {
      kvattn::variants::sliding_window(40), kvattn::variants::soft_cap(5.0f), kvattn::variants::alibi(),
      kvattn::variants::sigmoid(-1.0f), kvattn::Variant{}.with_sm_scale(0.3f).with_scales(1.5f, 0.5f, 2.0f),
      kvattn::variants::causal().with_soft_cap(8.0f).with_window(100).with_alibi()};
  run_variant_cases(variants, DType::bf16, {DType::e4m3, DType::e5m2});
  run_variant_cases(variants, DType::f16, {DType::e4m3});
}

// Groups of 17-64 query heads per KV head (MQA, large GQA groups) on the two-M-tile kernels (up
// to 32 heads per CTA, head_dim_vo <= 128): 20, 24 and 32 heads (padded rows in the second tile), 64
// (two head chunks); bf16, f16 and fp8 K/V; pages 1 (row copies), 16 (TMA boxes) and 5 in both
// layouts; the cp.async kernel (KVATTN_DECODE_KERNEL=mma); split chunks; the variants.
TEST(GpuDecode, LargeGroupsOnTwoMTiles) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    DType q, kv;
    int group, hd, page_size;
  };
  for (const char* kernel : {"decode", "mma"}) {
    ScopedOverride env("KVATTN_DECODE_KERNEL", kernel);
    SCOPED_TRACE(std::string("KVATTN_DECODE_KERNEL=") + kernel);
    for (const Shape& sh : {Shape{DType::bf16, DType::bf16, 32, 128, 16}, Shape{DType::f16, DType::f16, 24, 64, 1},
                            Shape{DType::bf16, DType::e4m3, 32, 128, 16}, Shape{DType::bf16, DType::e5m2, 20, 80, 5},
                            Shape{DType::f16, DType::e4m3, 64, 128, 1}, Shape{DType::bf16, DType::bf16, 64, 64, 32}}) {
      KVATTN_CASE_RNG(rng);
      AttnCase c = gpu_case(sh.q, sh.kv);
      c.lens = lens_of(rng, 3, 0, 900);
      c.lens.push_back({1, 2500});
      c.num_kv_heads = sh.group == 64 ? 1 : 2;
      c.num_qo_heads = c.num_kv_heads * sh.group;
      c.head_dim_qk = sh.hd;
      c.page_size = sh.page_size;
      c.layout = sh.page_size == 16 ? KVLayout::HND : KVLayout::NHD;
      c.device_page_table = sh.page_size != 5;
      if (sh.page_size == 32) c.scheduler.fixed_split_size = 128;
      run_gpu_decode_case(c, rng);
    }
  }
  const kvattn::Variant variants[] = {
      kvattn::variants::sliding_window(40), kvattn::variants::soft_cap(5.0f), kvattn::variants::alibi(),
      kvattn::variants::sigmoid(-1.0f), kvattn::Variant{}.with_sm_scale(0.3f).with_scales(1.5f, 0.5f, 2.0f)};
  for (const auto& v : variants)
    for (DType kv : {DType::bf16, DType::e4m3}) {
      KVATTN_CASE_RNG(rng);
      AttnCase c = gpu_case(DType::bf16, kv);
      c.lens = lens_of(rng, 3, 0, 400);
      c.num_qo_heads = 64;
      c.num_kv_heads = 2;
      c.head_dim_qk = 128;
      c.variant = v;
      SCOPED_TRACE(v.describe());
      run_gpu_decode_case(c, rng);
    }
}

TEST(GpuDecode, SkewedBatches) {
  SKIP_WITHOUT_GPU();
  for (DType kv : {DType::bf16, DType::f16})
    for (int group : {1, 4, 8}) {
      KVATTN_CASE_RNG(rng);
      AttnCase c = gpu_case(kv, kv);
      c.lens = {{1, 6000}, {1, 17}, {1, 300}, {1, 0}, {1, 1}, {1, 64}, {1, 129}, {1, 700}};
      c.num_kv_heads = 2;
      c.num_qo_heads = 2 * group;
      c.head_dim_qk = 128;
      c.page_size = 16;
      run_gpu_decode_case(c, rng);
    }
}

TEST(GpuDecode, HeadDims) {
  SKIP_WITHOUT_GPU();
  for (auto [dqk, dvo] : {std::pair{16, 16}, {64, 64}, {96, 96}, {128, 128}, {192, 128}, {256, 256}})
    for (DType kv : {DType::f16, DType::f32}) {
      KVATTN_CASE_RNG(rng);
      AttnCase c = gpu_case(DType::f16, kv);
      c.lens = lens_of(rng, 3, 1, 300);
      c.num_qo_heads = 4;
      c.num_kv_heads = 1;
      c.head_dim_qk = dqk;
      c.head_dim_vo = dvo;
      c.page_size = 16;
      run_gpu_decode_case(c, rng);
    }
}

TEST(GpuDecode, Variants) {
  SKIP_WITHOUT_GPU();
  kvattn::RopeConfig llama31;
  llama31.llama31 = kvattn::Llama31Scaling{};
  const kvattn::Variant variants[] = {
      kvattn::variants::causal(),
      kvattn::variants::sliding_window(40),
      kvattn::variants::soft_cap(5.0f),
      kvattn::variants::alibi(),
      kvattn::variants::rope(),
      kvattn::variants::rope(llama31),
      kvattn::variants::sigmoid(-1.0f),
      kvattn::Variant{}.with_sm_scale(0.3f).with_scales(1.5f, 0.5f, 2.0f),
      kvattn::variants::causal().with_soft_cap(8.0f).with_window(100).with_alibi(),
  };
  run_variant_cases(variants, DType::bf16, {DType::bf16, DType::e5m2});
}

// A custom mask makes BatchDecode run on the prefill kernels' decode shape (the decode kernels
// have none), with GQA, fp8 KV and the other masks.
TEST(GpuDecode, CustomMask) {
  SKIP_WITHOUT_GPU();
  const kvattn::Variant variants[] = {kvattn::variants::custom_mask(),
                                      kvattn::variants::custom_mask().with_window(60).with_soft_cap(6.0f)};
  run_variant_cases(variants, DType::bf16, {DType::bf16, DType::e4m3});
}

// BatchDecode on the prefill kernels (cuda::decode_uses_prefill_kernels: the default on devices
// without bulk copies for GQA groups >= 4; forced here so that every GPU runs it): group sizes,
// page sizes, layouts, short, empty and long requests, variants, fp8 KV, against float64.
TEST(GpuDecode, OnThePrefillKernels) {
  SKIP_WITHOUT_GPU();
  ScopedOverride force("KVATTN_DECODE_KERNEL", "prefill");
  for (int group : {1, 4, 8})
    for (int ps : {1, 16})
      for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) run_prefill_route_case(group, ps, layout, 3000);
  const kvattn::Variant variants[] = {
      kvattn::variants::sliding_window(40), kvattn::variants::soft_cap(5.0f), kvattn::variants::alibi(),
      kvattn::variants::rope(),             kvattn::variants::sigmoid(-1.0f),
      kvattn::Variant{}.with_sm_scale(0.3f).with_scales(1.5f, 0.5f, 2.0f)};
  // The prefill kernels round P to q's dtype (f16) for P V, fp8 KV included.
  run_variant_cases(variants, DType::f16, {DType::f16, DType::e4m3}, 0x1p-10);
#if KVATTN_WITH_CUDA
  // One query per request: partial slots hold the group's rows, not the prefill M tile's (16x
  // more at group 4), so a split batch fits the workspace it needs on the decode kernels (this
  // one took 4 MiB before).
  std::vector<int32_t> indptr{0}, indices, last;
  for (int b = 0; b < 3; ++b) {
    for (int i = 0; i < 40; ++i) indices.push_back(int32_t(indices.size()));
    indptr.push_back(int32_t(indices.size()));
    last.push_back(7);
  }
  HostTensor i1 = int32_tensor(indptr), i2 = int32_tensor(indices), i3 = int32_tensor(last);
  kvattn::BatchDecodePlan p;
  p.num_qo_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim_qk = 128;
  p.page_size = 16;
  p.page_table = {i1.view(), i2.view(), i3.view()};
  DeviceBytes ws(1 << 20);
  kvattn::BatchDecode op(ws.view());
  op.plan(p);
  ASSERT_NE(op.schedule(), nullptr);
  EXPECT_GT(op.schedule()->num_merges(), 0);  // the batch was split
  EXPECT_EQ(op.schedule()->partial_slot_rows(), 4);
#endif
}

// The prefill kernels' decode shapes (KVATTN_PREFILL_DECODE_SHAPE: KV warps splitting each tile):
// group sizes, page sizes, layouts and a split long request against float64.
TEST(GpuDecode, OnThePrefillKernelsDecodeShapes) {
  SKIP_WITHOUT_GPU();
  ScopedOverride force("KVATTN_DECODE_KERNEL", "prefill");
  for (const char* shape : {"2x32s2", "4x16s2", "4x32s3"}) {
    ScopedOverride decode_shape("KVATTN_PREFILL_DECODE_SHAPE", shape);
    SCOPED_TRACE(shape);
    for (int group : {1, 4, 8})
      for (int ps : {1, 16}) run_prefill_route_case(group, ps, ps == 1 ? KVLayout::HND : KVLayout::NHD, 5000);
  }
}

TEST(GpuDecode, SplitKVMatchesAcrossSchedules) {
  SKIP_WITHOUT_GPU();
  // The same batch planned with many small chunks, with no splitting, and with few workers.
  for (int mode = 0; mode < 3; ++mode) {
    KVATTN_CASE_RNG(rng);
    AttnCase c = gpu_case(DType::bf16, DType::bf16);
    c.lens = {{1, 9000}, {1, 17}, {1, 2500}, {1, 0}, {1, 640}};
    c.num_qo_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim_qk = 128;
    c.page_size = 16;
    if (mode == 0) c.scheduler.fixed_split_size = 128;
    if (mode == 1) c.scheduler.disable_split_kv = true;
    if (mode == 2) c.scheduler.num_workers = 5;
    run_gpu_decode_case(c, rng);
  }
}

// Split rows, folded by the merge kernel (default) or, with KVATTN_DECODE_MERGE=fold (gpu-check runs
// that too), by the last CTA of each (merge entry, head chunk), which resets the entry's counter for
// the next run: several runs on one plan, each into fresh poison, must all write every row,
// identically. Covers tensor-core and CUDA-core kernels, two head chunks (MQA 32/1: 16 heads
// per CTA), and the plain sum of sigmoid attention.
TEST(GpuDecode, SplitRowsFoldOnEveryRun) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    DType kv;
    int qo_heads, kv_heads;
    kvattn::Variant variant;
  };
  for (const Shape& sh : {Shape{DType::bf16, 8, 2, {}}, Shape{DType::bf16, 32, 1, {}},
                          Shape{DType::e4m3, 8, 2, {}}, Shape{DType::bf16, 8, 2, kvattn::variants::sigmoid(-1.0f)}}) {
    KVATTN_CASE_RNG(rng);
    AttnCase c = gpu_case(DType::bf16, sh.kv);
    c.lens = {{1, 3000}, {1, 1}, {1, 700}, {1, 0}, {1, 1500}};
    c.num_qo_heads = sh.qo_heads;
    c.num_kv_heads = sh.kv_heads;
    c.head_dim_qk = 128;
    c.page_size = 16;
    c.variant = sh.variant;
    c.scheduler.fixed_split_size = 256;
    c.runs = 4;
    run_gpu_decode_case(c, rng);
  }
}

TEST(GpuDecode, StridedQueriesAndOutputs) {
  SKIP_WITHOUT_GPU();
  // Padded q/out/lse strides are fine; the KV rows must stay 16-byte aligned (next test).
  for (DType kv : {DType::bf16, DType::f32}) {
    KVATTN_CASE_RNG(rng);
    AttnCase c = gpu_case(DType::bf16, kv);
    c.lens = lens_of(rng, 3, 0, 100);
    c.num_qo_heads = 8;
    c.num_kv_heads = 2;
    c.head_dim_qk = 64;
    c.page_size = 16;
    c.strided = true;
    c.kv_aligned_strides = true;
    run_gpu_decode_case(c, rng);
  }
}

TEST(GpuDecode, MisalignedKVIsAnError) {
  SKIP_WITHOUT_GPU();
  KVATTN_CASE_RNG(rng);
  AttnCase c = gpu_case(DType::bf16, DType::bf16);
  c.lens = {{1, 20}};
  c.num_qo_heads = 4;
  c.num_kv_heads = 1;
  c.head_dim_qk = 64;
  c.strided = true;  // pads K/V rows by 1..3 elements: not 16-byte multiples
  c.expect_error = "kernels copy 16-byte pieces of each row";  // decode or prefill kernels (forced)
  run_gpu_decode_case(c, rng);
}

TEST(GpuDecode, UnsupportedShapesAreErrors) {
  SKIP_WITHOUT_GPU();
#if KVATTN_WITH_CUDA
  std::vector<int32_t> indptr{0, 1}, indices{0}, last{1};
  kvattn::BatchDecodePlan p;
  p.num_qo_heads = 4;
  p.num_kv_heads = 1;
  p.head_dim_qk = 512;
  p.page_size = 16;
  HostTensor i1 = int32_tensor(indptr), i2 = int32_tensor(indices), i3 = int32_tensor(last);
  p.page_table = {i1.view(), i2.view(), i3.view()};
  DeviceBytes ws(1 << 20), tiny(256);
  kvattn::BatchDecode op(ws.view());
  EXPECT_KVATTN_ERROR(op.plan(p), "head dim 512 is not supported by the GPU decode kernels");
  // 64 requests: their page table alone (indptr, ids, last-page lengths) outgrows 256 bytes on
  // either kernel path.
  p.head_dim_qk = 128;
  std::vector<int32_t> indptr64(65), indices64(64), last64(64, 1);
  for (int b = 0; b <= 64; ++b) indptr64[size_t(b)] = b;
  for (int b = 0; b < 64; ++b) indices64[size_t(b)] = b;
  HostTensor j1 = int32_tensor(indptr64), j2 = int32_tensor(indices64), j3 = int32_tensor(last64);
  p.page_table = {j1.view(), j2.view(), j3.view()};
  kvattn::BatchDecode small(tiny.view());
  EXPECT_KVATTN_ERROR(small.plan(p), "the workspace is too small");
#endif
}

// A plan() that fails (here: a batch whose page table does not fit the workspace) changes
// nothing: schedule() still shows the plan that run() uses.
// A workspace too small for the split plan's partial states gets the unsplit plan
// (cuda/workspace_fit.h), and the same attention.
TEST(GpuDecode, SmallWorkspaceGetsTheUnsplitPlan) {
  SKIP_WITHOUT_GPU();
#if KVATTN_WITH_CUDA
  std::vector<int32_t> ids(4096);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  HostTensor indptr = int32_tensor({0, 4096}), indices = int32_tensor(ids), last = int32_tensor({16});
  kvattn::BatchDecodePlan p;
  p.num_qo_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim_qk = 128;
  p.q_dtype = DType::bf16;
  p.page_size = 16;
  p.page_table = {indptr.view(), indices.view(), last.view()};
  DeviceBytes big(int64_t(64) << 20), small(int64_t(64) << 10);
  kvattn::BatchDecode split(big.view()), unsplit(small.view());
  split.plan(p);
  ASSERT_GT(split.schedule()->num_merges(), 0) << "the case no longer splits: pick a longer one";
  unsplit.plan(p);
  EXPECT_EQ(unsplit.schedule()->num_merges(), 0);
  KVATTN_CASE_RNG(rng);
  AttnCase c = gpu_case(DType::bf16, DType::bf16);
  c.lens = {{1, 65536}};
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim_qk = 128;
  c.page_size = 16;
  c.workspace_bytes = int64_t(64) << 10;
  run_gpu_decode_case(c, rng);
#endif
}

TEST(GpuDecode, FailedPlanLeavesTheLastGoodSchedule) {
  SKIP_WITHOUT_GPU();
#if KVATTN_WITH_CUDA
  auto plan_for = [](int requests, int pages_each, std::vector<HostTensor>& keep) {
    std::vector<int32_t> indptr{0}, indices, last;
    for (int b = 0; b < requests; ++b) {
      for (int i = 0; i < pages_each; ++i) indices.push_back(int32_t(indices.size()));
      indptr.push_back(int32_t(indices.size()));
      last.push_back(7);
    }
    keep = {int32_tensor(indptr), int32_tensor(indices), int32_tensor(last)};
    kvattn::BatchDecodePlan p;
    p.num_qo_heads = 32;
    p.num_kv_heads = 8;
    p.head_dim_qk = 128;
    p.page_size = 16;
    p.page_table = {keep[0].view(), keep[1].view(), keep[2].view()};
    return p;
  };
  // 16 MiB: the small batch fits on either kernel path; the big one's 4096 x 1100 page ids
  // (17.2 MiB) do not.
  DeviceBytes ws(16 << 20);
  kvattn::BatchDecode op(ws.view());
  std::vector<HostTensor> small_keep, big_keep;
  op.plan(plan_for(3, 40, small_keep));
  ASSERT_NE(op.schedule(), nullptr);
  const int64_t items = op.schedule()->num_items(), merges = op.schedule()->num_merges();
  EXPECT_EQ(op.schedule()->batch_size(), 3);
  EXPECT_KVATTN_ERROR(op.plan(plan_for(4096, 1100, big_keep)), "the workspace is too small");
  EXPECT_EQ(op.schedule()->batch_size(), 3);
  EXPECT_EQ(op.schedule()->num_items(), items);
  EXPECT_EQ(op.schedule()->num_merges(), merges);
#endif
}

}  // namespace
}  // namespace kvattn_test
