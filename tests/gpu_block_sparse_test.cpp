// BlockSparseAttention on the GPU (the batch prefill kernels, a block row as a request whose pages
// are its C-token column blocks) against the float64 reference: R x C from 1 x 1 to 64 x 64 and
// non-powers of two, random block patterns in random order with empty block rows, GQA groups,
// f16/bf16 (fp8 KV with scales), head dims 64, 128 and 192 x 128, the variants that do not depend
// on positions, LSE on and off, strided views, split schedules and CUDA-graph replays. The
// position-dependent variants (causal, window, ALiBi, RoPE) are plan() errors on the GPU; those and
// the argument checks that precede any CUDA call run on every machine (the cases without
// SKIP_WITHOUT_GPU, on made-up device addresses that are never dereferenced).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>

#include "reference/reference.h"
#include "support/attention_case.h"
#include "support/compare.h"
#include "support/device_mirror.h"
#include "support/expect_error.h"
#include "support/gpu_skip.h"
#include "support/host_tensor.h"
#include "support/paged_kv.h"
#include "support/variant_examples.h"

#if KVATTN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvattn_test {
namespace {

using kvattn::DType;

struct GpuBsrCase {
  int64_t M = 64, N = 256, R = 16, C = 16;
  double density = 0.5;   // probability that a block is present
  bool empty_row = true;  // block row 1 (when there is one) lists no column block
  AttnCase base;          // heads, dims, dtypes, variant, strided, want_lse, fill, scheduler, tolerance
};

// The BSR pattern: each block row lists its present column blocks in random order.
void random_pattern(const GpuBsrCase& bc, Rng& rng, std::vector<int32_t>& indptr, std::vector<int32_t>& indices) {
  indptr = {0};
  indices.clear();
  for (int64_t br = 0; br < bc.M / bc.R; ++br) {
    std::vector<int32_t> cols;
    for (int32_t j = 0; j < bc.N / bc.C; ++j)
      if (!(bc.empty_row && br == 1) && rng.coin(bc.density)) cols.push_back(j);
    rng.shuffle(cols);
    indices.insert(indices.end(), cols.begin(), cols.end());
    indptr.push_back(int32_t(indices.size()));
  }
}

// The tensor-core kernels round the softmax weights to q's dtype before P V (gpu_prefill_test.cpp).
AttnCase gpu_bsr_base(DType q, std::optional<DType> kv = {}) {
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

#if KVATTN_WITH_CUDA
void run_gpu_bsr_case(const GpuBsrCase& bc, Rng& rng) {
  const AttnCase& c = bc.base;
  SCOPED_TRACE("bsr M " + std::to_string(bc.M) + " N " + std::to_string(bc.N) + " R x C " + std::to_string(bc.R) +
               " x " + std::to_string(bc.C) + " density " + std::to_string(bc.density) + ", " + c.describe());
  const int hq = c.num_qo_heads, hkv = c.num_kv_heads, dqk = c.head_dim_qk, dvo = c.dvo();
  const bool want_lse = c.want_lse && !c.variant.sigmoid;
  std::vector<int32_t> indptr, indices;
  random_pattern(bc, rng, indptr, indices);
  std::vector<int32_t> indices_buf = indices;
  indices_buf.push_back(-7);  // past indptr[-1]: never read

  // q, out, lse may have any padding; K/V rows stay 16-byte aligned (what the kernels copy).
  auto make = [&](DType t, std::vector<int64_t> shape, bool kv) {
    HostTensor x = !c.strided ? HostTensor(t, std::move(shape))
                   : kv       ? HostTensor::strided_aligned(t, std::move(shape))
                              : HostTensor::strided(t, std::move(shape));
    x.poison();
    return x;
  };
  HostTensor q = make(c.q_dtype, {bc.M, hq, dqk}, false), k = make(c.kv(), {bc.N, hkv, dqk}, true),
             v = make(c.kv(), {bc.N, hkv, dvo}, true), out = make(c.out(), {bc.M, hq, dvo}, false),
             lse = make(DType::f32, {bc.M, hq}, false);
  std::vector<double> qd, kd, vd;
  auto fill = [&](HostTensor& t, char what, std::vector<double>& dst) {
    t.for_each([&](int64_t off, const std::vector<int64_t>& i) {
      t.set_at(off, fill_value(c.fill, what, i[0], int(i[1]), int(i[2]), rng));
      dst.push_back(t.get_at(off));
    });
  };
  fill(q, 'q', qd);
  fill(k, 'k', kd);
  fill(v, 'v', vd);

  HostTensor indptr_t = int32_tensor(indptr), indices_t = int32_tensor(indices_buf);
  kvattn::BlockSparsePlan p;
  static_cast<kvattn::AttentionShape&>(p) = shape_of(c);
  p.scheduler = c.scheduler;
  p.bsr = {indptr_t.view(), indices_t.view(), bc.M, bc.N, bc.R, bc.C};
  DeviceBytes workspace(int64_t(256) << 20);
  DeviceMirror dq(q), dk(k), dv(v), dout(out), dlse(lse);
  kvattn::BlockSparseAttention op(workspace.view());
  op.plan(p);
  ASSERT_NE(op.schedule(), nullptr);
  op.run(dq.view(), dk.view(), dv.view(), dout.view(), want_lse ? dlse.view() : kvattn::TensorView{});
  device_synchronize();
  dout.copy_back(out);
  dlse.copy_back(lse);

  ref::Request r{bc.M, bc.N, hq, hkv, dqk, dvo, qd.data(), kd.data(), vd.data(), bc.N - bc.M,
                 ref::bsr_pattern(indptr, indices, bc.R, bc.C)};
  ref::Result res = ref::attention(r, c.variant);
  const ComputeTolerance tol = approx_tanh_may_run(true) ? allow_approx_tanh(c.tolerance, c.variant) : c.tolerance;
  EXPECT_TRUE(outputs_match(out, res.o, res.o_mag, tol));
  if (want_lse) EXPECT_TRUE(lse_match(lse, res.lse, tol));
  else EXPECT_TRUE(padding_untouched(lse, "lse (not requested)"));
  int64_t lse_written = 0;
  if (!want_lse) lse.for_each([&](int64_t off, const std::vector<int64_t>&) { lse_written += !lse.is_poison_at(off); });
  EXPECT_EQ(lse_written, 0) << "lse was written although not requested";
}
#else
void run_gpu_bsr_case(const GpuBsrCase&, Rng&) { FAIL() << "GPU case in a build without the CUDA backend"; }
#endif

TEST(GpuBlockSparse, BlockShapes) {
  SKIP_WITHOUT_GPU();
  const std::array<int64_t, 4> shapes[] = {  // M, N, R, C
      {37, 300, 1, 1}, {64, 200, 16, 1}, {20, 320, 1, 16}, {96, 512, 16, 16},
      {40, 1024, 4, 64}, {128, 1024, 64, 64}, {30, 155, 3, 5}, {48, 160, 16, 5}, {45, 40, 3, 5}};
  for (auto [M, N, R, C] : shapes)
    for (double density : {0.4, 1.0}) {
      KVATTN_CASE_RNG(rng);
      GpuBsrCase bc{M, N, R, C, density, density < 1, gpu_bsr_base(DType::bf16)};
      run_gpu_bsr_case(bc, rng);
    }
}

TEST(GpuBlockSparse, DtypesGroupsHeadDims) {
  SKIP_WITHOUT_GPU();
  const std::pair<int, int> dims[] = {{64, 64}, {128, 128}, {192, 128}};
  int n = 0;
  for (DType q : {DType::f16, DType::bf16})
    for (int group : {1, 4})
      for (auto [dqk, dvo] : dims) {
        KVATTN_CASE_RNG(rng);
        GpuBsrCase bc{48, 320, 16, 16, 0.5, true, gpu_bsr_base(q)};
        if (n % 3 == 1) bc = GpuBsrCase{60, 250, 3, 5, 0.5, true, gpu_bsr_base(q)};
        bc.base.num_kv_heads = 2;
        bc.base.num_qo_heads = 2 * group;
        bc.base.head_dim_qk = dqk;
        bc.base.head_dim_vo = dvo;
        bc.base.o_dtype = (n++ % 3 == 2) ? DType::f32 : q;
        run_gpu_bsr_case(bc, rng);
      }
}

TEST(GpuBlockSparse, Variants) {
  SKIP_WITHOUT_GPU();
  const kvattn::Variant variants[] = {
      kvattn::variants::plain(),
      kvattn::variants::soft_cap(2.5f).with_sm_scale(0.6f),
      kvattn::variants::sigmoid(-1.0f),
      kvattn::variants::sigmoid(0.5f).with_sm_scale(0.5f),
      kvattn::Variant{}.with_scales(0.5f, 2.0f, 1.5f),
      kvattn::Variant{}.with_sm_scale(0.3f).with_scales(1.5f, 0.5f, 2.0f),
  };
  for (const auto& var : variants)
    for (DType kv : {DType::f16, DType::e4m3}) {
      KVATTN_CASE_RNG(rng);
      GpuBsrCase bc{48, 200, 4, 8, 0.6, true, gpu_bsr_base(DType::f16, kv)};
      bc.base.variant = var;
      SCOPED_TRACE(var.describe());
      run_gpu_bsr_case(bc, rng);
    }
}

TEST(GpuBlockSparse, EmptyRowsAndShapes) {
  SKIP_WITHOUT_GPU();
  const std::array<int64_t, 4> shapes[] = {{32, 64, 16, 16}, {0, 64, 16, 16}, {32, 0, 16, 16}, {0, 0, 1, 1},
                                           {5, 7, 5, 7}};
  for (auto [M, N, R, C] : shapes)
    for (double density : {0.0, 0.5}) {
      KVATTN_CASE_RNG(rng);
      GpuBsrCase bc{M, N, R, C, density, true, gpu_bsr_base(DType::bf16)};
      run_gpu_bsr_case(bc, rng);
    }
}

TEST(GpuBlockSparse, StridedLseOffAndFills) {
  SKIP_WITHOUT_GPU();
  for (bool want_lse : {false, true})
    for (Fill fill : {Fill::random, Fill::structured, Fill::ones}) {
      KVATTN_CASE_RNG(rng);
      GpuBsrCase bc{48, 240, 16, 8, 0.5, true, gpu_bsr_base(DType::bf16)};
      bc.base.strided = true;
      bc.base.want_lse = want_lse;
      bc.base.fill = fill;
      run_gpu_bsr_case(bc, rng);
    }
}

TEST(GpuBlockSparse, SplitSchedulesMatch) {
  SKIP_WITHOUT_GPU();
  // A dense block row of 2048 keys beside sparse ones: many small KV chunks (merged), no split,
  // few workers; softmax and sigmoid merges.
  for (const auto& var : {kvattn::variants::plain(), kvattn::variants::sigmoid()})
    for (int mode = 0; mode < 3; ++mode) {
      KVATTN_CASE_RNG(rng);
      GpuBsrCase bc{64, 2048, 16, 32, 0.3, true, gpu_bsr_base(DType::bf16)};
      bc.base.num_qo_heads = 16;
      bc.base.num_kv_heads = 4;
      bc.base.head_dim_qk = 128;
      bc.base.variant = var;
      if (mode == 0) bc.base.scheduler.fixed_split_size = 64;
      if (mode == 1) bc.base.scheduler.disable_split_kv = true;
      if (mode == 2) bc.base.scheduler.num_workers = 5;
      SCOPED_TRACE(var.describe() + " mode " + std::to_string(mode));
      run_gpu_bsr_case(bc, rng);
    }
}

// ---- errors ---------------------------------------------------------------------------------------

// A 2 x 2 pattern of 4 x 4 blocks (M 8, N 8) with 8/2 heads of dim 64, f16.
kvattn::BlockSparsePlan small_plan(const HostTensor& indptr, const HostTensor& indices) {
  kvattn::BlockSparsePlan p;
  p.num_qo_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim_qk = 64;
  p.q_dtype = DType::f16;
  p.bsr = {indptr.view(), indices.view(), 8, 8, 4, 4};
  return p;
}

// A view of a tensor's shape and strides on cuda:0 at a made-up address: enough for the checks that
// run before any CUDA call, never dereferenced.
kvattn::TensorView fake_cuda(const HostTensor& t) {
  kvattn::TensorView h = t.view();
  return kvattn::TensorView(reinterpret_cast<void*>(uintptr_t(1) << 40), h.dtype(), h.ndim(), h.shape(),
                            h.strides(), kvattn::Device::cuda(0));
}

TEST(GpuBlockSparse, PositionDependentVariantsAreRejected) {
  // plan() checks the variant before any CUDA call: this runs without a device.
  HostTensor indptr = int32_tensor({0, 1, 2}), indices = int32_tensor({1, 0}), ws(DType::u8, {16});
  kvattn::BlockSparseAttention op(fake_cuda(ws));
  kvattn::BlockSparsePlan p = small_plan(indptr, indices);
  const std::pair<kvattn::Variant, const char*> rejected[] = {
      {kvattn::variants::causal(), "does not support the causal mask (variant causal)"},
      {kvattn::variants::sliding_window(5), "does not support the causal mask, sliding window"},
      {kvattn::variants::sliding_window(3, false), "does not support the sliding window (variant window(3))"},
      {kvattn::variants::alibi(), "does not support the ALiBi bias (variant alibi)"},
      {kvattn::variants::rope(), "does not support the fused RoPE"},
      {kvattn::variants::soft_cap(3.0f).with_alibi().with_rope(), "does not support the ALiBi bias, fused RoPE"},
      // A user variant's hooks are told positions too.
      {kvattn::Variant{}.with_custom(example("soft_cap", {"cap"}), {.f32 = {{"cap", 2.0f}}}),
       "does not support the user variant (variant custom(soft_cap))"},
  };
  for (const auto& [var, msg] : rejected) {
    p.variant = var;
    SCOPED_TRACE(var.describe());
    EXPECT_KVATTN_ERROR(op.plan(p), msg);
    EXPECT_KVATTN_ERROR(op.plan(p), "BlockSparseAttention on the GPU");
    EXPECT_KVATTN_ERROR(op.plan(p), "not at its absolute index j");
  }
  EXPECT_EQ(op.schedule(), nullptr) << "a rejected plan() left a plan behind";
  // The CPU backend runs them (block_sparse_test.cpp): no workspace, no error.
  kvattn::BlockSparseAttention cpu;
  p.variant = kvattn::variants::causal().with_rope();
  EXPECT_NO_THROW(cpu.plan(p));
}

TEST(GpuBlockSparse, PlanArgumentsAreCheckedFirst) {
  // The BSR checks run before the GPU scheduling, with the same messages as on the CPU.
  HostTensor indptr = int32_tensor({0, 1, 2}), indices = int32_tensor({1, 0}), ws(DType::u8, {16});
  HostTensor out_of_range = int32_tensor({1, 2}), decreasing = int32_tensor({0, 2, 1});
  kvattn::BlockSparseAttention op(fake_cuda(ws));
  kvattn::BlockSparsePlan p = small_plan(indptr, indices);
  p.bsr.indices = out_of_range.view();
  EXPECT_KVATTN_ERROR(op.plan(p), "bsr indices[1] = 2 is out of range [0, 2)");
  p = small_plan(indptr, indices);
  p.bsr.indptr = decreasing.view();
  EXPECT_KVATTN_ERROR(op.plan(p), "bsr indptr is not non-decreasing at 2: bsr indptr[1] = 2, bsr indptr[2] = 1");
  p = small_plan(indptr, indices);
  p.bsr.M = 6;
  EXPECT_KVATTN_ERROR(op.plan(p), "bsr M = 6 is not a multiple of R = 4");
  p = small_plan(indptr, indices);
  p.variant = kvattn::variants::custom_mask();
  EXPECT_KVATTN_ERROR(op.plan(p), "custom_mask is not supported by BlockSparseAttention");
  p = small_plan(indptr, indices);
  p.bsr.indptr = fake_cuda(indptr);
  EXPECT_KVATTN_ERROR(op.plan(p), "bsr indptr must be on the host (cpu), got cuda:0");
}

TEST(GpuBlockSparse, RunArgumentsAreCheckedFirst) {
  // Planned for the CPU, run with CUDA tensors: shapes and dtypes are checked first, then q's device
  // against the plan's (a CPU plan's q on cuda:0 is the argument at fault, whatever the others'
  // devices), before the backend is chosen.
  HostTensor indptr = int32_tensor({0, 1, 2}), indices = int32_tensor({1, 0});
  kvattn::BlockSparseAttention op;
  op.plan(small_plan(indptr, indices));
  HostTensor q(DType::f16, {8, 8, 64}), k(DType::f16, {8, 2, 64}), out(DType::f16, {8, 8, 64}),
      lse(DType::f32, {8, 8}), q7(DType::f16, {7, 8, 64}), k_bf16(DType::bf16, {8, 2, 64}),
      k9(DType::f16, {9, 2, 64});
  const auto dq = fake_cuda(q), dk = fake_cuda(k), dout = fake_cuda(out), dlse = fake_cuda(lse);
  EXPECT_KVATTN_ERROR(op.run(fake_cuda(q7), dk, dk, dout), "q.shape[0] = 7 but bsr M = 8");
  EXPECT_KVATTN_ERROR(op.run(dq, fake_cuda(k9), dk, dout), "k.shape[0] = 9 but bsr N = 8");
  EXPECT_KVATTN_ERROR(op.run(dq, dk, fake_cuda(k_bf16), dout), "v has dtype bf16 but the plan was made for kv_dtype = f16");
  const char* planned_for_cpu = "q is on cuda:0 but BlockSparseAttention was planned for the CPU";
  EXPECT_KVATTN_ERROR(op.run(dq, k.view(), dk, dout, dlse), planned_for_cpu);
  EXPECT_KVATTN_ERROR(op.run(dq, dk, dk, dout, lse.view()), planned_for_cpu);
  EXPECT_KVATTN_ERROR(op.run(dq, dk, dk, out.view()), planned_for_cpu);
  EXPECT_KVATTN_ERROR(op.run(dq, dk, dk, dout, dlse), planned_for_cpu);
  // Host q with a CUDA k: the CPU backend runs, and k is the one elsewhere.
  EXPECT_KVATTN_ERROR(op.run(q.view(), dk, k.view(), out.view()), "k is on cuda:0 but q is on cpu");
}

#if KVATTN_WITH_CUDA
// Runs `op` on device mirrors of the small problem, out poisoned, and returns the output bytes.
std::vector<uint8_t> run_small(const kvattn::BlockSparseAttention& op, const DeviceMirror& q, const DeviceMirror& k,
                               HostTensor& out) {
  out.poison();
  DeviceMirror dout(out);
  op.run(q.view(), k.view(), k.view(), dout.view());
  device_synchronize();
  dout.copy_back(out);
  return out.snapshot();
}
#endif

TEST(GpuBlockSparse, ErrorsAndFailedPlanKeepsThePreviousPlan) {
  SKIP_WITHOUT_GPU();
#if KVATTN_WITH_CUDA
  KVATTN_CASE_RNG(rng);
  HostTensor indptr = int32_tensor({0, 1, 2}), indices = int32_tensor({1, 0});
  HostTensor q(DType::f16, {8, 8, 64}), k(DType::f16, {8, 2, 64}), out(DType::f16, {8, 8, 64});
  q.for_each([&](int64_t off, const std::vector<int64_t>&) { q.set_at(off, rng.uniform(-1, 1)); });
  k.for_each([&](int64_t off, const std::vector<int64_t>&) { k.set_at(off, rng.uniform(-1, 1)); });
  DeviceMirror dq(q), dk(k), dout(out);
  DeviceBytes ws(int64_t(64) << 20), tiny(16);
  kvattn::BlockSparseAttention op(ws.view());
  kvattn::BlockSparsePlan p = small_plan(indptr, indices);
  op.plan(p);
  const auto good = run_small(op, dq, dk, out);
  EXPECT_GT(op.schedule()->num_items(), 0);

  // Failed plans: rejected variant, unsupported dtype and head dim (the runner), too small a workspace.
  p.variant = kvattn::variants::causal();
  EXPECT_KVATTN_ERROR(op.plan(p), "BlockSparseAttention on the GPU does not support the causal mask");
  p = small_plan(indptr, indices);
  p.q_dtype = DType::f32;
  EXPECT_KVATTN_ERROR(op.plan(p), "q_dtype f32 is not supported by the GPU prefill kernels");
  p = small_plan(indptr, indices);
  p.head_dim_qk = 512;
  EXPECT_KVATTN_ERROR(op.plan(p), "head dim 512 is not supported by the GPU prefill kernels");
  kvattn::BlockSparseAttention small(tiny.view());
  EXPECT_KVATTN_ERROR(small.plan(small_plan(indptr, indices)), "the workspace is too small");
  EXPECT_EQ(run_small(op, dq, dk, out), good) << "a failed plan() changed the previous plan";

  // Misaligned K/V rows: an error before any launch, out untouched.
  HostTensor k_pad = HostTensor::strided(DType::f16, {8, 2, 64});
  k_pad.poison();
  DeviceMirror dk_pad(k_pad);
  EXPECT_KVATTN_ERROR(op.run(dq.view(), dk_pad.view(), dk.view(), dout.view()),
                      "the GPU prefill kernels copy 16-byte pieces of each row");
#endif
}

TEST(GpuBlockSparse, GraphCaptureOnceReplanAndReplay) {
  SKIP_WITHOUT_GPU();
#if KVATTN_WITH_CUDA
  // Round 0 plans every block and is captured; later rounds re-plan other patterns (fewer or more
  // blocks, empty rows) and replay the graph.
  KVATTN_CASE_RNG(rng);
  const int hq = 8, hkv = 2, D = 64;
  const int64_t M = 64, N = 512, R = 16, C = 16;
  HostTensor q(DType::bf16, {M, hq, D}), k(DType::bf16, {N, hkv, D}), v(DType::bf16, {N, hkv, D}),
      out(DType::bf16, {M, hq, D}), lse(DType::f32, {M, hq});
  for (HostTensor* t : {&q, &k, &v, &out, &lse}) t->poison();
  DeviceMirror dq(q), dk(k), dv(v), dout(out), dlse(lse);
  DeviceBytes ws(int64_t(64) << 20);
  kvattn::BlockSparseAttention op(ws.view());
  kvattn::BlockSparsePlan p;
  p.num_qo_heads = hq;
  p.num_kv_heads = hkv;
  p.head_dim_qk = D;
  p.variant = kvattn::variants::soft_cap(5.0f);
  p.scheduler.cuda_graph = kvattn::GraphCapacity{int32_t(M / R), M};
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  auto upload = [&](const HostTensor& h, const DeviceMirror& d) {  // every byte, as the mirror holds them
    char* base = static_cast<char*>(d.view().data()) - h.view_byte_offset();
    ASSERT_EQ(cudaMemcpy(base, h.raw_bytes().data(), h.raw_bytes().size(), cudaMemcpyHostToDevice), cudaSuccess);
  };
  cudaGraphExec_t exec = nullptr;
  for (int round = 0; round < 8; ++round) {
    GpuBsrCase bc{M, N, R, C, round == 0 ? 1.0 : rng.uniform(0, 1), round % 2 == 1, {}};
    std::vector<int32_t> indptr, indices;
    random_pattern(bc, rng, indptr, indices);
    std::vector<double> qd, kd, vd;
    auto fill = [&](HostTensor& t, char what, std::vector<double>& dst) {
      t.for_each([&](int64_t off, const std::vector<int64_t>& i) {
        t.set_at(off, fill_value(Fill::random, what, i[0], int(i[1]), int(i[2]), rng));
        dst.push_back(t.get_at(off));
      });
    };
    fill(q, 'q', qd);
    fill(k, 'k', kd);
    fill(v, 'v', vd);
    out.poison();
    lse.poison();
    for (auto [h, d] : {std::pair{&q, &dq}, {&k, &dk}, {&v, &dv}, {&out, &dout}, {&lse, &dlse}}) upload(*h, *d);
    HostTensor indptr_t = int32_tensor(indptr), indices_t = int32_tensor(indices);
    p.bsr = {indptr_t.view(), indices_t.view(), M, N, R, C};
    op.plan(p, stream);
    if (round == 0) {
      cudaGraph_t graph;
      ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
      op.run(dq.view(), dk.view(), dv.view(), dout.view(), dlse.view(), stream);
      ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      cudaGraphDestroy(graph);
    }
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    dout.copy_back(out);
    dlse.copy_back(lse);
    ref::Request r{M, N, hq, hkv, D, D, qd.data(), kd.data(), vd.data(), N - M, ref::bsr_pattern(indptr, indices, R, C)};
    ref::Result res = ref::attention(r, p.variant);
    ComputeTolerance tol;
    tol.accumulation = 0x1p-8;
    if (approx_tanh_may_run(true)) tol = allow_approx_tanh(tol, p.variant);
    SCOPED_TRACE("round " + std::to_string(round) + ", " + std::to_string(indices.size()) + " blocks");
    EXPECT_TRUE(outputs_match(out, res.o, res.o_mag, tol));
    EXPECT_TRUE(lse_match(lse, res.lse, tol));
  }
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(stream);
#endif
}

}  // namespace
}  // namespace kvattn_test
