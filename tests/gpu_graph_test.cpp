// CUDA graphs: BatchDecode::run() captured once (graph-mode plan with a capacity), then, many
// times, plan() for a new batch (size and lengths up to the capacity) and replay. Every replay is
// checked against the float64 reference. Skips where there is no CUDA device.
#include <gtest/gtest.h>

#include "support/attention_case.h"
#include "support/compare.h"
#include "support/device_mirror.h"
#include "support/paged_kv.h"
#include "support/request_pool.h"

#if KVATTN_WITH_CUDA
#include <cuda_runtime_api.h>

namespace kvattn_test {
namespace {

using kvattn::DType;

TEST(GpuGraph, CaptureOnceReplanAndReplay) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  KVATTN_CASE_RNG(rng);
  const int max_batch = 8, hq = 16, hkv = 4, D = 64, P = 16;
  const int64_t max_len = 900;
  // A pool of max_batch requests at max_len; each round uses prefixes of some of them.
  GpuPool g(max_batch, max_len, P, hq, hkv, D, rng);
  auto &pool = g.pool;
  auto &q = g.q, &out = g.out, &lse = g.lse;
  DeviceBytes ws(int64_t(32) << 20);

  kvattn::BatchDecode op(ws.view());
  kvattn::BatchDecodePlan p = pool.decode_plan(hq);
  p.scheduler.cuda_graph = kvattn::GraphCapacity{max_batch, max_batch};
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);

  // Round 0 plans the full capacity and is captured; rounds 1.. re-plan and replay.
  cudaGraphExec_t exec = nullptr;
  for (int round = 0; round < 25; ++round) {
    const int B = round == 0 ? max_batch : int(rng.integer(1, max_batch));
    std::vector<int64_t> lens;
    for (int b = 0; b < B; ++b) {
      int64_t len = round == 0 ? max_len : rng.integer(0, max_len);
      if (rng.coin(0.1)) len = max_len;
      lens.push_back(len);
    }
    const auto table = pool.page_table(lens);
    p.page_table = table.view();
    for (int64_t i = 0; i < B * hq * D; ++i) g.qd[size_t(i)] = [&] {
      q.set_at(i, rng.normal());
      return q.get_at(i);
    }();
    ASSERT_EQ(cudaMemcpy(const_cast<void*>(g.dq.view().data()), q.view().data(), size_t(B * hq * D * 2),
                         cudaMemcpyHostToDevice), cudaSuccess);
    out.poison();
    lse.poison();
    ASSERT_EQ(cudaMemcpy(g.dout.view().data(), out.view().data(), size_t(max_batch * hq * D * 2),
                         cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(g.dlse.view().data(), lse.view().data(), size_t(max_batch * hq * 4),
                         cudaMemcpyHostToDevice), cudaSuccess);
    op.plan(p, stream);
    if (round == 0) {
      cudaGraph_t graph;
      ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
      op.run(g.dq.view(), g.cache, g.dout.view(), g.dlse.view(), stream);
      ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      cudaGraphDestroy(graph);
    }
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    g.dout.copy_back(out);
    g.dlse.copy_back(lse);

    HostTensor out_b(DType::bf16, {B, hq, D}), lse_b(DType::f32, {B, hq});
    out_b.poison();
    lse_b.poison();
    const auto ref = pool.decode_reference(lens, g.qd.data(), hq);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < hq; ++h) {
        lse_b.set({b, h}, lse.get({b, h}));
        for (int e = 0; e < D; ++e) out_b.set({b, h, e}, out.get({b, h, e}));
      }
    ComputeTolerance tol;
    tol.accumulation = 0x1p-8;  // tensor-core path: weights rounded to bf16
    SCOPED_TRACE("round " + std::to_string(round) + ", batch " + std::to_string(B));
    EXPECT_TRUE(outputs_match(out_b, ref.o, ref.mag, tol));
    EXPECT_TRUE(lse_match(lse_b, ref.lse, tol));
    // Rows past the batch are not written.
    for (int64_t i = B * hq * D; i < max_batch * hq * D; ++i)
      ASSERT_TRUE(out.is_poison_at(i)) << "row past the batch written at element " << i;
  }
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace kvattn_test

#else
TEST(GpuGraph, CaptureOnceReplanAndReplay) { GTEST_SKIP() << "this build has no CUDA backend"; }
#endif
