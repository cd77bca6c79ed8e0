// BatchPrefill on the GPU (tensor-core prefill kernels) against the float64 reference: dtypes,
// request lengths (1, 17, 127, 577, a 16k cache), query lengths from 1 to kv_len, every variant,
// page sizes 1, 5, 16 in NHD and HND, ragged and paged (split and combined) KV, GQA groups 1 to
// 16, head dims 16 to 256 (192 x 128 too), LSE, split schedules and the GPU-only errors. Every
// case skips where there is no CUDA device, with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "reference/reference.h"
#include "support/attention_case.h"
#include "support/device_mirror.h"
#include "support/gpu_skip.h"
#include "support/expect_error.h"
#include "support/paged_kv.h"
#include "support/kernel_choice.h"
#include "support/scoped_override.h"
#include "cuda/prefill_kernels.h"

#if KVATTN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/runtime.h"
#include "kernels/variants/params.cuh"
#endif

namespace kvattn_test {
namespace {

using kvattn::DType;
using kvattn::KVLayout;

// B requests: kv_len in [kv_lo, kv_hi], qo_len in [1, min(kv_len, qo_hi)] (0 when kv_len is 0).
std::vector<std::pair<int64_t, int64_t>> prefill_lens(Rng& rng, int B, int64_t kv_lo, int64_t kv_hi,
                                                      int64_t qo_hi) {
  std::vector<std::pair<int64_t, int64_t>> lens;
  for (int b = 0; b < B; ++b) {
    int64_t kv = rng.integer(kv_lo, kv_hi);
    lens.push_back({kv == 0 ? 0 : rng.integer(1, std::min(kv, qo_hi)), kv});
  }
  return lens;
}

// The tensor-core kernel rounds the softmax weights to the MMA type (q's dtype) before P V: a
// relative 2^-9 (bf16) or 2^-11 (f16) per weight, on top of the f32 accumulation.
AttnCase gpu_case(DType q, std::optional<DType> kv = {}) {
  AttnCase c;
  c.on_gpu = true;
  c.q_dtype = q;
  c.kv_dtype = kv;
  c.tolerance.accumulation = q == DType::bf16 ? 0x1p-8 : 0x1p-10;
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim_qk = 64;
  return c;
}

const KVStore kStores[] = {KVStore::ragged, KVStore::paged, KVStore::paged_combined};

TEST(GpuPrefill, DtypeCombinations) {
  SKIP_WITHOUT_GPU();
  for (DType q : {DType::f16, DType::bf16})
    for (DType kv : {q, DType::e4m3, DType::e5m2})
      for (DType o : {DType::f32, DType::f16, DType::bf16}) {
        KVATTN_CASE_RNG(rng);
        AttnCase c = gpu_case(q, kv);
        c.o_dtype = o;
        c.lens = prefill_lens(rng, 3, 1, 200, 200);
        c.variant = kvattn::variants::causal();
        c.store = (int(kv) + int(o)) % 2 ? KVStore::ragged : KVStore::paged;
        run_prefill_case(c, rng);
      }
}

TEST(GpuPrefill, RequestLengths) {
  SKIP_WITHOUT_GPU();
  // kv lengths 1, 17, 127, 577 with query runs from one token to the whole request.
  for (KVStore store : kStores)
    for (bool causal : {false, true}) {
      KVATTN_CASE_RNG(rng);
      AttnCase c = gpu_case(DType::bf16);
      c.lens = {{1, 1}, {17, 17}, {5, 17}, {127, 127}, {1, 127}, {577, 577}, {rng.integer(1, 577), 577}};
      c.variant.causal = causal;
      c.store = store;
      run_prefill_case(c, rng);
    }
}

TEST(GpuPrefill, QueryLengthsUpToKVLength) {
  SKIP_WITHOUT_GPU();
  for (int64_t qo : {1, 2, 3, 15, 16, 17, 31, 33, 64, 65, 99, 100})
    for (bool paged : {false, true}) {
      KVATTN_CASE_RNG(rng);
      AttnCase c = gpu_case(DType::f16);
      c.lens = {{qo, 100}, {std::min<int64_t>(qo, 40), 40}};
      c.variant = kvattn::variants::causal();
      c.store = paged ? KVStore::paged : KVStore::ragged;
      c.page_size = 16;
      run_prefill_case(c, rng);
    }
}

TEST(GpuPrefill, LongCache16k) {
  SKIP_WITHOUT_GPU();
  // A 16k-token cache: an append of a few hundred tokens, a single-token step, and a short request.
  for (KVStore store : {KVStore::ragged, KVStore::paged}) {
    KVATTN_CASE_RNG(rng);
    AttnCase c = gpu_case(DType::bf16);
    c.lens = {{300, 16384}, {1, 16384}, {50, 60}};
    c.num_qo_heads = 4;
    c.num_kv_heads = 1;
    c.variant = kvattn::variants::causal();
    c.store = store;
    run_prefill_case(c, rng);
  }
}

TEST(GpuPrefill, GroupSizesPageSizesLayouts) {
  SKIP_WITHOUT_GPU();
  for (int group : {1, 4, 7, 8, 16})
    for (int ps : {1, 5, 16})
      for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
        KVATTN_CASE_RNG(rng);
        AttnCase c = gpu_case(DType::bf16);
        c.lens = prefill_lens(rng, 3, 0, 150, 70);
        c.num_kv_heads = 2;
        c.num_qo_heads = 2 * group;
        c.head_dim_qk = 128;
        c.page_size = ps;
        c.layout = layout;
        c.variant = kvattn::variants::causal();
        c.store = group % 2 ? KVStore::paged_combined : KVStore::paged;
        run_prefill_case(c, rng);
      }
}

TEST(GpuPrefill, HeadDims) {
  SKIP_WITHOUT_GPU();
  for (auto [dqk, dvo] : {std::pair{16, 16}, {64, 64}, {96, 96}, {128, 128}, {192, 128}, {64, 128}, {256, 256}})
    for (KVStore store : {KVStore::ragged, KVStore::paged}) {
      KVATTN_CASE_RNG(rng);
      AttnCase c = gpu_case(DType::bf16);
      c.lens = prefill_lens(rng, 3, 1, 300, 150);
      c.num_qo_heads = 4;
      c.num_kv_heads = 1;
      c.head_dim_qk = dqk;
      c.head_dim_vo = dvo;
      c.variant = kvattn::variants::causal();
      c.store = store;
      c.layout = dqk % 3 == 0 ? KVLayout::HND : KVLayout::NHD;
      run_prefill_case(c, rng);
    }
}

TEST(GpuPrefill, Variants) {
  SKIP_WITHOUT_GPU();
  kvattn::RopeConfig llama31, interleaved;
  llama31.llama31 = kvattn::Llama31Scaling{};
  interleaved.interleave = true;
  const kvattn::Variant variants[] = {
      kvattn::variants::plain(),
      kvattn::variants::causal(),
      kvattn::variants::sliding_window(40),
      kvattn::variants::sliding_window(7, false),
      kvattn::variants::soft_cap(5.0f),
      kvattn::variants::alibi(),
      kvattn::variants::causal().with_custom_mask(),
      kvattn::Variant{}.with_custom_mask(),
      kvattn::variants::sigmoid(-1.0f),
      kvattn::variants::causal().with_sigmoid(0.5f),
      kvattn::Variant{}.with_sm_scale(0.3f).with_scales(1.5f, 0.5f, 2.0f),
      kvattn::variants::causal().with_soft_cap(8.0f).with_window(100).with_alibi(),
      kvattn::variants::causal().with_rope(),
      kvattn::variants::causal().with_rope(llama31),
      kvattn::Variant{}.with_rope(interleaved),
  };
  for (const auto& v : variants)
    for (DType kv : {DType::f16, DType::e5m2})
      for (KVStore store : {KVStore::ragged, KVStore::paged}) {
        KVATTN_CASE_RNG(rng);
        AttnCase c = gpu_case(DType::f16, kv);
        c.lens = prefill_lens(rng, 3, 1, 300, 120);
        c.variant = v;
        c.store = store;
        c.page_size = 5;
        if (v.rope) {  // q and k are rotated in f32, then rounded to f16 for the MMA
          c.tolerance.accumulation = 0x1p-6;
          c.tolerance.lse_abs = 4e-3;
        }
        SCOPED_TRACE(v.describe());
        run_prefill_case(c, rng);
      }
}

// The decode shape (one M-row warp, KV_WARPS warps splitting each KV tile, their states merged in
// shared memory): decode-like appends of 1-4 queries, every variant family, fp8 KV, page sizes
// 1, 5, 16, and lengths that end inside a KV warp's part of the last tile (or before it).
TEST(GpuPrefill, DecodeShapes) {
  SKIP_WITHOUT_GPU();
  const kvattn::Variant variants[] = {
      kvattn::variants::causal(),
      kvattn::variants::sliding_window(40),
      kvattn::variants::soft_cap(5.0f),
      kvattn::variants::alibi(),
      kvattn::variants::causal().with_custom_mask(),
      kvattn::variants::sigmoid(-1.0f),
      kvattn::variants::causal().with_rope(),
  };
  for (const char* shape : {"2x32s2", "4x16s2", "4x32s3", "4x16s4", "6x16s2b2"}) {
    ScopedOverride force("KVATTN_PREFILL_DECODE_SHAPE", shape);
    SCOPED_TRACE(shape);
    const auto cfg = kvattn_test::prefill_choice(DType::f16, DType::f16, DType::f16, 64, 64, 4, true, 5, 0, 4);
    ASSERT_EQ(cfg.kv_warps, shape[0] - '0');  // the knob reaches the config run() uses
    for (int i = 0; i < int(std::size(variants)); ++i) {
      const kvattn::Variant& v = variants[i];
      KVATTN_CASE_RNG(rng);
      AttnCase c = gpu_case(DType::f16, i % 2 ? DType::e4m3 : DType::f16);
      c.lens = {{1, 1}, {4, 17}, {2, 63}, {0, 0}, {3, 577}, {1, rng.integer(1000, 3000)}};
      c.variant = v;
      c.store = kStores[i % 3];
      c.page_size = i % 3 == 0 ? 16 : i % 3 == 1 ? 5 : 1;
      if (v.rope) {  // as in Variants
        c.tolerance.accumulation = 0x1p-6;
        c.tolerance.lse_abs = 4e-3;
      }
      SCOPED_TRACE(v.describe());
      run_prefill_case(c, rng);
    }
  }
}

// Soft-cap as models use it (Grok-1: cap 30 at head dim 128; Gemma 2: cap 50 at head dim 256),
// with sm_scale raised so that the raw logits spread over about +-1.5 caps: most keys sit in
// tanh's curved and saturated range, where an approximate tanh's error is largest; and hd 64 at
// cap 30 (bf16: the fixed shift, in halves on two stages with tanh.approx). Both tanh forms: the
// default (tanh.approx on the long shape) held to MUFU.TANH's measured error (kTanhApproxMeasured,
// compare.h), and the exact one at the f32 tolerance.
TEST(GpuPrefill, SoftCapWithLogitsAcrossTheCap) {
  SKIP_WITHOUT_GPU();
  struct Model {
    int head_dim;
    float cap;
  };
  for (const char* form : {static_cast<const char*>(nullptr), "exact"}) {
    ScopedOverride tanh_form("KVATTN_PREFILL_TANH", form);
    SCOPED_TRACE(form ? "exact tanh" : "default tanh");
    for (const Model m : {Model{128, 30.0f}, Model{256, 50.0f}, Model{64, 30.0f}})
      for (DType q : {DType::bf16, DType::f16})
        for (KVStore store : {KVStore::ragged, KVStore::paged}) {
          KVATTN_CASE_RNG(rng);
          AttnCase c = gpu_case(q);
          c.head_dim_qk = m.head_dim;
          c.lens = prefill_lens(rng, 3, 1, 700, 300);
          // q . k ~ N(0, head_dim): a scaled logit's standard deviation is cap / 1.5.
          const float sm_scale = m.cap / 1.5f / std::sqrt(float(m.head_dim));
          c.variant = kvattn::variants::causal().with_soft_cap(m.cap).with_sm_scale(sm_scale);
          c.store = store;
          c.tanh_approx_error = kTanhApproxMeasured;
          SCOPED_TRACE(c.variant.describe());
          run_prefill_case(c, rng);
        }
  }
}

// bf16 soft-cap takes one fixed shift instead of a row maximum up to cap 54.7 (SoftmaxForm::fixed_shift;
// smem_layout.cuh): rows whose every logit sits near the bottom of the range (-0.9 cap: a row's
// largest weight near 2^-86) or near its top (+0.9 cap: up to 2^57), at the largest cap that takes
// the shift and the smallest that does not (the host's choice is PrefillVariantEnv's), split and
// unsplit, ragged and paged; then the shift's other paths: a sliding window (the masked tiles of
// the tile by parts) and decode (one query per request: the decode shape, whose KV warps merge
// states with the fixed reference). Both tanh forms (as above).
AttnCase soft_cap_edge_case(Rng& rng, float cap, float sign) {
  AttnCase c = gpu_case(DType::bf16);
  c.head_dim_qk = 128;
  c.fill = Fill::aligned;  // q . k = 128 +- about 5: scaled to 1.5 cap +- 0.06 cap
  c.lens = prefill_lens(rng, 3, 1, 2000, 300);
  c.variant = kvattn::variants::causal().with_soft_cap(cap).with_sm_scale(sign * 1.5f * cap / 128.0f);
  c.tanh_approx_error = kTanhApproxMeasured;
  return c;
}

TEST(GpuPrefill, SoftCapShiftAtTheEdgesOfItsRange) {
  SKIP_WITHOUT_GPU();
  for (const char* form : {static_cast<const char*>(nullptr), "exact"}) {
    ScopedOverride tanh_form("KVATTN_PREFILL_TANH", form);
    SCOPED_TRACE(form ? "exact tanh" : "default tanh");
    for (float cap : {54.7f, 54.8f})
      for (float sign : {-1.0f, 1.0f})
        for (KVStore store : {KVStore::ragged, KVStore::paged}) {
          KVATTN_CASE_RNG(rng);
          AttnCase c = soft_cap_edge_case(rng, cap, sign);
          c.store = store;
          if (store == KVStore::paged) c.scheduler.fixed_split_size = 256;  // partial states and the merge
          SCOPED_TRACE(c.variant.describe());
          run_prefill_case(c, rng);
        }
    for (float sign : {-1.0f, 1.0f}) {
      KVATTN_CASE_RNG(rng);
      AttnCase window = soft_cap_edge_case(rng, 50.0f, sign);
      window.variant = window.variant.with_window(300);
      window.store = KVStore::paged;
      SCOPED_TRACE(window.variant.describe());
      run_prefill_case(window, rng);
      AttnCase decode = soft_cap_edge_case(rng, 50.0f, sign);
      decode.lens = prefill_lens(rng, 24, 1, 3000, 1);
      decode.store = KVStore::paged;
      SCOPED_TRACE("decode " + decode.variant.describe());
      run_prefill_case(decode, rng);
    }
  }
}

TEST(GpuPrefill, SplitSchedulesMatch) {
  SKIP_WITHOUT_GPU();
  // The same batch with many small KV chunks (merged), with no splitting, and with few workers;
  // softmax and sigmoid merges, causal and custom masks.
  const kvattn::Variant variants[] = {kvattn::variants::causal(), kvattn::variants::sigmoid(),
                                      kvattn::Variant{}.with_custom_mask(),
                                      kvattn::variants::causal().with_window(300)};
  for (const auto& v : variants)
    for (int mode = 0; mode < 4; ++mode) {
      KVATTN_CASE_RNG(rng);
      AttnCase c = gpu_case(DType::bf16);
      c.lens = {{200, 3000}, {17, 17}, {1, 2500}, {0, 0}, {64, 640}, {1, 1}};
      c.num_qo_heads = 16;
      c.num_kv_heads = 4;
      c.head_dim_qk = 128;
      c.variant = v;
      c.store = mode % 2 ? KVStore::paged : KVStore::ragged;
      if (mode == 0) c.scheduler.fixed_split_size = 128;
      if (mode == 1) c.scheduler.fixed_split_size = 64;
      if (mode == 2) c.scheduler.disable_split_kv = true;
      if (mode == 3) c.scheduler.num_workers = 5;
      SCOPED_TRACE(v.describe());
      run_prefill_case(c, rng);
    }
}

// (qo_len, kv_len) with empty requests, and requests with more queries than keys (FlashInfer takes
// them; under causal the first qo_len - kv_len rows see no key: o = 0, lse = -inf).
TEST(GpuPrefill, EmptyRequestsAndBatches) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> batches = {
      {}, {{0, 0}}, {{0, 0}, {1, 1}, {0, 5}, {0, 0}}, {{1, 1}, {2, 2}, {0, 0}},
      {{0, 7}, {3, 3}, {0, 0}, {16, 16}}, {{2, 4}, {0, 3}}, {{5, 2}, {3, 0}, {17, 16}, {40, 9}},
      {{7, 1}, {2, 5}, {200, 130}, {129, 0}}};
  for (const auto& lens : batches)
    for (KVStore store : kStores)
      for (bool causal : {false, true}) {
        KVATTN_CASE_RNG(rng);
        AttnCase c = gpu_case(DType::bf16);
        c.lens = lens;
        c.variant.causal = causal;
        c.store = store;
        c.page_size = 3;
        run_prefill_case(c, rng);
      }
}

