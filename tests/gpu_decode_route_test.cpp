// BatchDecode's choice of kernel family by batch (cuda::decode_uses_prefill_kernels): on sm_90+,
// long batches of GQA decode run on the prefill kernels' decode shape and short ones on the decode
// kernels. One BatchDecode object plans long and short batches in turn, so its plans move between
// the families and back (reusing the runner kept aside); every run is checked against the float64
// reference. Skips where there is no CUDA device.
#include <gtest/gtest.h>

#include "support/attention_case.h"
#include "support/compare.h"
#include "support/device_mirror.h"
#include "support/paged_kv.h"
#include "support/request_pool.h"
#include "support/scoped_override.h"

#if KVATTN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/decode_kernels.h"
#include "cuda/decode_runner.h"

namespace kvattn_test {
namespace {

using kvattn::DType;

TEST(GpuDecodeRoute, LongAndShortBatchesOnOneObject) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  ScopedOverride auto_route("KVATTN_DECODE_KERNEL", nullptr);
  KVATTN_CASE_RNG(rng);
  // 32 requests x 4 KV heads = 128 (request, KV head) pairs: the fewest the long route takes.
  const int max_batch = 32, hq = 16, hkv = 4, D = 128, P = 16;
  const int64_t max_len = 3000, long_min = kvattn::cuda::kLongDecodeMeanTokens;
  GpuPool g(max_batch, max_len, P, hq, hkv, D, rng);
  auto &pool = g.pool;
  auto &q = g.q, &out = g.out, &lse = g.lse;
  DeviceBytes ws(int64_t(64) << 20);
  const bool bulk = kvattn::cuda::device_has_bulk_decode(0);

  kvattn::BatchDecode op(ws.view());
  kvattn::BatchDecodePlan p = pool.decode_plan(hq);
  // Rounds 0-6 alternate long and short batches; round 7 is a short batch in CUDA-graph mode right
  // after a long one (an eager plan captured nothing, so moving families there is allowed).
  for (int round = 0; round < 8; ++round) {
    const bool long_batch = round % 2 == 0, graph = round == 7;
    if (graph) p.scheduler.cuda_graph = kvattn::GraphCapacity{max_batch, max_batch};
    std::vector<int64_t> lens;
    for (int b = 0; b < max_batch; ++b)
      lens.push_back(long_batch ? rng.integer(long_min, max_len) : rng.integer(0, 900));
    const auto table = pool.page_table(lens);
    p.page_table = table.view();
    for (int64_t i = 0; i < max_batch * hq * D; ++i) {
      q.set_at(i, rng.normal());
      g.qd[size_t(i)] = q.get_at(i);
    }
    g.dq.upload();
    out.poison();
    lse.poison();
    g.dout.upload();
    g.dlse.upload();
    op.plan(p);
    const bool on_prefill = op.kernel_family() == "prefill";
    ASSERT_TRUE(on_prefill || op.kernel_family() == "decode") << op.kernel_family();
    // Both families store slice 0 only (the prefill kernels outside graph mode) and repeat it for
    // the other heads.
    ASSERT_NE(op.schedule(), nullptr);
    if (!(graph && on_prefill)) EXPECT_TRUE(op.schedule()->slice_zero_only());
    EXPECT_EQ(op.schedule()->num_slices(), hkv);
    SCOPED_TRACE("round " + std::to_string(round) + (long_batch ? ", long" : ", short") +
                 (graph ? ", graph mode" : ""));
    EXPECT_EQ(on_prefill, long_batch || !bulk) << "sm_90+: long batches on the prefill kernels only; before "
                                                  "sm_90 every GQA batch";
    op.run(g.dq.view(), g.cache, g.dout.view(), g.dlse.view());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    g.dout.copy_back(out);
    g.dlse.copy_back(lse);
    const auto ref = pool.decode_reference(lens, g.qd.data(), hq);
    ComputeTolerance tol;
    tol.accumulation = 0x1p-8;  // both families are tensor-core kernels: weights rounded to bf16
    EXPECT_TRUE(outputs_match(out, ref.o, ref.mag, tol));
    EXPECT_TRUE(lse_match(lse, ref.lse, tol));
  }
}

}  // namespace
}  // namespace kvattn_test

#else
TEST(GpuDecodeRoute, LongAndShortBatchesOnOneObject) { GTEST_SKIP() << "this build has no CUDA backend"; }
#endif
