// Regression tests of the public API's hardening: each defect found by adversarial calls (a view
// with a negative shape, planner arithmetic near 2^31, qo_len > kv_len, BSR sizes past int32,
// aliasing, work before rejection, errors that named the wrong argument) is a kvattn::Error that
// names the argument and the value, before anything is read, allocated or written.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/request_work.h"
#include "kvattn/attention.h"
#include "kvattn/ops.h"
#include "kvattn/plan.h"
#include "support/expect_error.h"
#include "support/host_tensor.h"
#include "support/paged_kv.h"
#include "support/random.h"

namespace kvattn_test {
namespace {

using kvattn::DType;
using kvattn::TensorView;
constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();

// ---- views ---------------------------------------------------------------------------------------
TEST(Hardening, ViewsRejectNegativeAndOverflowingShapes) {
  int32_t storage[4] = {0, 1, 2, 3};
  EXPECT_KVATTN_ERROR(TensorView(storage, DType::i32, {-1}), "shape[0] = -1; sizes must be >= 0");
  EXPECT_KVATTN_ERROR(TensorView(storage, DType::f16, {2, -3, 4}), "shape[1] = -3");
  EXPECT_KVATTN_ERROR(TensorView(storage, DType::f32, {4}, {-1}), "stride[0] = -1");
  const int64_t shape[3] = {int64_t(1) << 31, int64_t(1) << 31, int64_t(1) << 31};
  EXPECT_KVATTN_ERROR(TensorView(storage, DType::f32, 3, shape, nullptr), "more elements than int64 can count");
  const int64_t big_stride[2] = {int64_t(1) << 62, 1};
  const int64_t two_rows[2] = {4, 1};
  EXPECT_KVATTN_ERROR(TensorView(storage, DType::f32, 2, two_rows, big_stride), "spans more bytes than int64");
  // The DLPack path goes through the same constructor.
  const int64_t neg[1] = {-1};
  EXPECT_KVATTN_ERROR(TensorView(storage, DType::i32, 1, neg, nullptr), "sizes must be >= 0");
  // Broadcast strides of 0 are fine for inputs; empty views have no extent.
  EXPECT_EQ(TensorView(storage, DType::i32, {3, 4}, {0, 1}).extent_bytes(), 16);
  EXPECT_EQ(TensorView(storage, DType::i32, {0, 4}).extent_bytes(), 0);
}

// ---- planner arithmetic near 2^31 ----------------------------------------------------------------
// Every visible KV token of every (request, query tile, head) lies in exactly one item.
void expect_exact_cover(const kvattn::Plan& plan, int64_t kv_len) {
  std::vector<std::pair<int32_t, int32_t>> ranges;
  for (int w = 0; w < plan.num_workers(); ++w)
    for (const kvattn::WorkItem& it : plan.worker_items(w)) {
      ASSERT_GE(it.kv_begin, 0);
      ASSERT_LE(it.kv_begin, it.kv_end) << "an item with a negative KV range";
      if (it.kv_head == 0) ranges.emplace_back(it.kv_begin, it.kv_end);
    }
  std::sort(ranges.begin(), ranges.end());
  int64_t next = 0;
  for (auto [b, e] : ranges) {
    EXPECT_EQ(b, next) << "a gap or an overlap at token " << next;
    next = e;
  }
  EXPECT_EQ(next, kv_len);
}

TEST(Hardening, PlannerSplitsNear2To31WithoutOverflow) {
  const int64_t lengths[] = {int64_t(3) << 29, kvattn::kMaxKVLen};
  const int splits[] = {1 << 30, (1 << 30) + 7, 1 << 29};
  for (int64_t L : lengths)
    for (int split : splits) {
      const std::vector<int32_t> qo{0, 1}, kv{int32_t(L)};
      kvattn::PlannerInputs in;
      in.qo_indptr = qo;
      in.kv_len = kv;
      in.num_qo_heads = 8;
      in.num_kv_heads = 2;
      in.head_dim_qk = 128;
      kvattn::SchedulerOptions opt;
      opt.num_workers = 4;
      opt.fixed_split_size = split;
      SCOPED_TRACE("kv_len " + std::to_string(L) + " split " + std::to_string(split));
      const kvattn::Plan plan = kvattn::make_plan(in, opt);
      expect_exact_cover(plan, L);
      // And the planner's own split search.
      opt.fixed_split_size = 0;
      expect_exact_cover(kvattn::make_plan(in, opt), L);
    }
}

TEST(Hardening, LengthsPastTheLimitsAreErrors) {
  const std::vector<int32_t> qo{0, 1}, kv{kInt32Max};
  kvattn::PlannerInputs in;
  in.qo_indptr = qo;
  in.kv_len = kv;
  in.num_qo_heads = in.num_kv_heads = 1;
  in.head_dim_qk = 64;
  in.causal = true;
  kvattn::SchedulerOptions opt;
  opt.num_workers = 8;
  EXPECT_KVATTN_ERROR(kvattn::make_plan(in, opt), "kv_len[0] = 2147483647 is out of range [0, 2147418112]");

  // The same through BatchPrefill: a ragged kv_indptr {0, INT32_MAX}.
  HostTensor qo_t = int32_tensor({0, 1}), kv_t = int32_tensor({0, kInt32Max});
  kvattn::BatchPrefillPlan p;
  p.num_qo_heads = p.num_kv_heads = 1;
  p.head_dim_qk = 64;
  p.variant.causal = true;
  p.qo_indptr = qo_t.view();
  p.kv_indptr = kv_t.view();
  kvattn::BatchPrefill op;
  EXPECT_KVATTN_ERROR(op.plan(p), "KV tokens exceed the limit of 2147418112");
}

// An impossible batch is rejected from its lengths (O(batch)), before the planner builds its
// query tiles: qo = kv = kMaxKVLen causal needs ~2^61 KV-token steps. (At d99cf79 this took 40-50 s
// and ~9 GB before the same error; the bound below only guards against a return to that.)
TEST(Hardening, ImpossibleBatchIsRejectedBeforeAnyWork) {
  const std::vector<int32_t> qo{0, int32_t(kvattn::kMaxTotalTokens)}, kv{int32_t(kvattn::kMaxKVLen)};
  kvattn::PlannerInputs in;
  in.qo_indptr = qo;
  in.kv_len = kv;
  in.num_qo_heads = in.num_kv_heads = 1;
  in.head_dim_qk = 64;
  in.causal = true;
  kvattn::SchedulerOptions opt;
  opt.num_workers = 8;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_KVATTN_ERROR(kvattn::make_plan(in, opt), "exceeds the planner's limit");
  in.causal = false;  // non-causal: more still
  EXPECT_KVATTN_ERROR(kvattn::make_plan(in, opt), "exceeds the planner's limit");
  // Items: a window of 0 keeps every tile cheap, but 2^31 / 16 query tiles are past the item limit.
  in.causal = true;
  in.window_left = 0;
  EXPECT_KVATTN_ERROR(kvattn::make_plan(in, opt), "work items, more than the planner's limit of 67108864");
  // A fixed split of 1 token over 2^31 keys: ~2^31 chunks x heads.
  const std::vector<int32_t> qo1{0, 1};
  in.qo_indptr = qo1;
  in.causal = false;
  in.window_left = -1;
  in.num_qo_heads = in.num_kv_heads = 4;
  opt.fixed_split_size = 1;
  EXPECT_KVATTN_ERROR(kvattn::make_plan(in, opt), "fixed_split_size = 1 cuts the batch's");
  // A legal but absurd split: fixed_split_size 64 over 2^31 keys is 2^25 chunks x 4 heads (found
  // by the fuzzer's author: 33 s and gigabytes before, an error from the lengths now).
  opt.fixed_split_size = 64;
  EXPECT_KVATTN_ERROR(kvattn::make_plan(in, opt), "more work items than the planner's limit");
  // A graph capacity past the batch limits.
  opt.fixed_split_size = 0;
  opt.cuda_graph = kvattn::GraphCapacity{1, int64_t(1) << 34};
  EXPECT_KVATTN_ERROR(kvattn::make_plan(in, opt), "cuda_graph.max_tokens = 17179869184 is out of range");
  opt.cuda_graph = kvattn::GraphCapacity{1, int64_t(1) << 30};
  EXPECT_KVATTN_ERROR(kvattn::make_plan(in, opt), "more than the planner's limit of 67108864");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 2.0) << "the rejections did work proportional to the batch";
}

// The closed form of a request's tiles and visible tokens against a direct count.
TEST(Hardening, RequestWorkMatchesTheTileLoop) {
  Rng rng = case_rng();
  SCOPED_TRACE(seed_note(rng));
  for (int trial = 0; trial < 4000; ++trial) {
    const int T = int(rng.integer(1, 20));
    const int64_t kv = rng.integer(0, 300), qo = rng.coin(0.2) ? rng.integer(0, 400) : rng.integer(0, kv);
    const bool causal = rng.coin(0.5);
    const int w = rng.coin(0.5) ? -1 : int(rng.integer(0, 80));
    int64_t tiles = 0, visible = 0;
    for (int64_t q0 = 0; q0 < qo; q0 += T) {
      const int64_t q1 = std::min<int64_t>(qo, q0 + T);
      int64_t v0 = 0, v1 = kv;
      if (causal) v1 = std::min<int64_t>(kv, kv - qo + q1);
      if (w >= 0) v0 = std::max<int64_t>(0, kv - qo + q0 - w);
      ++tiles;
      visible += std::max<int64_t>(0, v1 - v0);
    }
    const kvattn::RequestWork r = kvattn::request_work(qo, kv, T, causal, w);
    ASSERT_EQ(r.tiles, tiles) << "qo " << qo << " kv " << kv << " T " << T;
    ASSERT_EQ(int64_t(r.visible), visible)
        << "qo " << qo << " kv " << kv << " T " << T << " causal " << causal << " window " << w;
  }
}

// ---- qo_len > kv_len ----------------------------------------------------------------------------
// Planned, as FlashInfer plans them (Prefill.EmptyRequestsAndBatches checks the results); the
// cascade's last level still refuses them (CascadeAttention tests).
TEST(Hardening, QueriesLongerThanKeysArePlanned) {
  HostTensor qo = int32_tensor({0, 2, 7}), kv = int32_tensor({0, 4, 9});
  kvattn::BatchPrefillPlan p;
  p.num_qo_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim_qk = 16;
  p.qo_indptr = qo.view();
  p.kv_indptr = kv.view();
  kvattn::BatchPrefill ragged;
  EXPECT_NO_THROW(ragged.plan(p));  // qo_len = kv_len = 5: a full prefill
  HostTensor qo_bad = int32_tensor({0, 2, 8});
  p.qo_indptr = qo_bad.view();
  EXPECT_NO_THROW(ragged.plan(p));
  // Paged: request 0 has 17 tokens (two pages of 16, the last holding 1).
  HostTensor indptr = int32_tensor({0, 2}), indices = int32_tensor({3, 1}), last = int32_tensor({1}),
             qo_paged = int32_tensor({0, 18});
  kvattn::BatchPrefillPlan pp;
  pp.num_qo_heads = 4;
  pp.num_kv_heads = 2;
  pp.head_dim_qk = 16;
  pp.qo_indptr = qo_paged.view();
  pp.page_table = kvattn::PageTable{indptr.view(), indices.view(), last.view()};
  pp.page_size = 16;
  kvattn::BatchPrefill paged;
  EXPECT_NO_THROW(paged.plan(pp));
}

// ---- BSR sizes -----------------------------------------------------------------------------------
TEST(Hardening, BlockSparseSizesPastInt32AreErrors) {
  HostTensor indptr = int32_tensor({0, 0}), indices = int32_tensor({});
  kvattn::BlockSparsePlan p;
  p.num_qo_heads = p.num_kv_heads = 1;
  p.head_dim_qk = 16;
  p.bsr = {indptr.view(), indices.view(), int64_t(1) << 32, 16, int64_t(1) << 32, 16};
  kvattn::BlockSparseAttention op;
  EXPECT_KVATTN_ERROR(op.plan(p), "bsr M = 4294967296 is out of range");
  p.bsr.M = 16;
  p.bsr.R = 16;
  p.bsr.N = int64_t(1) << 32;
  p.bsr.C = int64_t(1) << 32;
  EXPECT_KVATTN_ERROR(op.plan(p), "bsr N = 4294967296 is out of range");
  p.bsr.N = 32;
  p.bsr.C = 5;
  EXPECT_KVATTN_ERROR(op.plan(p), "bsr N = 32 is not a multiple of C = 5");
}

// ---- stand-alone ops -----------------------------------------------------------------------------
TEST(Hardening, OpsWithNegativeRowsAreErrors) {
  HostTensor k(DType::f16, {4, 2, 16});
  // append_k of shape [-1, H, D] cannot even be formed as a view.
  EXPECT_KVATTN_ERROR(TensorView(k.base(), DType::f16, {-1, 2, 16}), "shape[0] = -1");
}

TEST(Hardening, AliasingIsRejected) {
  const int64_t n = 6, H = 2, D = 16;
  HostTensor q(DType::f16, {n, H, D}), k(DType::f16, {n, H, D});
  HostTensor pos = int32_tensor({0, 1, 2, 3, 4, 5});
  // k_out aliasing q: k would be computed after q was rotated in place.
  EXPECT_KVATTN_ERROR(kvattn::apply_rope(q.view(), k.view(), q.view(), q.view(), pos.view()),
                      "q_out (f16[6, 2, 16] on cpu");
  EXPECT_KVATTN_ERROR(kvattn::apply_rope(q.view(), k.view(), k.view(), k.view(), pos.view()), "q_out");
  // In place on a fused QKV buffer (q and k interleaved rows of one tensor) is fine.
  HostTensor qkv(DType::f16, {n, 3 * H, D});
  for (int64_t i = 0; i < n * 3 * H * D; ++i) qkv.set_at(i, double(i % 7) - 3);
  const TensorView all = qkv.view();
  const TensorView qv(all.data(), DType::f16, {n, H, D}, {3 * H * D, D, 1});
  const TensorView kview(static_cast<char*>(all.data()) + H * D * 2, DType::f16, {n, H, D}, {3 * H * D, D, 1});
  EXPECT_NO_THROW(kvattn::apply_rope(qv, kview, qv, kview, pos.view()));

  // merge_state with v_out overlapping v_a shifted by one row.
  HostTensor buf(DType::f32, {n + 1, H, D}), vb(DType::f32, {n, H, D});
  HostTensor sa(DType::f32, {n, H}), sb(DType::f32, {n, H}), so(DType::f32, {n, H});
  const TensorView va(buf.base(), DType::f32, {n, H, D});
  const TensorView vo(buf.base() + H * D * 4, DType::f32, {n, H, D});
  EXPECT_KVATTN_ERROR(kvattn::merge_state(va, sa.view(), vb.view(), sb.view(), vo, so.view()),
                      "v_out (f32[6, 2, 16] on cpu");
  // Exact aliasing stays allowed (documented in ops.h).
  for (HostTensor* t : {&sa, &sb}) t->for_each([&](int64_t off, const std::vector<int64_t>&) { t->set_at(off, 0.5); });
  EXPECT_NO_THROW(kvattn::merge_state(va, sa.view(), vb.view(), sb.view(), va, sa.view()));
  // s_out overlapping v_out (one buffer for both).
  const TensorView s_in_v(buf.base(), DType::f32, {n, H});
  EXPECT_KVATTN_ERROR(kvattn::merge_state(vb.view(), sb.view(), vb.view(), sb.view(), va, s_in_v), "overlaps");

  // Attention: out overlapping the K cache, lse overlapping out, a row stride of 0.
  HostTensor indptr = int32_tensor({0, 1}), indices = int32_tensor({0}), last = int32_tensor({5});
  kvattn::BatchDecodePlan p;
  p.num_qo_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim_qk = 16;
  p.q_dtype = DType::f16;
  p.o_dtype = DType::f16;
  p.page_table = {indptr.view(), indices.view(), last.view()};
  p.page_size = 8;
  kvattn::BatchDecode op;
  op.plan(p);
  HostTensor cache_k(DType::f16, {1, 8, 2, 16}), cache_v(DType::f16, {1, 8, 2, 16});
  HostTensor qd(DType::f16, {1, 4, 16}), out(DType::f16, {1, 4, 16}), lse(DType::f32, {1, 4});
  const auto cache = kvattn::PagedKVCache::split(cache_k.view(), cache_v.view(), kvattn::KVLayout::NHD);
  const TensorView out_in_k(cache_k.base(), DType::f16, {1, 4, 16});
  EXPECT_KVATTN_ERROR(op.run(qd.view(), cache, out_in_k, lse.view()), "out (f16[1, 4, 16] on cpu");
  const TensorView lse_in_out(out.base(), DType::f32, {1, 4});
  EXPECT_KVATTN_ERROR(op.run(qd.view(), cache, out.view(), lse_in_out), "overlaps");
  HostTensor out2(DType::f16, {2, 4, 16});
  const TensorView heads_stride0(out2.base(), DType::f16, {1, 4, 16}, {64, 0, 1});
  EXPECT_KVATTN_ERROR(op.run(qd.view(), cache, heads_stride0, lse.view()), "has elements that share memory");
  EXPECT_NO_THROW(op.run(qd.view(), cache, out.view(), lse.view()));
}

// ---- messages that name the argument at fault -----------------------------------------------------
TEST(Hardening, ErrorsNameTheArgumentAtFault) {
  HostTensor long_indptr = int32_tensor({0, 1, 2, 3}), indices = int32_tensor({0, 1, 2}), last = int32_tensor({4, 4});
  kvattn::BatchDecodePlan p;
  p.num_qo_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim_qk = 16;
  p.page_size = 8;
  p.page_table = {long_indptr.view(), indices.view(), last.view()};
  kvattn::BatchDecode op;
  EXPECT_KVATTN_ERROR(op.plan(p), "kv_indptr has 4 elements (batch_size 3) but kv_last_page_len has 2");
  HostTensor indptr = int32_tensor({0, 1, 3}), neg = int32_tensor({0, -7, 2});
  p.page_table = {indptr.view(), neg.view(), last.view()};
  EXPECT_KVATTN_ERROR(op.plan(p), "kv_indices[1] = -7 is negative");
  p.page_table = {indptr.view(), indices.view(), last.view()};
  op.plan(p);
  // A CPU plan run with q on a CUDA device: q is the argument at fault (nothing is dereferenced).
  HostTensor out(DType::bf16, {2, 4, 16}), kc(DType::bf16, {3, 8, 2, 16});
  const TensorView q_gpu(reinterpret_cast<void*>(uintptr_t(0x1000)), DType::bf16, {2, 4, 16},
                         kvattn::Device::cuda(0));
  const auto cache = kvattn::PagedKVCache::split(kc.view(), kc.view(), kvattn::KVLayout::NHD);
  EXPECT_KVATTN_ERROR(op.run(q_gpu, cache, out.view()), "q is on cuda:0 but BatchDecode was planned for the CPU");

  // Ragged: a long kv_indptr against qo_indptr names both.
  HostTensor qo = int32_tensor({0, 1, 2}), kv_long = int32_tensor({0, 1, 2, 3});
  kvattn::BatchPrefillPlan pp;
  pp.num_qo_heads = 4;
  pp.num_kv_heads = 2;
  pp.head_dim_qk = 16;
  pp.qo_indptr = qo.view();
  pp.kv_indptr = kv_long.view();
  kvattn::BatchPrefill prefill;
  EXPECT_KVATTN_ERROR(prefill.plan(pp), "qo_indptr has 3 elements (batch_size 2) but kv_indptr describes batch_size 3");
  HostTensor empty_qo(DType::i32, {0});
  pp.qo_indptr = empty_qo.view();
  EXPECT_KVATTN_ERROR(prefill.plan(pp), "qo_indptr has 0 elements but kv_indptr describes batch_size 3");
}

// is_contiguous() multiplied the sizes from the last dim in int64: an empty view with huge other
// sizes (valid: no element), or a view being rejected for its size and described in the error,
// overflowed (UBSan: signed integer overflow in tensor.cpp).
TEST(Hardening, ContiguityOfHugeEmptyViewsDoesNotOverflow) {
  int32_t storage[1] = {0};
  const TensorView empty(storage, DType::f32, {0, int64_t(1) << 40, int64_t(1) << 40});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_NE(empty.describe().find("f32[0, 1099511627776, 1099511627776]"), std::string::npos);  // is_contiguous() inside
  const int64_t shape[3] = {0, int64_t(1) << 40, int64_t(1) << 40}, strides[3] = {7, int64_t(1) << 40, 1};
  EXPECT_FALSE(TensorView(storage, DType::f32, 3, shape, strides).is_contiguous());
  // Rejected for its size; describing it in the message runs is_contiguous() on 2^93 elements.
  const int64_t huge[3] = {int64_t(1) << 31, int64_t(1) << 31, int64_t(1) << 31};
  EXPECT_KVATTN_ERROR(TensorView(storage, DType::f32, 3, huge, nullptr), "more elements than int64 can count");
}

// ---- found by the API fuzzer (fuzz/) -------------------------------------------------------------
// A custom mask with elements but a null data pointer was copied from address 0 by plan() (UBSan:
// null pointer passed to memmove; a segfault without sanitizers).
TEST(Hardening, CustomMaskWithNullDataIsAnError) {
  HostTensor qo = int32_tensor({0, 2}), kv = int32_tensor({0, 3}), mask_indptr = int32_tensor({0, 1});
  kvattn::BatchPrefillPlan p;
  p.num_qo_heads = p.num_kv_heads = 1;
  p.head_dim_qk = 16;
  p.variant = kvattn::variants::custom_mask();
  p.qo_indptr = qo.view();
  p.kv_indptr = kv.view();
  p.mask_indptr = mask_indptr.view();
  p.custom_mask = TensorView(nullptr, DType::u8, {1});  // 2 x 3 bits: one byte
  kvattn::BatchPrefill op;
  EXPECT_KVATTN_ERROR(op.plan(p), "custom_mask has a null data pointer");
}

}  // namespace
}  // namespace kvattn_test