TEST(GpuPrefill, StridedQueriesOutputsAndNoLse) {
  SKIP_WITHOUT_GPU();
  for (KVStore store : kStores)
    for (bool want_lse : {false, true}) {
      KVATTN_CASE_RNG(rng);
      AttnCase c = gpu_case(DType::bf16);
      c.lens = prefill_lens(rng, 3, 1, 100, 100);
      c.strided = true;
      c.kv_aligned_strides = true;
      c.want_lse = want_lse;
      c.variant = kvattn::variants::causal();
      c.store = store;
      if (store == KVStore::ragged) c.strided = false;  // ragged K/V padding is not 16-byte aligned
      run_prefill_case(c, rng);
    }
}

TEST(GpuPrefill, StructuredAndOnesInputs) {
  SKIP_WITHOUT_GPU();
  for (Fill fill : {Fill::structured, Fill::ones})
    for (KVStore store : kStores) {
      KVATTN_CASE_RNG(rng);
      AttnCase c = gpu_case(DType::bf16, store == KVStore::ragged ? DType::e4m3 : DType::bf16);
      c.lens = prefill_lens(rng, 3, 1, 200, 100);
      c.variant = kvattn::variants::causal();
      c.store = store;
      c.layout = KVLayout::HND;
      c.fill = fill;
      run_prefill_case(c, rng);
    }
}

