// BlockSparseAttention against the float64 reference: R x C blocks from 1 x 1 (vector sparsity) to
// 16 x 16, random block patterns listed in random order, empty block rows (zeros, lse -inf),
// M != N (query i at position i + N - M, key j at j), every dtype, GQA groups, strided views and
// the variants that apply to it (causal, sliding window, soft-cap, ALiBi, RoPE, sigmoid, scales).
#include <gtest/gtest.h>

#include <limits>

#include "reference/reference.h"
#include "support/attention_case.h"
#include "support/bsr_case.h"
#include "support/compare.h"
#include "support/host_tensor.h"
#include "support/paged_kv.h"

namespace kvattn_test {
namespace {

using kvattn::DType;

TEST(BlockSparse, BlockShapes) {
  const std::array<int64_t, 4> shapes[] = {  // M, N, R, C
      {8, 8, 1, 1}, {13, 29, 1, 1}, {16, 48, 4, 4}, {12, 30, 2, 3}, {32, 32, 16, 1},
      {16, 64, 16, 16}, {9, 48, 3, 16}, {48, 16, 4, 4}, {4, 96, 4, 32},
      {64, 32, 32, 8}, {32, 128, 32, 64}};  // R past a 16-row query tile, C past a 32-key tile
  for (auto [M, N, R, C] : shapes)
    for (double density : {0.3, 1.0}) {
      KVATTN_CASE_RNG(rng);
      BsrCase bc{M, N, R, C, density, {}};
      bc.base.num_qo_heads = 4;
      bc.base.num_kv_heads = 2;
      bc.base.head_dim_qk = 32;
      run_bsr_case(bc, rng);
    }
}

TEST(BlockSparse, EmptyPatternsAndShapes) {
  const std::array<int64_t, 4> shapes[] = {{8, 8, 2, 2}, {0, 8, 2, 2}, {8, 0, 2, 2}, {0, 0, 1, 1}};
  for (auto [M, N, R, C] : shapes)
    for (double density : {0.0, 0.5}) {
      KVATTN_CASE_RNG(rng);
      BsrCase bc{M, N, R, C, density, {}};
      bc.base.num_qo_heads = 2;
      bc.base.head_dim_qk = 16;
      run_bsr_case(bc, rng);
    }
}

TEST(BlockSparse, DtypesAndGroups) {
  const DType computes[] = {DType::f32, DType::f16, DType::bf16};
  int n = 0;
  for (DType q : computes)
    for (DType kv : {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2})
      for (int group : {1, 4, 7, 8}) {
        KVATTN_CASE_RNG(rng);
        BsrCase bc{12, 24, 3, 2, 0.5, {}};
        bc.base.num_kv_heads = group == 7 ? 1 : 2;
        bc.base.num_qo_heads = group * bc.base.num_kv_heads;
        bc.base.head_dim_qk = 32;
        bc.base.q_dtype = q;
        bc.base.kv_dtype = kv;
        bc.base.o_dtype = computes[n++ % 3];
        run_bsr_case(bc, rng);
      }
}

TEST(BlockSparse, StridedHeadDimsAndFills) {
  const std::pair<int, int> dims[] = {{8, 8}, {96, 96}, {192, 128}, {256, 256}, {512, 512}};
  for (auto [dqk, dvo] : dims)
    for (Fill fill : {Fill::random, Fill::structured}) {
      KVATTN_CASE_RNG(rng);
      BsrCase bc{8, 16, 2, 4, 0.6, {}};
      bc.base.num_qo_heads = 2;
      bc.base.num_kv_heads = 1;
      bc.base.head_dim_qk = dqk;
      bc.base.head_dim_vo = dvo;
      bc.base.q_dtype = DType::bf16;
      bc.base.strided = true;
      bc.base.fill = fill;
      bc.base.want_lse = fill == Fill::random;
      run_bsr_case(bc, rng);
    }
}

TEST(BlockSparse, Variants) {
  kvattn::RopeConfig llama31;
  llama31.llama31 = kvattn::Llama31Scaling{};
  const kvattn::Variant variants[] = {
      kvattn::variants::causal(),
      kvattn::variants::sliding_window(5),
      kvattn::variants::sliding_window(3, false),
      kvattn::variants::soft_cap(2.5f).with_sm_scale(0.6f),
      kvattn::variants::alibi().with_causal(),
      kvattn::variants::rope(),
      kvattn::variants::rope(llama31).with_causal(),
      kvattn::variants::sigmoid(-1.0f),
      kvattn::variants::sigmoid(0.5f).with_causal(),
      kvattn::Variant{}.with_scales(0.5f, 2.0f, 1.5f)};
  for (const auto& var : variants)
    for (auto [M, N] : {std::pair<int64_t, int64_t>{24, 24}, {8, 40}, {40, 8}}) {
      KVATTN_CASE_RNG(rng);
      BsrCase bc{M, N, 4, 4, 0.7, {}};
      bc.base.num_qo_heads = 7;
      bc.base.num_kv_heads = 1;
      bc.base.head_dim_qk = 32;
      bc.base.q_dtype = DType::f16;
      bc.base.kv_dtype = var.k_scale != 1 ? DType::e4m3 : DType::f16;
      bc.base.variant = var;
      run_bsr_case(bc, rng);
    }
}

// What BlockSparseAttention on the GPU runs (cuda/attention_backend.cpp): a paged prefill where block
// row r is a request of R queries whose pages are its column blocks, C tokens each (last page
// full), over k and v viewed as [N / C, C, Hkv, D]. For variants that do not read positions it is
// the same attention: checked here on the CPU backend, bit for bit, one block row at a time (rows
// with at least one block; the empty rows must come out as zeros with lse -inf). Neither side
// splits KV, so each row's sums run in the same order whatever the batch.
TEST(BlockSparse, IsAPagedPrefillOfColumnBlocks) {
  const std::array<int64_t, 4> shapes[] = {{12, 30, 3, 5}, {32, 64, 16, 1}, {8, 128, 1, 16}, {16, 0, 4, 4}};
  for (auto [M, N, R, C] : shapes)
    for (const auto& var : {kvattn::variants::plain(), kvattn::variants::soft_cap(3.0f), kvattn::variants::sigmoid(0.5f)}) {
      KVATTN_CASE_RNG(rng);
      SCOPED_TRACE("M " + std::to_string(M) + " N " + std::to_string(N) + " R x C " + std::to_string(R) + " x " +
                   std::to_string(C) + " " + var.describe());
      std::vector<int32_t> indptr{0}, indices, last;
      for (int64_t br = 0; br < M / R; ++br) {
        std::vector<int32_t> cols;
        for (int32_t j = 0; j < N / C; ++j)
          if (br != 1 && (rng.coin(0.5) || j < (R + C - 1) / C)) cols.push_back(j);
        rng.shuffle(cols);
        indices.insert(indices.end(), cols.begin(), cols.end());
        indptr.push_back(int32_t(indices.size()));
        last.push_back(cols.empty() ? 0 : int32_t(C));
      }
      std::vector<int32_t> qo_indptr;
      for (int64_t br = 0; br <= M / R; ++br) qo_indptr.push_back(int32_t(br * R));
      HostTensor q = HostTensor::strided(DType::bf16, {M, 4, 32}), k = HostTensor::strided(DType::bf16, {N, 2, 32}),
                 v = HostTensor::strided(DType::bf16, {N, 2, 32});
      for (HostTensor* t : {&q, &k, &v})
        t->for_each([&](int64_t off, const std::vector<int64_t>&) { t->set_at(off, rng.uniform(-2, 2)); });
      HostTensor out_bsr(DType::f32, {M, 4, 32}), out_paged(DType::f32, {M, 4, 32}), lse_bsr(DType::f32, {M, 4}),
          lse_paged(DType::f32, {M, 4});
      for (HostTensor* t : {&out_bsr, &out_paged, &lse_bsr, &lse_paged}) t->poison();
      const bool want_lse = !var.sigmoid;
      kvattn::AttentionShape shape;
      shape.num_qo_heads = 4;
      shape.num_kv_heads = 2;
      shape.head_dim_qk = 32;
      shape.o_dtype = DType::f32;
      shape.variant = var;
      shape.scheduler.disable_split_kv = true;

      HostTensor indptr_t = int32_tensor(indptr), indices_t = int32_tensor(indices), last_t = int32_tensor(last),
                 qo_t = int32_tensor(qo_indptr);
      kvattn::BlockSparsePlan bp;
      static_cast<kvattn::AttentionShape&>(bp) = shape;
      bp.bsr = {indptr_t.view(), indices_t.view(), M, N, R, C};
      kvattn::BlockSparseAttention bsr;
      bsr.plan(bp);
      bsr.run(q.view(), k.view(), v.view(), out_bsr.view(), want_lse ? lse_bsr.view() : kvattn::TensorView{});

      auto as_pages = [&](const HostTensor& t) {
        const kvattn::TensorView x = t.view();
        const int64_t shape4[4] = {N / C, C, x.size(1), x.size(2)};
        const int64_t strides4[4] = {C * x.stride(0), x.stride(0), x.stride(1), x.stride(2)};
        return kvattn::TensorView(x.data(), x.dtype(), 4, shape4, strides4);
      };
      // Rows [br R, (br + 1) R) of a [M, ...] tensor.
      auto rows = [&](const HostTensor& t, int64_t br) {
        const kvattn::TensorView x = t.view();
        const int64_t shape_r[3] = {R, x.size(1), x.ndim() == 3 ? x.size(2) : 1};
        const int64_t strides_r[3] = {x.stride(0), x.stride(1), x.ndim() == 3 ? x.stride(2) : 1};
        auto* p = static_cast<char*>(x.data()) + br * R * x.stride(0) * int64_t(kvattn::dtype_size(x.dtype()));
        return kvattn::TensorView(p, x.dtype(), x.ndim(), shape_r, strides_r);
      };
      for (HostTensor* t : {&out_paged, &lse_paged})
        t->for_each([&](int64_t off, const std::vector<int64_t>&) { t->set_at(off, t == &out_paged ? 0.0 : -std::numeric_limits<double>::infinity()); });
      for (int64_t br = 0; br < M / R; ++br) {
        if (indptr[size_t(br) + 1] == indptr[size_t(br)]) continue;  // stays 0 / -inf
        HostTensor row_indptr = int32_tensor({0, indptr[size_t(br) + 1] - indptr[size_t(br)]});
        HostTensor row_indices = int32_tensor(std::vector<int32_t>(indices.begin() + indptr[size_t(br)],
                                                                   indices.begin() + indptr[size_t(br) + 1]));
        HostTensor row_last = int32_tensor({int32_t(C)}), row_qo = int32_tensor({0, int32_t(R)});
        kvattn::BatchPrefillPlan pp;
        static_cast<kvattn::AttentionShape&>(pp) = shape;
        pp.qo_indptr = row_qo.view();
        pp.page_table = kvattn::PageTable{row_indptr.view(), row_indices.view(), row_last.view()};
        pp.page_size = int(C);
        kvattn::BatchPrefill paged;
        paged.plan(pp);
        paged.run(rows(q, br), kvattn::PagedKVCache::split(as_pages(k), as_pages(v), kvattn::KVLayout::NHD),
                  rows(out_paged, br), want_lse ? rows(lse_paged, br) : kvattn::TensorView{});
      }
      EXPECT_TRUE(out_bsr.same_bytes(out_paged.snapshot())) << "outputs differ";
      if (want_lse) EXPECT_TRUE(lse_bsr.same_bytes(lse_paged.snapshot())) << "lse differ";
    }
}

}  // namespace
}  // namespace kvattn_test
