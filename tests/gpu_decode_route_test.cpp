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
#include "support/scoped_env.h"

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
  ScopedEnv auto_route("KVATTN_DECODE_KERNEL", nullptr);
  KVATTN_CASE_RNG(rng);
  // 32 requests x 4 KV heads = 128 (request, KV head) pairs: the fewest the long route takes.
  const int max_batch = 32, hq = 16, hkv = 4, D = 128, P = 16;
  const int64_t max_len = 3000, long_min = kvattn::cuda::kLongDecodeMeanTokens;
  RequestPool pool(max_batch, max_len, P, hkv, D, rng);
  DeviceMirror dk(pool.cache.k), dv(pool.cache.v);
  auto cache = kvattn::PagedKVCache::split(dk.view(), dv.view(), kvattn::KVLayout::NHD);
  HostTensor q(DType::bf16, {max_batch, hq, D}), out(DType::bf16, {max_batch, hq, D}),
      lse(DType::f32, {max_batch, hq});
  std::vector<double> qd(size_t(max_batch * hq * D));
  DeviceMirror dq(q), dout(out), dlse(lse);
  DeviceBytes ws(int64_t(64) << 20);
  const bool bulk = kvattn::cuda::device_has_bulk_decode(0);

  kvattn::BatchDecode op(ws.view());
  kvattn::BatchDecodePlan p = pool.decode_plan(hq);
  for (int round = 0; round < 6; ++round) {
    const bool long_batch = round % 2 == 0;
    std::vector<int32_t> indptr{0}, indices, last;
    std::vector<int64_t> lens;
    for (int b = 0; b < max_batch; ++b) {
      const int64_t len = long_batch ? rng.integer(long_min, max_len) : rng.integer(0, 900);
      lens.push_back(len);
      const int64_t pages = (len + P - 1) / P;
      const auto& own = pool.cache.pages_of(size_t(b));
      indices.insert(indices.end(), own.begin(), own.begin() + pages);
      indptr.push_back(int32_t(indices.size()));
      last.push_back(int32_t(pages ? len - (pages - 1) * P : 0));
    }
    HostTensor ti = int32_tensor(indptr), tx = int32_tensor(indices), tl = int32_tensor(last);
    p.page_table = {ti.view(), tx.view(), tl.view()};
    for (int64_t i = 0; i < max_batch * hq * D; ++i) {
      q.set_at(i, rng.normal());
      qd[size_t(i)] = q.get_at(i);
    }
    dq.upload();
    out.poison();
    lse.poison();
    dout.upload();
    dlse.upload();
    op.plan(p);
    const bool on_prefill = op.kernel_family() == "prefill";
    ASSERT_TRUE(on_prefill || op.kernel_family() == "decode") << op.kernel_family();
    // Both families store slice 0 only (outside graph mode) and repeat it for the other heads.
    ASSERT_NE(op.schedule(), nullptr);
    EXPECT_TRUE(op.schedule()->slice_zero_only());
    EXPECT_EQ(op.schedule()->num_slices(), hkv);
    SCOPED_TRACE("round " + std::to_string(round) + (long_batch ? ", long" : ", short"));
    EXPECT_EQ(on_prefill, long_batch || !bulk) << "sm_90+: long batches on the prefill kernels only; before "
                                                  "sm_90 every GQA batch";
    op.run(dq.view(), cache, dout.view(), dlse.view());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dout.copy_back(out);
    dlse.copy_back(lse);
    const auto ref = pool.decode_reference(lens, qd.data(), hq);
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