TEST(GpuPrefill, MisalignedKVIsAnError) {
  SKIP_WITHOUT_GPU();
  KVATTN_CASE_RNG(rng);
  AttnCase c = gpu_case(DType::bf16);
  c.lens = {{5, 20}};
  c.store = KVStore::paged;
  c.strided = true;  // pads K/V rows by 1..3 elements: not 16-byte multiples
  c.expect_error = "the GPU prefill kernels copy 16-byte pieces of each row";
  run_prefill_case(c, rng);
}

// A workspace too small for a split plan's partial states (FlashInfer's tests give a cascade 32 MiB
// for all its levels) gets the unsplit plan, and the same attention; decode as well.
TEST(GpuPrefill, SmallWorkspaceGetsTheUnsplitPlan) {
  SKIP_WITHOUT_GPU();
#if KVATTN_WITH_CUDA
  HostTensor tq = int32_tensor({0, 128}), tk = int32_tensor({0, 16384});
  kvattn::BatchPrefillPlan p;
  p.num_qo_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim_qk = 128;
  p.q_dtype = DType::bf16;
  p.qo_indptr = tq.view();
  p.kv_indptr = tk.view();
  DeviceBytes big(int64_t(256) << 20), small(int64_t(2) << 20);
  kvattn::BatchPrefill split(big.view()), unsplit(small.view());
  split.plan(p);
  ASSERT_GT(split.schedule()->num_merges(), 0) << "the case no longer splits: pick a longer one";
  unsplit.plan(p);
  EXPECT_EQ(unsplit.schedule()->num_merges(), 0);
  for (bool causal : {false, true}) {
    KVATTN_CASE_RNG(rng);
    AttnCase c = gpu_case(DType::bf16);
    c.lens = {{128, 16384}};
    c.num_qo_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim_qk = 128;
    c.variant.causal = causal;
    c.store = KVStore::ragged;
    c.workspace_bytes = int64_t(2) << 20;
    run_prefill_case(c, rng);
  }
#endif
}

