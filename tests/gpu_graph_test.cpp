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
  RequestPool pool(max_batch, max_len, P, hkv, D, rng);
  DeviceMirror dk(pool.cache.k), dv(pool.cache.v);
  auto cache = kvattn::PagedKVCache::split(dk.view(), dv.view(), kvattn::KVLayout::NHD);
  HostTensor q(DType::bf16, {max_batch, hq, D}), out(DType::bf16, {max_batch, hq, D}),
      lse(DType::f32, {max_batch, hq});
  std::vector<double> qd(size_t(max_batch * hq * D));
  DeviceMirror dq(q), dout(out), dlse(lse);
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
    std::vector<int32_t> indptr{0}, indices, last;
    std::vector<int64_t> lens;
    for (int b = 0; b < B; ++b) {
      int64_t len = round == 0 ? max_len : rng.integer(0, max_len);
      if (rng.coin(0.1)) len = max_len;
      lens.push_back(len);
      int64_t pages = (len + P - 1) / P;
      const auto& own = pool.cache.pages_of(size_t(b));
      indices.insert(indices.end(), own.begin(), own.begin() + pages);
      indptr.push_back(int32_t(indices.size()));
      last.push_back(int32_t(pages ? len - (pages - 1) * P : 0));
    }
    HostTensor ti = int32_tensor(indptr), tx = int32_tensor(indices), tl = int32_tensor(last);
    p.page_table = {ti.view(), tx.view(), tl.view()};
    for (int64_t i = 0; i < B * hq * D; ++i) qd[size_t(i)] = [&] {
      q.set_at(i, rng.normal());
      return q.get_at(i);
    }();
    ASSERT_EQ(cudaMemcpy(const_cast<void*>(dq.view().data()), q.view().data(), size_t(B * hq * D * 2),
                         cudaMemcpyHostToDevice), cudaSuccess);
    out.poison();
    lse.poison();
    ASSERT_EQ(cudaMemcpy(dout.view().data(), out.view().data(), size_t(max_batch * hq * D * 2),
                         cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dlse.view().data(), lse.view().data(), size_t(max_batch * hq * 4),
                         cudaMemcpyHostToDevice), cudaSuccess);
    op.plan(p, stream);
    if (round == 0) {
      cudaGraph_t graph;
      ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
      op.run(dq.view(), cache, dout.view(), dlse.view(), stream);
      ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      cudaGraphDestroy(graph);
    }
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    dout.copy_back(out);
    dlse.copy_back(lse);

    HostTensor out_b(DType::bf16, {B, hq, D}), lse_b(DType::f32, {B, hq});
    out_b.poison();
    lse_b.poison();
    const auto ref = pool.decode_reference(lens, qd.data(), hq);
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
