// Every plan()-time validation error of the attention wrappers (src/api/attention.cpp,
// attention_plan.cpp, validate.cpp, variant.cpp, formats.cpp), each checked by its message, and
// that a failed plan() leaves the previous plan in place. Run-time errors:
// validation_run_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "core/validate.h"
#include "kvattn/attention.h"
#include "support/expect_error.h"
#include "support/host_tensor.h"
#include "support/paged_kv.h"

namespace kvattn_test {
namespace {

using kvattn::DType;
using kvattn::TensorView;
constexpr float kInf = std::numeric_limits<float>::infinity();

kvattn::AttentionShape base_shape() {
  kvattn::AttentionShape s;
  s.num_qo_heads = 8;
  s.num_kv_heads = 2;
  s.head_dim_qk = 32;
  s.q_dtype = DType::f16;
  return s;
}

// A valid decode plan over two requests (lengths 5 and 17 at page size 16); tests break one field.
struct DecodeSetup {
  HostTensor indptr = int32_tensor({0, 1, 3});
  HostTensor indices = int32_tensor({2, 0, 1});
  HostTensor last = int32_tensor({5, 1});
  kvattn::BatchDecodePlan plan() const {
    kvattn::BatchDecodePlan p;
    static_cast<kvattn::AttentionShape&>(p) = base_shape();
    p.page_table = {indptr.view(), indices.view(), last.view()};
    p.page_size = 16;
    return p;
  }
};

TEST(ValidationPlan, Shape) {
  DecodeSetup d;
  kvattn::BatchDecode op;
  auto expect = [&](auto edit, const char* msg) {
    auto p = d.plan();
    edit(static_cast<kvattn::AttentionShape&>(p));
    EXPECT_KVATTN_ERROR(op.plan(p), msg);
  };
  using S = kvattn::AttentionShape;
  expect([](S& s) { s.num_qo_heads = 0; }, "num_qo_heads = 0 must be >= 1");
  expect([](S& s) { s.num_kv_heads = 0; }, "num_kv_heads = 0 must be >= 1");
  expect([](S& s) { s.num_qo_heads = 6; s.num_kv_heads = 4; },
         "num_qo_heads = 6 is not a multiple of num_kv_heads = 4");
  expect([](S& s) { s.head_dim_qk = 12; }, "head_dim_qk = 12 is not supported (a multiple of 8 from 8 to 512)");
  expect([](S& s) { s.head_dim_qk = 520; }, "head_dim_qk = 520 is not supported");
  expect([](S& s) { s.head_dim_qk = 0; }, "head_dim_qk = 0 is not supported");
  expect([](S& s) { s.head_dim_vo = 4; }, "head_dim_vo = 4 is not supported (a multiple of 8 from 8 to 512)");
  expect([](S& s) { s.q_dtype = DType::e4m3; }, "q_dtype = e4m3 is not supported (f32, f16 or bf16)");
  expect([](S& s) { s.kv_dtype = DType::i32; },
         "kv_dtype = i32 is not supported (f32, f16, bf16, e4m3 or e5m2)");
  expect([](S& s) { s.o_dtype = DType::e5m2; }, "o_dtype = e5m2 is not supported (f32, f16 or bf16)");
}

// kernel_family() and kernel_name(): empty before plan(), "cpu" for a CPU plan; a failed plan keeps
// the last one's (GPU names: GpuPrefill.KernelNameNamesTheTier).
TEST(ValidationPlan, KernelFamilyAndNameOnTheCpu) {
  DecodeSetup d;
  kvattn::BatchDecode op;
  EXPECT_EQ(op.kernel_family(), "");
  EXPECT_EQ(op.kernel_name(), "");
  op.plan(d.plan());
  EXPECT_EQ(op.kernel_family(), "cpu");
  EXPECT_EQ(op.kernel_name(), "cpu");
  auto bad = d.plan();
  bad.num_kv_heads = 0;
  EXPECT_KVATTN_ERROR(op.plan(bad), "num_kv_heads = 0 must be >= 1");
  EXPECT_EQ(op.kernel_family(), "cpu");
  EXPECT_EQ(op.kernel_name(), "cpu");
  HostTensor qo = int32_tensor({0, 3}), kv = int32_tensor({0, 5});
  kvattn::BatchPrefillPlan p;
  p.num_qo_heads = 4;
  p.num_kv_heads = 1;
  p.head_dim_qk = 64;
  p.qo_indptr = qo.view();
  p.kv_indptr = kv.view();
  kvattn::BatchPrefill prefill;
  EXPECT_EQ(prefill.kernel_name(), "");
  prefill.plan(p);
  EXPECT_EQ(prefill.kernel_name(), "cpu");
}

TEST(ValidationPlan, Variant) {
  DecodeSetup d;
  kvattn::BatchDecode op;
  auto expect = [&](kvattn::Variant v, const char* msg) {
    auto p = d.plan();
    p.variant = v;
    EXPECT_KVATTN_ERROR(op.plan(p), msg);
  };
  kvattn::Variant v;
  expect(v.with_window(-2), "variant.window_left = -2 is invalid (>= 0, or -1 for no sliding window)");
  expect(v.with_soft_cap(-1), "variant.logits_soft_cap = -1 is invalid (> 0, or 0 for off)");
  expect(v.with_soft_cap(kInf), "variant.logits_soft_cap = inf is invalid");
  expect(v.with_sm_scale(kInf), "variant.sm_scale = inf is not finite");
  expect(v.with_scales(1, kInf, 1), "variant scales must be finite: q_scale = 1, k_scale = inf, v_scale = 1");
  expect(v.with_scales(1, 1, -kInf), "v_scale = -inf");
  expect(v.with_sigmoid(kInf), "variant.sigmoid_bias = inf is not finite");
  kvattn::RopeConfig r;
  r.rope_theta = 0;
  expect(v.with_rope(r), "variant.rope.rope_theta = 0 must be > 0");
  r.rope_theta = 1e4f;
  r.rope_scale = -1;
  expect(v.with_rope(r), "variant.rope.rope_scale = -1 must be > 0");
  expect(kvattn::variants::custom_mask(), "the variant has custom_mask on but no custom_mask was given");
}

TEST(ValidationPlan, PageTable) {
  DecodeSetup d;
  kvattn::BatchDecode op;
  auto expect = [&](const HostTensor* indptr, const HostTensor* indices, const HostTensor* last,
                    int page_size, const char* msg) {
    auto p = d.plan();
    if (indptr) p.page_table.indptr = indptr->view();
    if (indices) p.page_table.indices = indices->view();
    if (last) p.page_table.last_page_len = last->view();
    p.page_size = page_size;
    EXPECT_KVATTN_ERROR(op.plan(p), msg);
  };
  expect(nullptr, nullptr, nullptr, 0, "page_size = 0 must be >= 1");
  {
    auto p = d.plan();
    p.page_table.indptr = TensorView{};
    EXPECT_KVATTN_ERROR(op.plan(p), "kv_indptr is required but was not given");
  }
  HostTensor two_d(DType::i32, {2, 2});
  expect(&two_d, nullptr, nullptr, 16, "kv_indptr must be 1-D, got i32[2, 2] on cpu");
  HostTensor f32_ind(DType::f32, {3});
  expect(&f32_ind, nullptr, nullptr, 16, "kv_indptr has dtype f32 but i32 is expected");
  HostTensor empty(DType::i32, {0});
  expect(&empty, nullptr, nullptr, 16, "kv_indptr must have at least one element (batch_size + 1)");
  HostTensor start1 = int32_tensor({1, 1, 3});
  expect(&start1, nullptr, nullptr, 16, "kv_indptr[0] = 1 but an indptr starts at 0");
  HostTensor decreasing = int32_tensor({0, 3, 2});
  expect(&decreasing, nullptr, nullptr, 16,
         "kv_indptr is not non-decreasing at 2: kv_indptr[1] = 3, kv_indptr[2] = 2");
  {
    auto p = d.plan();
    int32_t vals[6] = {0, 9, 1, 9, 3, 9};
    p.page_table.indptr = TensorView(vals, DType::i32, {3}, {2});
    EXPECT_KVATTN_ERROR(op.plan(p), "kv_indptr must be contiguous, got i32[3] strides (2) on cpu");
    p.page_table.indptr = TensorView(nullptr, DType::i32, {3});
    EXPECT_KVATTN_ERROR(op.plan(p), "kv_indptr has a null data pointer");
    p.page_table.indptr = TensorView(vals, DType::i32, {3}, kvattn::Device::cuda(0));
    EXPECT_KVATTN_ERROR(op.plan(p), "kv_indptr must be on the host (cpu), got cuda:0");
  }
  HostTensor u8_indices(DType::u8, {3});
  expect(nullptr, &u8_indices, nullptr, 16, "kv_indices has dtype u8 but i32 is expected");
  HostTensor short_last = int32_tensor({5});
  expect(nullptr, nullptr, &short_last, 16, "kv_indptr has 3 elements (batch_size 2) but kv_last_page_len has 1 (batch_size 1)");
  HostTensor short_indices = int32_tensor({2, 0});
  expect(nullptr, &short_indices, nullptr, 16, "kv_indptr[2] = 3 exceeds the length of kv_indices (2)");
  HostTensor last0 = int32_tensor({5, 0});
  expect(nullptr, nullptr, &last0, 16, "kv_last_page_len[1] = 0 is out of range [1, 16]");
  HostTensor last17 = int32_tensor({17, 1});
  expect(nullptr, nullptr, &last17, 16, "kv_last_page_len[0] = 17 is out of range [1, 16]");
  HostTensor no_pages = int32_tensor({0, 0, 3});
  HostTensor last_neg = int32_tensor({-1, 1});
  expect(&no_pages, nullptr, &last_neg, 16,
         "kv_last_page_len[0] = -1 is out of range [0, 16] (request has no pages)");
  HostTensor negative = int32_tensor({2, -1, 1});
  expect(nullptr, &negative, nullptr, 16, "kv_indices[1] = -1 is negative");
}

// The page-id scan of plan(): the smallest and largest id and the largest's first position, in
// blocks (core/validate.cpp), against a plain loop, with the maximum repeated across blocks.
TEST(ValidationPlan, IdRangeMatchesAPlainScan) {
  kvattn_test::Rng rng(11);
  for (int64_t n : {0, 1, 5, 1023, 1024, 1025, 4096, 70001}) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (auto& id : ids) id = int32_t(rng.integer(0, 5000));
    if (n > 2000) ids[1500] = ids[n - 1] = 9000;  // one maximum in two blocks: the first counts
    if (n > 3000 && n % 2 == 1) ids[2222] = -3;
    int32_t lo = 0, hi = -1;
    int64_t pos = -1;
    for (size_t i = 0; i < ids.size(); ++i) {
      lo = std::min(lo, ids[i]);
      if (ids[i] > hi) hi = ids[i], pos = int64_t(i);
    }
    const auto r = kvattn::validate::id_range(ids);
    EXPECT_EQ(r.min, lo) << n;
    EXPECT_EQ(r.max, hi) << n;
    EXPECT_EQ(r.max_pos, pos) << n;
  }
}

TEST(ValidationPlan, Prefill) {
  DecodeSetup d;
  HostTensor qo = int32_tensor({0, 2, 5}), kv = int32_tensor({0, 4, 9});
  kvattn::BatchPrefillPlan base;
  static_cast<kvattn::AttentionShape&>(base) = base_shape();
  base.qo_indptr = qo.view();
  base.kv_indptr = kv.view();
  kvattn::BatchPrefill op;
  EXPECT_NO_THROW(op.plan(base));
  auto p = base;
  p.page_table = d.plan().page_table;
  p.page_size = 16;
  EXPECT_KVATTN_ERROR(op.plan(p), "give either kv_indptr (ragged KV) or page_table (paged KV), not both");
  p.kv_indptr = TensorView{};
  EXPECT_NO_THROW(op.plan(p));  // paged, with qo lengths 2 and 3 against kv lengths 5 and 17
  p = base;
  p.kv_indptr = TensorView{};
  EXPECT_KVATTN_ERROR(op.plan(p), "BatchPrefill needs kv_indptr (ragged KV) or page_table (paged KV)");
  HostTensor qo_short = int32_tensor({0, 2});
  p = base;
  p.qo_indptr = qo_short.view();
  EXPECT_KVATTN_ERROR(op.plan(p), "qo_indptr has 2 elements (batch_size 1) but kv_indptr describes batch_size 2");
  HostTensor qo5 = int32_tensor({0, 3, 6, 9, 8}), kv5 = int32_tensor({0, 3, 6, 9, 9});
  p.qo_indptr = qo5.view();
  p.kv_indptr = kv5.view();
  EXPECT_KVATTN_ERROR(op.plan(p), "qo_indptr is not non-decreasing at 4: qo_indptr[3] = 9, qo_indptr[4] = 8");
  p = base;
  p.qo_indptr = TensorView{};
  EXPECT_KVATTN_ERROR(op.plan(p), "qo_indptr is required but was not given");
  HostTensor kv_bad = int32_tensor({0, 5, 4});
  p = base;
  p.kv_indptr = kv_bad.view();
  EXPECT_KVATTN_ERROR(op.plan(p), "kv_indptr is not non-decreasing at 2: kv_indptr[1] = 5, kv_indptr[2] = 4");
}

// In CUDA-graph mode a captured run() replays the kernels and values it captured: a re-plan may
// change the batch but not the shape or the variant's values (check_graph_replan; the same on the
// CPU backend). Each refused re-plan keeps the previous plan, and a plan outside graph mode is free.
TEST(ValidationPlan, GraphModeReplanKeepsShapeAndVariant) {
  DecodeSetup d;
  kvattn::BatchDecodePlan base = d.plan();
  base.variant = kvattn::variants::soft_cap(30.0f).with_sm_scale(0.125f);
  base.scheduler.cuda_graph = kvattn::GraphCapacity{4, 64};
  kvattn::BatchDecode op;
  ASSERT_NO_THROW(op.plan(base));
  HostTensor indptr1 = int32_tensor({0, 3}), last1 = int32_tensor({7});
  auto other_batch = base;  // one request of 39 tokens: allowed
  other_batch.page_table = {indptr1.view(), d.indices.view(), last1.view()};
  EXPECT_NO_THROW(op.plan(other_batch));
  auto expect = [&](auto edit, const char* msg) {
    auto p = base;
    edit(p);
    EXPECT_KVATTN_ERROR(op.plan(p), msg);
  };
  using P = kvattn::BatchDecodePlan;
  expect([](P& p) { p.variant = p.variant.with_sm_scale(0.25f); },
         "BatchDecode in CUDA-graph mode cannot change sm_scale (with q_scale and k_scale folded in) (was 0.125, "
         "now 0.25) between plans (a captured run() replays what it captured; plan on a new object to change it)");
  expect([](P& p) { p.variant.k_scale = 2.0f; }, "cannot change sm_scale (with q_scale and k_scale folded in) (was 0.125, now 0.25)");
  expect([](P& p) { p.variant.logits_soft_cap = 50.0f; }, "cannot change logits_soft_cap (was 30, now 50)");
  expect([](P& p) { p.variant.v_scale = 0.5f; }, "cannot change v_scale (was 1, now 0.5)");
  expect([](P& p) { p.variant = p.variant.with_window(64); },
         "BatchDecode in CUDA-graph mode cannot change the variant (was soft_cap(30)+sm_scale(0.125), now "
         "window(64)+soft_cap(30)+sm_scale(0.125))");
  expect([](P& p) { p.num_qo_heads = 4; }, "cannot change num_qo_heads (was 8, now 4)");
  expect([](P& p) { p.head_dim_qk = 64; }, "cannot change head_dim_qk (was 32, now 64)");
  expect([](P& p) { p.o_dtype = DType::f32; }, "cannot change o_dtype (was f16, now f32)");
  expect([](P& p) { p.page_size = 8; }, "cannot change page_size (was 16, now 8)");
  expect([](P& p) { p.scheduler.cuda_graph->max_tokens = 128; }, "cannot change cuda_graph.max_tokens (was 64, now 128)");
  expect([](P& p) { p.scheduler.num_workers = 3; }, "cannot change num_workers (was 0, now 3)");
  // A value the variant does not read may change (sigmoid's bias without sigmoid).
  auto unread = base;
  unread.variant.sigmoid_bias = 2.0f;
  EXPECT_NO_THROW(op.plan(unread));
  EXPECT_NO_THROW(op.plan(base));  // the refused plans left the graph-mode plan in place
  auto eager = base;  // leaving graph mode frees the values
  eager.scheduler.cuda_graph.reset();
  eager.variant = eager.variant.with_sm_scale(0.25f);
  EXPECT_NO_THROW(op.plan(eager));
  // BatchPrefill (and BlockSparseAttention) check the same.
  HostTensor qo = int32_tensor({0, 2, 5}), kv = int32_tensor({0, 4, 9});
  kvattn::BatchPrefillPlan prefill;
  static_cast<kvattn::AttentionShape&>(prefill) = base_shape();
  prefill.qo_indptr = qo.view();
  prefill.kv_indptr = kv.view();
  prefill.variant = kvattn::variants::causal();
  prefill.scheduler.cuda_graph = kvattn::GraphCapacity{4, 64};
  kvattn::BatchPrefill pre;
  ASSERT_NO_THROW(pre.plan(prefill));
  prefill.variant = kvattn::variants::causal().with_window(16);
  EXPECT_KVATTN_ERROR(pre.plan(prefill), "BatchPrefill in CUDA-graph mode cannot change the variant (was causal, now causal+window(16))");
  prefill.variant = kvattn::variants::causal();
  prefill.kv_indptr = TensorView{};
  prefill.page_table = d.plan().page_table;
  prefill.page_size = 16;
  EXPECT_KVATTN_ERROR(pre.plan(prefill), "BatchPrefill in CUDA-graph mode cannot change the KV layout (was ragged, now paged)");
  HostTensor bsr_indptr = int32_tensor({0, 2, 3}), bsr_indices = int32_tensor({0, 3, 1});
  kvattn::BlockSparsePlan sparse;
  static_cast<kvattn::AttentionShape&>(sparse) = base_shape();
  sparse.bsr = {bsr_indptr.view(), bsr_indices.view(), 8, 16, 4, 4};
  sparse.scheduler.cuda_graph = kvattn::GraphCapacity{4, 64};
  kvattn::BlockSparseAttention bs;
  ASSERT_NO_THROW(bs.plan(sparse));
  sparse.variant = sparse.variant.with_sm_scale(0.5f);
  EXPECT_KVATTN_ERROR(bs.plan(sparse), "BlockSparseAttention in CUDA-graph mode cannot change sm_scale");
}

TEST(ValidationPlan, CustomMask) {
  // Two requests of qo x kv = 2 x 4 (1 byte) and 3 x 4 (12 bits, 2 bytes).
  HostTensor qo = int32_tensor({0, 2, 5}), kv = int32_tensor({0, 4, 8});
  HostTensor mask(DType::u8, {8}), mask_indptr = int32_tensor({0, 1, 3});
  kvattn::BatchPrefillPlan base;
  static_cast<kvattn::AttentionShape&>(base) = base_shape();
  base.qo_indptr = qo.view();
  base.kv_indptr = kv.view();
  base.custom_mask = mask.view();
  base.mask_indptr = mask_indptr.view();
  base.variant = kvattn::variants::custom_mask();
  kvattn::BatchPrefill op;
  EXPECT_NO_THROW(op.plan(base));
  auto p = base;
  p.variant = {};
  EXPECT_KVATTN_ERROR(op.plan(p), "custom_mask was given but the variant has custom_mask off");
  p = base;
  p.custom_mask = TensorView{};
  EXPECT_KVATTN_ERROR(op.plan(p), "the variant has custom_mask on but no custom_mask was given");
  p = base;
  p.mask_indptr = TensorView{};
  EXPECT_KVATTN_ERROR(op.plan(p), "mask_indptr is required but was not given");
  HostTensor mi_short = int32_tensor({0, 1});
  p.mask_indptr = mi_short.view();
  EXPECT_KVATTN_ERROR(op.plan(p), "mask_indptr has 2 elements but 3 are expected");
  HostTensor mask2d(DType::u8, {2, 4});
  p = base;
  p.custom_mask = mask2d.view();
  EXPECT_KVATTN_ERROR(op.plan(p), "custom_mask must be 1-D, got u8[2, 4] on cpu");
  HostTensor mask_i32(DType::i32, {8});
  p.custom_mask = mask_i32.view();
  EXPECT_KVATTN_ERROR(op.plan(p), "custom_mask has dtype i32 but u8 is expected");
  p.custom_mask = TensorView(mask.base(), DType::u8, {8}, kvattn::Device::cuda(0));
  EXPECT_KVATTN_ERROR(op.plan(p), "custom_mask must be on the host (cpu), got cuda:0");
  p.custom_mask = TensorView(mask.base(), DType::u8, {4}, {2});
  EXPECT_KVATTN_ERROR(op.plan(p), "custom_mask must be contiguous");
  HostTensor mi_past = int32_tensor({0, 1, 9});
  p = base;
  p.mask_indptr = mi_past.view();
  EXPECT_KVATTN_ERROR(op.plan(p), "mask_indptr[2] = 9 exceeds the length of custom_mask (8)");
  HostTensor mi_few = int32_tensor({0, 1, 2});
  p.mask_indptr = mi_few.view();
  EXPECT_KVATTN_ERROR(op.plan(p),
                      "custom_mask of request 1 has 1 bytes (mask_indptr) but qo_len * kv_len = 12 bits need 2");
}

TEST(ValidationPlan, BlockSparse) {
  HostTensor indptr = int32_tensor({0, 2, 3}), indices = int32_tensor({0, 3, 1});
  kvattn::BlockSparsePlan base;
  static_cast<kvattn::AttentionShape&>(base) = base_shape();
  base.bsr = {indptr.view(), indices.view(), 8, 16, 4, 4};
  kvattn::BlockSparseAttention op;
  EXPECT_NO_THROW(op.plan(base));
  auto expect = [&](auto edit, const char* msg) {
    auto p = base;
    edit(p);
    EXPECT_KVATTN_ERROR(op.plan(p), msg);
  };
  using P = kvattn::BlockSparsePlan;
  expect([](P& p) { p.variant = kvattn::variants::custom_mask(); },
         "custom_mask is not supported by BlockSparseAttention; the BSR is the mask");
  expect([](P& p) { p.bsr.R = 0; p.bsr.C = 1; }, "bsr block size R x C = 0 x 1 must be at least 1 x 1");
  expect([](P& p) { p.bsr.C = -2; }, "bsr block size R x C = 4 x -2 must be at least 1 x 1");
  expect([](P& p) { p.bsr.M = 10; }, "bsr M = 10 is not a multiple of R = 4");
  expect([](P& p) { p.bsr.M = -4; }, "bsr M = -4 is out of range [0, ");
  expect([](P& p) { p.bsr.N = 10; }, "bsr N = 10 is not a multiple of C = 4");
  expect([](P& p) { p.bsr.M = 12; }, "bsr indptr has 3 elements but 4 are expected");
  HostTensor past = int32_tensor({0, 2, 5});
  expect([&](P& p) { p.bsr.indptr = past.view(); }, "bsr indptr[2] = 5 exceeds the length of bsr indices (3)");
  HostTensor decreasing = int32_tensor({0, 2, 1});
  expect([&](P& p) { p.bsr.indptr = decreasing.view(); },
         "bsr indptr is not non-decreasing at 2: bsr indptr[1] = 2, bsr indptr[2] = 1");
  HostTensor out_of_range = int32_tensor({0, 7, 1});
  expect([&](P& p) { p.bsr.indices = out_of_range.view(); }, "bsr indices[1] = 7 is out of range [0, 4)");
  HostTensor negative = int32_tensor({0, 3, -1});
  expect([&](P& p) { p.bsr.indices = negative.view(); }, "bsr indices[2] = -1 is out of range [0, 4)");
  HostTensor repeat_ptr = int32_tensor({0, 1, 4}), repeat = int32_tensor({1, 1, 2, 1});
  expect([&](P& p) { p.bsr.indptr = repeat_ptr.view(); p.bsr.indices = repeat.view(); },
         "bsr indices[3] = 1 repeats a column block already listed for block row 1");
  HostTensor f32_indices(DType::f32, {3});
  expect([&](P& p) { p.bsr.indices = f32_indices.view(); }, "bsr indices has dtype f32 but i32 is expected");
}

TEST(ValidationPlan, CacheViews) {
  HostTensor k4(DType::f16, {2, 16, 2, 32}), k3(DType::f16, {2, 16, 64}), kv5(DType::f16, {2, 3, 16, 2, 32});
  EXPECT_KVATTN_ERROR(kvattn::PagedKVCache::split(k3.view(), k4.view(), kvattn::KVLayout::NHD),
                      "paged k must be 4-D (NHD), got f16[2, 16, 64] on cpu");
  EXPECT_KVATTN_ERROR(kvattn::PagedKVCache::split(k4.view(), k3.view(), kvattn::KVLayout::HND),
                      "paged v must be 4-D (HND), got f16[2, 16, 64] on cpu");
  EXPECT_KVATTN_ERROR(kvattn::PagedKVCache::combined(k4.view(), kvattn::KVLayout::NHD),
                      "combined paged kv must be 5-D [pages, 2, page_size, heads, dim], got f16[2, 16, 2, 32]");
  EXPECT_KVATTN_ERROR(kvattn::PagedKVCache::combined(kv5.view(), kvattn::KVLayout::HND),
                      "combined paged kv must be 5-D [pages, 2, heads, page_size, dim], got f16[2, 3, 16, 2, 32]");
}

}  // namespace
}  // namespace kvattn_test