// A plan() that fails (a batch too big for the workspace) changes nothing: schedule() still
// shows the plan that run() uses.
TEST(GpuPrefill, FailedPlanLeavesTheLastGoodSchedule) {
  SKIP_WITHOUT_GPU();
#if KVATTN_WITH_CUDA
  auto indptr = [](int requests, int each) {
    std::vector<int32_t> v{0};
    for (int b = 0; b < requests; ++b) v.push_back(v.back() + each);
    return int32_tensor(v);
  };
  HostTensor qo_small = indptr(2, 100), kv_small = indptr(2, 300), qo_big = indptr(4096, 64), kv_big = indptr(4096, 64);
  kvattn::BatchPrefillPlan p;
  p.num_qo_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim_qk = 128;
  p.q_dtype = DType::bf16;
  p.qo_indptr = qo_small.view();
  p.kv_indptr = kv_small.view();
  DeviceBytes ws(1 << 20);
  kvattn::BatchPrefill op(ws.view());
  op.plan(p);
  ASSERT_NE(op.schedule(), nullptr);
  const int64_t items = op.schedule()->num_items();
  EXPECT_EQ(op.schedule()->batch_size(), 2);
  // 4096 requests x 8 KV heads of 32-byte work items (1 MiB) and their indptrs do not fit 1 MiB.
  p.qo_indptr = qo_big.view();
  p.kv_indptr = kv_big.view();
  EXPECT_KVATTN_ERROR(op.plan(p), "the workspace is too small");
  EXPECT_EQ(op.schedule()->batch_size(), 2);
  EXPECT_EQ(op.schedule()->num_items(), items);
#endif
}

