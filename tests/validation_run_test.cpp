// Every run()-time validation error of the attention wrappers (src/api/attention.cpp,
// validate.cpp), each checked by its message; a rejected run() writes nothing (out and lse keep
// their poison), and a failed plan() leaves the previous plan usable.
#include <gtest/gtest.h>

#include "kvattn/attention.h"
#include "support/expect_error.h"
#include "support/host_tensor.h"
#include "support/paged_kv.h"

namespace kvattn_test {
namespace {

using kvattn::DType;
using kvattn::Device;
using kvattn::KVLayout;
using kvattn::TensorView;

// Two decode requests (kv 5 and 17, page 16) with 8/2 heads, head dim 32, f16 everywhere.
struct DecodeRig {
  Rng rng{12345};
  PagedKV kv{PagedKVSpec{{5, 17}, 16, 2, 32, 32, DType::f16, KVLayout::NHD, false, false, false, 2}, rng};
  HostTensor q{DType::f16, {2, 8, 32}}, out{DType::f16, {2, 8, 32}}, lse{DType::f32, {2, 8}};
  kvattn::BatchDecode op;
  DecodeRig(kvattn::Variant v = {}) {
    q.for_each([&](int64_t off, const std::vector<int64_t>&) { q.set_at(off, rng.uniform(-1, 1)); });
    for (int b = 0; b < 2; ++b)
      for (int t = 0; t < (b ? 17 : 5); ++t)
        for (int h = 0; h < 2; ++h)
          for (int e = 0; e < 32; ++e) kv.set_k(size_t(b), t, h, e, 0.5), kv.set_v(size_t(b), t, h, e, 0.25);
    op.plan(plan(v));
  }
  kvattn::BatchDecodePlan plan(kvattn::Variant v = {}) const {
    kvattn::BatchDecodePlan p;
    p.num_qo_heads = 8;
    p.num_kv_heads = 2;
    p.head_dim_qk = 32;
    p.q_dtype = DType::f16;
    p.variant = v;
    p.page_table = kv.table();
    p.page_size = 16;
    return p;
  }
};

// Runs f, which must throw `msg`, on poisoned out and lse; neither may change.
template <class F>
void expect_rejected(HostTensor& out, HostTensor& lse, F f, const char* msg) {
  out.poison();
  lse.poison();
  const auto out_before = out.snapshot(), lse_before = lse.snapshot();
  EXPECT_KVATTN_ERROR(f(), msg);
  EXPECT_TRUE(out.same_bytes(out_before)) << "out was written by a rejected run (" << msg << ")";
  EXPECT_TRUE(lse.same_bytes(lse_before)) << "lse was written by a rejected run (" << msg << ")";
}

TEST(ValidationRun, BeforePlan) {
  HostTensor t(DType::f16, {1, 8, 32});
  EXPECT_KVATTN_ERROR(kvattn::BatchDecode{}.run(t.view(), {}, t.view()),
                      "BatchDecode.run() was called before plan()");
  EXPECT_KVATTN_ERROR(kvattn::BatchPrefill{}.run(t.view(), t.view(), t.view(), t.view()),
                      "BatchPrefill.run() was called before plan()");
  EXPECT_KVATTN_ERROR(kvattn::BatchPrefill{}.run(t.view(), kvattn::PagedKVCache{}, t.view()),
                      "BatchPrefill.run() was called before plan()");
  EXPECT_KVATTN_ERROR(kvattn::BlockSparseAttention{}.run(t.view(), t.view(), t.view(), t.view()),
                      "BlockSparseAttention.run() was called before plan()");
  EXPECT_KVATTN_ERROR(kvattn::BatchDecode{}.check_errors(), "BatchDecode.check_errors() was called before plan()");
  EXPECT_KVATTN_ERROR(kvattn::BatchPrefill{}.check_errors(), "BatchPrefill.check_errors() was called before plan()");
}

TEST(ValidationRun, QueryOutputAndLse) {
  DecodeRig s;
  auto run = [&](TensorView q, TensorView out, TensorView lse, const char* msg) {
    expect_rejected(s.out, s.lse, [&] { s.op.run(q, s.kv.cache(), out, lse); }, msg);
  };
  const TensorView q = s.q.view(), out = s.out.view(), lse = s.lse.view();
  EXPECT_NO_THROW(s.op.run(q, s.kv.cache(), out, lse));
  HostTensor q2d(DType::f16, {2, 256}), q_f32(DType::f32, {2, 8, 32}), q3(DType::f16, {3, 8, 32}),
      q_heads(DType::f16, {2, 4, 32}), q_dim(DType::f16, {2, 8, 16});
  run(TensorView{}, out, lse, "q is required but was not given");
  run(q2d.view(), out, lse, "q must be 3-D, got f16[2, 256] on cpu");
  run(q_f32.view(), out, lse, "q has dtype f32 but the plan was made for q_dtype = f16");
  run(q3.view(), out, lse, "q.shape[0] = 3 but batch_size = 2");
  run(q_heads.view(), out, lse, "q.shape[1] = 4 but num_qo_heads = 8");
  run(q_dim.view(), out, lse, "q.shape[2] = 16 but head_dim_qk = 32");
  run(TensorView(s.q.base(), DType::f16, {2, 8, 32}, {256, 1, 8}), out, lse,
      "q must be contiguous in its last (head) dimension, got f16[2, 8, 32] strides (256, 1, 8) on cpu");
  run(TensorView(nullptr, DType::f16, {2, 8, 32}), out, lse, "q has a null data pointer");
  HostTensor out_f32(DType::f32, {2, 8, 32}), out_dim(DType::f16, {2, 8, 8});
  run(q, TensorView{}, lse, "out is required but was not given");
  run(q, out_f32.view(), lse, "out has dtype f32 but the plan was made for o_dtype = f16");
  run(q, out_dim.view(), lse, "out.shape[2] = 8 but head_dim_vo = 32");
  run(q, TensorView(s.out.base(), DType::f16, {2, 8, 32}, Device::cuda(0)), lse,
      "out is on cuda:0 but q is on cpu");
  run(q, TensorView(nullptr, DType::f16, {2, 8, 32}), lse, "out has a null data pointer");
  HostTensor lse3(DType::f32, {2, 8, 1}), lse_f16(DType::f16, {2, 8}), lse_rows(DType::f32, {3, 8}),
      lse_heads(DType::f32, {2, 4});
  run(q, out, lse3.view(), "lse must be 2-D, got f32[2, 8, 1] on cpu");
  run(q, out, lse_f16.view(), "lse has dtype f16 but f32 is expected");
  run(q, out, lse_rows.view(), "lse.shape[0] = 3 but batch_size = 2");
  run(q, out, lse_heads.view(), "lse.shape[1] = 4 but num_qo_heads = 8");
  run(q, out, TensorView(s.lse.base(), DType::f32, {2, 8}, Device::cuda(0)), "lse is on cuda:0 but q is on cpu");
  run(q, out, TensorView(nullptr, DType::f32, {2, 8}), "lse has a null data pointer");

  DecodeRig sig(kvattn::variants::sigmoid());
  expect_rejected(sig.out, sig.lse, [&] { sig.op.run(sig.q.view(), sig.kv.cache(), sig.out.view(), sig.lse.view()); },
                  "lse was requested but sigmoid attention has no lse");
  EXPECT_NO_THROW(sig.op.run(sig.q.view(), sig.kv.cache(), sig.out.view()));
}

TEST(ValidationRun, PagedCache) {
  DecodeRig s;
  auto run = [&](const kvattn::PagedKVCache& c, const char* msg) {
    expect_rejected(s.out, s.lse, [&] { s.op.run(s.q.view(), c, s.out.view(), s.lse.view()); }, msg);
  };
  const TensorView k = s.kv.k.view(), v = s.kv.v.view();
  const int64_t P = s.kv.num_pages();
  auto cache = [](TensorView k, TensorView v, KVLayout l = KVLayout::NHD) { return kvattn::PagedKVCache{k, v, l}; };
  HostTensor k3(DType::f16, {P, 16, 64}), k_f32(DType::f32, {P, 16, 2, 32}), k_ps(DType::f16, {P, 8, 2, 32}),
      v_heads(DType::f16, {P, 16, 1, 32}), k_dim(DType::f16, {P, 16, 2, 16}), v_dim(DType::f16, {P, 16, 2, 8}),
      v_pages(DType::f16, {P - 1, 16, 2, 32}), k_hnd(DType::f16, {P, 2, 8, 32});
  run(cache(k3.view(), v), "paged k must be 4-D, got f16[");
  run(cache(k, TensorView{}), "paged v is required but was not given");
  run(cache(k, v, KVLayout::HND), "the paged KV cache has layout HND but the wrapper was created for NHD");
  run(cache(k_f32.view(), v), "paged k has dtype f32 but the plan was made for kv_dtype = f16");
  run(cache(k, k_f32.view()), "paged v has dtype f32 but the plan was made for kv_dtype = f16");
  run(cache(TensorView(s.kv.k.base(), DType::f16, {P, 16, 2, 32}, {1024, 64, 32, 2}), v),
      "paged k must be contiguous in its last (head) dimension");
  run(cache(k, TensorView(s.kv.v.base(), DType::f16, {P, 16, 2, 32}, Device::cuda(0))),
      "paged v is on cuda:0 but q is on cpu");
  run(cache(TensorView(nullptr, DType::f16, {P, 16, 2, 32}), v), "paged k has a null data pointer");
  run(cache(k_ps.view(), v), "paged k.shape[1] = 8 but page_size = 16");
  run(cache(k, v_heads.view()), "paged v.shape[2] = 1 but num_kv_heads = 2");
  run(cache(k_dim.view(), v), "paged k.shape[3] = 16 but head_dim_qk = 32");
  run(cache(k, v_dim.view()), "paged v.shape[3] = 8 but head_dim_vo = 32");
  const std::string pages_msg = "paged v.shape[0] = " + std::to_string(P - 1) +
                                " but paged k.shape[0] (num_pages) = " + std::to_string(P);
  run(cache(k, v_pages.view()), pages_msg.c_str());
  kvattn::BatchDecode hnd({}, KVLayout::HND);
  hnd.plan(s.plan());
  expect_rejected(s.out, s.lse,
                  [&] { hnd.run(s.q.view(), cache(k_hnd.view(), k_hnd.view(), KVLayout::HND), s.out.view()); },
                  "paged k.shape[2] = 8 but page_size = 16");
}

TEST(ValidationRun, PageIndexOutOfRange) {
  // One request of 20 pages of one token; page 17 of the table names page 9001 of a 512-page cache.
  std::vector<int32_t> pages(20);
  for (int i = 0; i < 20; ++i) pages[size_t(i)] = 3 * i;
  pages[17] = 9001;
  HostTensor indptr = int32_tensor({0, 20}), indices = int32_tensor(pages), last = int32_tensor({1});
  HostTensor k(DType::f16, {512, 1, 2, 32}), q(DType::f16, {1, 8, 32}), out(DType::f16, {1, 8, 32}),
      lse(DType::f32, {1, 8});
  kvattn::BatchDecodePlan p;
  p.num_qo_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim_qk = 32;
  p.q_dtype = DType::f16;
  p.page_table = {indptr.view(), indices.view(), last.view()};
  p.page_size = 1;
  kvattn::BatchDecode op;
  op.plan(p);  // the cache is not known at plan time
  expect_rejected(out, lse, [&] { op.run(q.view(), kvattn::PagedKVCache::split(k.view(), k.view(), KVLayout::NHD), out.view(), lse.view()); },
                  "kv_indices[17] = 9001 is out of range [0, 512)");
}

TEST(ValidationRun, RaggedPrefill) {
  HostTensor qo = int32_tensor({0, 2, 5}), kvp = int32_tensor({0, 4, 9});
  kvattn::BatchPrefillPlan p;
  p.num_qo_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim_qk = 32;
  p.q_dtype = DType::f16;
  p.qo_indptr = qo.view();
  p.kv_indptr = kvp.view();
  kvattn::BatchPrefill op;
  op.plan(p);
  HostTensor q(DType::f16, {5, 8, 32}), k(DType::f16, {9, 2, 32}), v(DType::f16, {9, 2, 32}),
      out(DType::f16, {5, 8, 32}), lse(DType::f32, {5, 8});
  EXPECT_NO_THROW(op.run(q.view(), k.view(), v.view(), out.view(), lse.view()));
  auto run = [&](TensorView qq, TensorView kk, TensorView vv, const char* msg) {
    expect_rejected(out, lse, [&] { op.run(qq, kk, vv, out.view(), lse.view()); }, msg);
  };
  HostTensor q4(DType::f16, {4, 8, 32}), k8(DType::f16, {8, 2, 32}), k2d(DType::f16, {9, 64}),
      k_f32(DType::f32, {9, 2, 32}), k_heads(DType::f16, {9, 1, 32}), v_dim(DType::f16, {9, 2, 16});
  run(q4.view(), k.view(), v.view(), "q.shape[0] = 4 but qo_indptr[-1] = 5");
  run(q.view(), k8.view(), v.view(), "k.shape[0] = 8 but kv_indptr[-1] = 9");
  run(q.view(), k.view(), k8.view(), "v.shape[0] = 8 but kv_indptr[-1] = 9");
  run(q.view(), k2d.view(), v.view(), "k must be 3-D, got f16[9, 64] on cpu");
  run(q.view(), k_f32.view(), v.view(), "k has dtype f32 but the plan was made for kv_dtype = f16");
  run(q.view(), k_heads.view(), v.view(), "k.shape[1] = 1 but num_kv_heads = 2");
  run(q.view(), k.view(), v_dim.view(), "v.shape[2] = 16 but head_dim_vo = 32");
  run(q.view(), k.view(), TensorView(v.base(), DType::f16, {9, 2, 32}, Device::cuda(0)),
      "v is on cuda:0 but q is on cpu");
  run(q.view(), TensorView(nullptr, DType::f16, {9, 2, 32}), v.view(), "k has a null data pointer");
  HostTensor cache(DType::f16, {4, 16, 2, 32});
  expect_rejected(out, lse, [&] { op.run(q.view(), kvattn::PagedKVCache::split(cache.view(), cache.view(), KVLayout::NHD), out.view()); },
                  "run() was given a paged KV cache but the plan was made for ragged k and v");
  DecodeRig s;  // a paged plan, run with ragged k and v
  kvattn::BatchPrefillPlan pp;
  static_cast<kvattn::AttentionShape&>(pp) = s.plan();
  HostTensor qo2 = int32_tensor({0, 1, 2});
  pp.qo_indptr = qo2.view();
  pp.page_table = s.kv.table();
  pp.page_size = 16;
  op.plan(pp);
  expect_rejected(s.out, s.lse, [&] { op.run(s.q.view(), k.view(), v.view(), s.out.view()); },
                  "run() was given ragged k and v but the plan was made for a paged KV cache");
}

TEST(ValidationRun, BlockSparse) {
  HostTensor indptr = int32_tensor({0, 2, 3}), indices = int32_tensor({0, 3, 1});
  kvattn::BlockSparsePlan p;
  p.num_qo_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim_qk = 32;
  p.q_dtype = DType::f16;
  p.bsr = {indptr.view(), indices.view(), 8, 16, 4, 4};
  kvattn::BlockSparseAttention op;
  op.plan(p);
  HostTensor q(DType::f16, {8, 8, 32}), k(DType::f16, {16, 2, 32}), out(DType::f16, {8, 8, 32}),
      lse(DType::f32, {8, 8});
  EXPECT_NO_THROW(op.run(q.view(), k.view(), k.view(), out.view(), lse.view()));
  HostTensor q7(DType::f16, {7, 8, 32}), k15(DType::f16, {15, 2, 32}), k_heads(DType::f16, {16, 1, 32}),
      lse7(DType::f32, {7, 8});
  expect_rejected(out, lse, [&] { op.run(q7.view(), k.view(), k.view(), out.view()); }, "q.shape[0] = 7 but bsr M = 8");
  expect_rejected(out, lse, [&] { op.run(q.view(), k.view(), k.view(), out.view(), lse7.view()); },
                  "lse.shape[0] = 7 but bsr M = 8");
  expect_rejected(out, lse, [&] { op.run(q.view(), k15.view(), k.view(), out.view()); }, "k.shape[0] = 15 but bsr N = 16");
  expect_rejected(out, lse, [&] { op.run(q.view(), k.view(), k_heads.view(), out.view()); },
                  "v.shape[1] = 1 but num_kv_heads = 2");
}

TEST(ValidationRun, FailedPlanKeepsThePreviousPlan) {
  DecodeRig s;
  s.out.poison();  // the same starting bytes as the re-run below
  s.lse.poison();
  s.op.run(s.q.view(), s.kv.cache(), s.out.view(), s.lse.view());
  const auto out_before = s.out.snapshot(), lse_before = s.lse.snapshot();
  auto bad = s.plan();
  bad.num_kv_heads = 3;
  EXPECT_KVATTN_ERROR(s.op.plan(bad), "num_qo_heads = 8 is not a multiple of num_kv_heads = 3");
  HostTensor bad_last = int32_tensor({5, 0});
  bad = s.plan();
  bad.page_table.last_page_len = bad_last.view();
  EXPECT_KVATTN_ERROR(s.op.plan(bad), "kv_last_page_len[1] = 0 is out of range [1, 16]");
  s.out.poison();
  s.lse.poison();
  s.op.run(s.q.view(), s.kv.cache(), s.out.view(), s.lse.view());
  EXPECT_TRUE(s.out.same_bytes(out_before));
  EXPECT_TRUE(s.lse.same_bytes(lse_before));

  // Prefill: a good plan, a plan failing late (in the custom mask), the good plan still runs.
  HostTensor qo = int32_tensor({0, 2, 5}), kvp = int32_tensor({0, 4, 9});
  kvattn::BatchPrefillPlan p;
  static_cast<kvattn::AttentionShape&>(p) = s.plan();
  p.qo_indptr = qo.view();
  p.kv_indptr = kvp.view();
  kvattn::BatchPrefill pf;
  pf.plan(p);
  HostTensor q(DType::f16, {5, 8, 32}), k(DType::f16, {9, 2, 32}), out(DType::f16, {5, 8, 32});
  q.for_each([&](int64_t off, const std::vector<int64_t>&) { q.set_at(off, s.rng.uniform(-1, 1)); });
  k.for_each([&](int64_t off, const std::vector<int64_t>&) { k.set_at(off, s.rng.uniform(-1, 1)); });
  out.poison();
  pf.run(q.view(), k.view(), k.view(), out.view());
  const auto pf_before = out.snapshot();
  p.variant = kvattn::variants::custom_mask();
  EXPECT_KVATTN_ERROR(pf.plan(p), "the variant has custom_mask on but no custom_mask was given");
  out.poison();
  pf.run(q.view(), k.view(), k.view(), out.view());
  EXPECT_TRUE(out.same_bytes(pf_before));

  // Block-sparse: the same.
  HostTensor indptr = int32_tensor({0, 1, 2}), indices = int32_tensor({1, 0}), dup = int32_tensor({1, 1});
  kvattn::BlockSparsePlan bp;
  static_cast<kvattn::AttentionShape&>(bp) = s.plan();
  bp.bsr = {indptr.view(), indices.view(), 4, 8, 2, 4};
  kvattn::BlockSparseAttention bs;
  bs.plan(bp);
  HostTensor bq(DType::f16, {4, 8, 32}), bk(DType::f16, {8, 2, 32}), bout(DType::f16, {4, 8, 32});
  bq.for_each([&](int64_t off, const std::vector<int64_t>&) { bq.set_at(off, s.rng.uniform(-1, 1)); });
  bk.for_each([&](int64_t off, const std::vector<int64_t>&) { bk.set_at(off, s.rng.uniform(-1, 1)); });
  bout.poison();
  bs.run(bq.view(), bk.view(), bk.view(), bout.view());
  const auto bs_before = bout.snapshot();
  HostTensor indptr2 = int32_tensor({0, 2, 2});
  bp.bsr.indptr = indptr2.view();
  bp.bsr.indices = dup.view();
  EXPECT_KVATTN_ERROR(bs.plan(bp), "bsr indices[1] = 1 repeats a column block already listed for block row 0");
  bout.poison();
  bs.run(bq.view(), bk.view(), bk.view(), bout.view());
  EXPECT_TRUE(bout.same_bytes(bs_before));
}

}  // namespace
}  // namespace kvattn_test
