// plan() stages its work list in two pinned buffers used in turn (cuda/plan_staging.h); a buffer
// is reused once the copy made from it two plans ago has finished. Here the host plans ahead of a
// stream stalled for 50 ms, so the third plan() must wait for the first one's copy (and the rest
// queue behind it), with staged plans from a few KB to 40 KB (page size 1: a page id per token).
// Every run is checked against the float64 reference: a buffer reused too early would hand an
// earlier run a later plan. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

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

void CUDART_CB stall_stream(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }

TEST(GpuPlanStaging, PlansRunAheadOfAStalledStream) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  KVATTN_CASE_RNG(rng);
  // Page size 1: a page id per token, so a full batch stages 8 x 1200 ids (38 KB) and a
  // one-request batch a few KB.
  const int max_batch = 8, hq = 16, hkv = 4, D = 64, P = 1, rounds = 13;
  const int64_t max_len = 1200;
  RequestPool pool(max_batch, max_len, P, hkv, D, rng);
  DeviceMirror dk(pool.cache.k), dv(pool.cache.v);
  auto cache = kvattn::PagedKVCache::split(dk.view(), dv.view(), kvattn::KVLayout::NHD);

  struct Round {
    std::vector<int64_t> lens;
    std::unique_ptr<RequestPool::PageTable> table;  // kept alive: plan() reads the host page table
    std::vector<double> q;
    std::unique_ptr<HostTensor> hq_t, out, lse;
    std::unique_ptr<DeviceMirror> dq, dout, dlse;
  };
  std::vector<Round> all(rounds);
  for (int r = 0; r < rounds; ++r) {
    Round& R = all[size_t(r)];
    // Round 0 and every third: the full batch; round 1: one request.
    const int B = r % 3 == 0 ? max_batch : r == 1 ? 1 : int(rng.integer(1, max_batch));
    for (int b = 0; b < B; ++b) R.lens.push_back(r % 3 == 0 ? max_len : rng.integer(1, max_len));
    R.table = std::make_unique<RequestPool::PageTable>(pool.page_table(R.lens));
    R.hq_t = std::make_unique<HostTensor>(DType::bf16, std::vector<int64_t>{B, hq, D});
    R.q.resize(size_t(B * hq * D));
    for (int64_t i = 0; i < B * hq * D; ++i) {
      R.hq_t->set_at(i, rng.normal());
      R.q[size_t(i)] = R.hq_t->get_at(i);
    }
    R.out = std::make_unique<HostTensor>(DType::bf16, std::vector<int64_t>{B, hq, D});
    R.lse = std::make_unique<HostTensor>(DType::f32, std::vector<int64_t>{B, hq});
    R.out->poison();
    R.lse->poison();
    R.dq = std::make_unique<DeviceMirror>(*R.hq_t);
    R.dout = std::make_unique<DeviceMirror>(*R.out);
    R.dlse = std::make_unique<DeviceMirror>(*R.lse);
  }

  DeviceBytes ws(int64_t(64) << 20);
  kvattn::BatchDecode op(ws.view());
  kvattn::BatchDecodePlan p = pool.decode_plan(hq);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  // The kernels are compiled or loaded before the stream stalls.
  p.page_table = all[0].table->view();
  op.plan(p, stream);
  op.run(all[0].dq->view(), cache, all[0].dout->view(), all[0].dlse->view(), stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  all[0].dout->upload();  // poisoned again: round 0 runs below too
  all[0].dlse->upload();

  // The stream sleeps 50 ms before any of these copies; the third plan() must wait for the first
  // one's copy, while the runs queue up behind them.
  ASSERT_EQ(cudaLaunchHostFunc(stream, stall_stream, nullptr), cudaSuccess);
  for (int r = 0; r < rounds; ++r) {
    Round& R = all[size_t(r)];
    p.page_table = R.table->view();
    op.plan(p, stream);
    op.run(R.dq->view(), cache, R.dout->view(), R.dlse->view(), stream);
    if (r == 1) EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady) << "the stream did not stall";
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);

  for (int r = 0; r < rounds; ++r) {
    Round& R = all[size_t(r)];
    R.dout->copy_back(*R.out);
    R.dlse->copy_back(*R.lse);
    const auto ref = pool.decode_reference(R.lens, R.q.data(), hq);
    ComputeTolerance tol;
    tol.accumulation = 0x1p-8;  // weights rounded to bf16 for the tensor-core P V
    SCOPED_TRACE("round " + std::to_string(r) + ", batch " + std::to_string(R.lens.size()));
    EXPECT_TRUE(outputs_match(*R.out, ref.o, ref.mag, tol));
    EXPECT_TRUE(lse_match(*R.lse, ref.lse, tol));
  }
}

}  // namespace
}  // namespace kvattn_test

#else
TEST(GpuPlanStaging, PlansRunAheadOfAStalledStream) { GTEST_SKIP() << "this build has no CUDA backend"; }
#endif