#if KVATTN_WITH_CUDA
// The kernel feature bits of a built-in variant without RoPE (kernels/variants/params.cuh).
uint32_t feature_bits(const kvattn::Variant& v) {
  using namespace kvattn::kernels;
  return (v.causal ? kCausal : 0u) | (v.window_left >= 0 ? kSlidingWindow : 0u) |
         (v.logits_soft_cap > 0.0f ? kSoftCap : 0u) | (v.alibi ? kAlibi : 0u) | (v.custom_mask ? kCustomMask : 0u) |
         (v.sigmoid ? kSigmoid : 0u);
}
#endif

// The Hopper tier (kernels/prefill/prefill_wgmma_kernel.cuh) on an sm_90a device, and the mma.sync
// tier on the same problems (KVATTN_PREFILL_TIER=mma_sync), both against the float64 reference:
// query runs long enough for the tier (>= 64 packed rows) that end inside a tile, every variant it
// takes, ragged and paged KV (pages 1, 5, 16, NHD and HND, device page ids), GQA groups 1 to 8,
// head dims 64, 128, 192 x 128, 64 x 128 and 256, f16 and bf16, negative sm_scale; each problem
// run twice on one plan, with bitwise identical outputs.
TEST(GpuPrefill, HopperTierAgainstTheReference) {
  SKIP_WITHOUT_GPU();
#if KVATTN_WITH_CUDA
  const kvattn::cuda::DeviceLimits limits = kvattn::cuda::limits_of(kvattn::cuda::device_info(0));
  if (!limits.has_wgmma()) GTEST_SKIP() << "the Hopper tier needs an sm_90a device (compute capability 9.0)";
  struct Shape {
    int dqk, dvo, hq, hkv;
  };
  const Shape shapes[] = {{128, 128, 4, 1}, {64, 64, 8, 8}, {256, 256, 2, 2}, {192, 128, 4, 2}, {64, 128, 8, 1}};
  const kvattn::Variant variants[] = {
      kvattn::variants::plain(),
      kvattn::variants::causal(),
      kvattn::variants::sliding_window(100),
      kvattn::variants::causal().with_soft_cap(30.0f),
      kvattn::variants::causal().with_alibi(),
      kvattn::variants::causal().with_custom_mask(),
      kvattn::variants::causal().with_sigmoid(0.5f),
      kvattn::Variant{}.with_sm_scale(-0.1f).with_scales(1.5f, 0.5f, 2.0f),
  };
  int wgmma_cases = 0;
  for (const char* tier : {"wgmma", "mma_sync"}) {
    ScopedOverride force("KVATTN_PREFILL_TIER", tier);
    for (size_t i = 0; i < std::size(shapes); ++i)
      for (size_t v = 0; v < std::size(variants); ++v) {
        if ((i + v) % 2 && std::string(tier) == "mma_sync") continue;  // the fallback on half of them
        KVATTN_CASE_RNG(rng);
        const Shape& sh = shapes[i];
        AttnCase c = gpu_case((i + v) % 3 ? DType::bf16 : DType::f16);
        c.num_qo_heads = sh.hq;
        c.num_kv_heads = sh.hkv;
        c.head_dim_qk = sh.dqk;
        c.head_dim_vo = sh.dvo;
        c.lens = {{rng.integer(200, 420), rng.integer(420, 700)}, {rng.integer(64, 130), rng.integer(130, 300)}};
        c.variant = variants[v];
        c.store = kStores[(i + v) % 3];
        if (c.store == KVStore::paged_combined && sh.dqk != sh.dvo) c.store = KVStore::paged;  // one K/V tensor
        constexpr int kPageSizes[] = {1, 5, 16};
        c.page_size = kPageSizes[v % 3];
        c.layout = (i + v) % 2 ? KVLayout::HND : KVLayout::NHD;
        c.device_page_table = c.store != KVStore::ragged && v % 2 == 1;
        c.runs = 2;
        const auto chosen = prefill_choice(c.q_dtype, c.kv(), c.out(), sh.dqk, sh.dvo, sh.hq / sh.hkv,
                                           c.store != KVStore::ragged, c.page_size, feature_bits(c.variant), 420, limits,
                                           false, c.variant.logits_soft_cap);
        EXPECT_EQ(chosen.tier == kvattn::detail::PrefillTier::wgmma, std::string(tier) == "wgmma") << chosen.name();
        wgmma_cases += chosen.tier == kvattn::detail::PrefillTier::wgmma;
        SCOPED_TRACE(std::string(tier) + " " + chosen.name() + " " + c.variant.describe());
        run_prefill_case(c, rng);
      }
  }
  EXPECT_EQ(wgmma_cases, int(std::size(shapes) * std::size(variants)));
#endif
}

// BatchPrefill::kernel_name() names the kernel plan() chose: the Hopper tier for a long run on an
// sm_90a device (the mma.sync tier with KVATTN_PREFILL_TIER=mma_sync, and for a short run).
TEST(GpuPrefill, KernelNameNamesTheTier) {
  SKIP_WITHOUT_GPU();
#if KVATTN_WITH_CUDA
  const bool hopper = kvattn::cuda::limits_of(kvattn::cuda::device_info(0)).has_wgmma();
  DeviceBytes ws(int64_t(16) << 20);
  kvattn::BatchPrefill op(ws.view());
  EXPECT_EQ(op.kernel_name(), "");
  auto plan_for = [&](int32_t qo) {
    HostTensor tq = int32_tensor({0, qo}), tk = int32_tensor({0, 1024});
    kvattn::BatchPrefillPlan p;
    p.num_qo_heads = 8;
    p.num_kv_heads = 8;
    p.head_dim_qk = 128;
    p.q_dtype = DType::bf16;
    p.variant = kvattn::variants::causal();
    p.qo_indptr = tq.view();
    p.kv_indptr = tk.view();
    op.plan(p);
    return op.kernel_name();
  };
  const std::string long_run = plan_for(512), short_run = plan_for(8);
  EXPECT_EQ(long_run.rfind(hopper ? "prefill_wgmma_bf16_hd128" : "prefill_bf16_hd128", 0), 0u) << long_run;
  EXPECT_EQ(short_run.rfind("prefill_bf16_hd128", 0), 0u) << short_run;
  ScopedOverride mma("KVATTN_PREFILL_TIER", "mma_sync");
  const std::string forced = plan_for(512);
  EXPECT_EQ(forced.rfind("prefill_bf16_hd128", 0), 0u) << forced;
#endif
}

TEST(GpuPrefill, UnsupportedShapesAreErrors) {
  SKIP_WITHOUT_GPU();
#if KVATTN_WITH_CUDA
  HostTensor qo = int32_tensor({0, 3}), kv = int32_tensor({0, 5});
  kvattn::BatchPrefillPlan p;
  p.num_qo_heads = 4;
  p.num_kv_heads = 1;
  p.head_dim_qk = 128;
  p.q_dtype = DType::bf16;
  p.qo_indptr = qo.view();
  p.kv_indptr = kv.view();
  DeviceBytes ws(1 << 20), tiny(16);
  kvattn::BatchPrefill op(ws.view());
  op.plan(p);  // fine
  p.head_dim_qk = 512;
  EXPECT_KVATTN_ERROR(op.plan(p), "head dim 512 is not supported by the GPU prefill kernels");
  p.head_dim_qk = 128;
  p.q_dtype = DType::f32;
  EXPECT_KVATTN_ERROR(op.plan(p), "q_dtype f32 is not supported by the GPU prefill kernels");
  p.q_dtype = DType::f16;
  p.kv_dtype = DType::bf16;
  EXPECT_KVATTN_ERROR(op.plan(p), "kv_dtype bf16 is not supported by the GPU prefill kernels");
  p.kv_dtype.reset();
  kvattn::BatchPrefill small(tiny.view());
  EXPECT_KVATTN_ERROR(small.plan(p), "the workspace is too small");
  // Planned for the CPU, run with CUDA tensors.
  HostTensor q(DType::f16, {3, 4, 128}), k(DType::f16, {5, 1, 128}), v(DType::f16, {5, 1, 128}),
      out(DType::f16, {3, 4, 128});
  DeviceMirror dq(q), dk(k), dv(v), dout(out);
  kvattn::BatchPrefill cpu_planned;
  cpu_planned.plan(p);
  EXPECT_KVATTN_ERROR(cpu_planned.run(dq.view(), dk.view(), dv.view(), dout.view()),
                      "BatchPrefill was planned for the CPU");
#endif
}

TEST(GpuPrefill, GraphCaptureOnceReplanAndReplay) {
  SKIP_WITHOUT_GPU();
#if KVATTN_WITH_CUDA
  // Ragged KV, causal: round 0 plans the full capacity and is captured; later rounds re-plan new
  // batches (sizes and lengths within the capacity) and replay the graph.
  KVATTN_CASE_RNG(rng);
  const int max_batch = 4, hq = 8, hkv = 2, D = 64;
  const int64_t max_q = 256, max_kv = 2048;
  HostTensor q(DType::bf16, {max_q, hq, D}), k(DType::bf16, {max_kv, hkv, D}), v(DType::bf16, {max_kv, hkv, D}),
      out(DType::bf16, {max_q, hq, D}), lse(DType::f32, {max_q, hq});
  for (HostTensor* t : {&q, &k, &v}) t->poison();
  DeviceMirror dq(q), dk(k), dv(v), dout(out), dlse(lse);
  DeviceBytes ws(int64_t(64) << 20);
  kvattn::BatchPrefill op(ws.view());
  kvattn::BatchPrefillPlan p;
  p.num_qo_heads = hq;
  p.num_kv_heads = hkv;
  p.head_dim_qk = D;
  p.variant = kvattn::variants::causal();
  p.scheduler.cuda_graph = kvattn::GraphCapacity{max_batch, max_q};
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  auto upload = [&](const HostTensor& h, const DeviceMirror& d, int64_t bytes) {
    ASSERT_EQ(cudaMemcpy(const_cast<void*>(d.view().data()), h.view().data(), size_t(bytes), cudaMemcpyHostToDevice),
              cudaSuccess);
  };
  cudaGraphExec_t exec = nullptr;
  for (int round = 0; round < 12; ++round) {
    const int B = round == 0 ? max_batch : int(rng.integer(1, max_batch));
    std::vector<int32_t> qo_indptr{0}, kv_indptr{0};
    for (int b = 0; b < B; ++b) {
      const int64_t kv = round == 0 ? max_kv / max_batch : rng.integer(1, max_kv / max_batch);
      const int64_t qo = round == 0 ? max_q / max_batch : rng.integer(1, std::min<int64_t>(kv, max_q / max_batch));
      qo_indptr.push_back(qo_indptr.back() + int32_t(qo));
      kv_indptr.push_back(kv_indptr.back() + int32_t(kv));
    }
    const int64_t nq = qo_indptr.back(), nkv = kv_indptr.back();
    std::vector<double> qd(size_t(nq * hq * D)), kd(size_t(nkv * hkv * D)), vd(size_t(nkv * hkv * D));
    for (size_t i = 0; i < qd.size(); ++i) { q.set_at(int64_t(i), rng.normal()); qd[i] = q.get_at(int64_t(i)); }
    for (size_t i = 0; i < kd.size(); ++i) { k.set_at(int64_t(i), rng.normal()); kd[i] = k.get_at(int64_t(i)); }
    for (size_t i = 0; i < vd.size(); ++i) { v.set_at(int64_t(i), rng.uniform(-1, 1)); vd[i] = v.get_at(int64_t(i)); }
    upload(q, dq, nq * hq * D * 2);
    upload(k, dk, nkv * hkv * D * 2);
    upload(v, dv, nkv * hkv * D * 2);
    out.poison();
    lse.poison();
    upload(out, dout, max_q * hq * D * 2);
    upload(lse, dlse, max_q * hq * 4);
    HostTensor tq = int32_tensor(qo_indptr), tk = int32_tensor(kv_indptr);
    p.qo_indptr = tq.view();
    p.kv_indptr = tk.view();
    op.plan(p, stream);
    // Views of the capacity-sized buffers with this round's row counts.
    auto rows = [](const kvattn::TensorView& t, int64_t n) {
      std::vector<int64_t> shape(t.shape(), t.shape() + t.ndim()), strides(t.strides(), t.strides() + t.ndim());
      shape[0] = n;
      return kvattn::TensorView(t.data(), t.dtype(), t.ndim(), shape.data(), strides.data(), t.device());
    };
    if (round == 0) {
      cudaGraph_t graph;
      ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
      op.run(rows(dq.view(), nq), rows(dk.view(), nkv), rows(dv.view(), nkv), rows(dout.view(), nq),
             rows(dlse.view(), nq), stream);
      ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      cudaGraphDestroy(graph);
    }
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    dout.copy_back(out);
    dlse.copy_back(lse);

    HostTensor out_b(DType::bf16, {nq, hq, D}), lse_b(DType::f32, {nq, hq});
    out_b.poison();  // the checks count non-poison bytes outside the view as stray writes
    lse_b.poison();
    std::vector<double> o_ref, mag, lse_ref;
    for (int b = 0; b < B; ++b) {
      const int64_t qo = qo_indptr[size_t(b + 1)] - qo_indptr[size_t(b)];
      const int64_t kv = kv_indptr[size_t(b + 1)] - kv_indptr[size_t(b)];
      ref::Request r{qo, kv, hq, hkv, D, D, qd.data() + size_t(qo_indptr[size_t(b)]) * hq * D,
                     kd.data() + size_t(kv_indptr[size_t(b)]) * hkv * D,
                     vd.data() + size_t(kv_indptr[size_t(b)]) * hkv * D, kv - qo, {}};
      auto res = ref::attention(r, p.variant);
      o_ref.insert(o_ref.end(), res.o.begin(), res.o.end());
      mag.insert(mag.end(), res.o_mag.begin(), res.o_mag.end());
      lse_ref.insert(lse_ref.end(), res.lse.begin(), res.lse.end());
    }
    for (int64_t i = 0; i < nq * hq * D; ++i) out_b.set_at(i, out.get_at(i));
    for (int64_t i = 0; i < nq * hq; ++i) lse_b.set_at(i, lse.get_at(i));
    ComputeTolerance tol;
    tol.accumulation = 0x1p-8;
    if (approx_tanh_may_run(true)) tol = allow_approx_tanh(tol, p.variant);
    SCOPED_TRACE("round " + std::to_string(round) + ", batch " + std::to_string(B));
    EXPECT_TRUE(outputs_match(out_b, o_ref, mag, tol));
    EXPECT_TRUE(lse_match(lse_b, lse_ref, tol));
    for (int64_t i = nq * hq * D; i < max_q * hq * D; ++i)
      ASSERT_TRUE(out.is_poison_at(i)) << "row past the batch written at element " << i;
  }
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(stream);
#endif
}

}  // namespace
}  // namespace kvattn_test
