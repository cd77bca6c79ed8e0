// Device-resident page tables for BatchDecode on the GPU: kv_indices given as a CUDA tensor is
// read in place by the kernels (plan() reads only indptr and last_page_len). The ids are checked
// on the device: an out-of-range id poisons only its request's rows with NaN, is never read
// through, and check_errors() names it. The GPU cases skip where there is no CUDA device; the
// plan-time errors run everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <vector>

#include "support/attention_case.h"
#include "support/device_mirror.h"
#include "support/gpu_skip.h"
#include "support/expect_error.h"
#include "support/paged_kv.h"
#include "support/scoped_override.h"

#if KVATTN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvattn_test {
namespace {

using kvattn::DType;

// A GPU case of 8/2 heads, head dim 64, with its page ids on the device.
AttnCase device_table_case(DType kv, int page_size, int split) {
  AttnCase c;
  c.on_gpu = true;
  c.device_page_table = true;
  c.q_dtype = DType::bf16;
  c.kv_dtype = kv;
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim_qk = 64;
  c.page_size = page_size;
  c.scheduler.fixed_split_size = split;
  return c;
}

TEST(GpuPageTable, DeviceResidentIdsMatchTheReference) {
  SKIP_WITHOUT_GPU();
  // Both kernel families (tensor cores for bf16 KV, CUDA cores for fp8 and f32), page sizes 1 and
  // 16, split and unsplit rows.
  for (DType kv : {DType::bf16, DType::e4m3, DType::f32})
    for (int ps : {1, 16})
      for (int split : {0, 128}) {
        KVATTN_CASE_RNG(rng);
        AttnCase c = device_table_case(kv, ps, split);
        if (kv == DType::bf16) c.tolerance.accumulation = 0x1p-8;  // P rounded to bf16 for the MMA
        // Forced onto the prefill kernels (scripts/gpu-check's loop), fp8 KV runs their MMA too.
        if (kv == DType::e4m3 &&
            current_overrides().decode_kernel == kvattn::detail::DecodeKernelChoice::prefill)
          c.tolerance.accumulation = 0x1p-8;
        c.lens = {{1, 700}, {1, 0}, {1, 1}, {1, rng.integer(2, 900)}};
        run_decode_case(c, rng);
      }
}

// BatchPrefill and BatchDecode on the prefill kernels read device ids in place too: paged
// prefill and append (causal, bottom-right), page sizes 1, 5 and 16, split and unsplit rows,
// bf16 and fp8 KV.
TEST(GpuPageTable, PrefillKernelsReadDeviceIdsInPlace) {
  SKIP_WITHOUT_GPU();
  for (DType kv : {DType::bf16, DType::e4m3})
    for (int ps : {1, 5, 16})
      for (int split : {0, 128}) {
        KVATTN_CASE_RNG(rng);
        SCOPED_TRACE(std::string(kvattn::dtype_name(kv)) + " page " + std::to_string(ps) + " split " +
                     std::to_string(split));
        AttnCase c = device_table_case(kv, ps, split);
        c.tolerance.accumulation = 0x1p-8;  // P rounded to bf16 for the MMA
        c.variant = kvattn::variants::causal();
        c.lens = {{17, 577}, {1, 1}, {rng.integer(1, 40), rng.integer(40, 700)}, {0, 33}, {127, 127}};
        run_prefill_case(c, rng);

        AttnCase d = c;  // decode on the prefill kernels
        d.variant = kvattn::Variant{};
        d.lens = {{1, 700}, {1, 1}, {1, rng.integer(2, 900)}};
        ScopedOverride force("KVATTN_DECODE_KERNEL", "prefill");
        run_decode_case(d, rng);
      }
}

#if KVATTN_WITH_CUDA
// Which operation reads the device table: BatchDecode on its decode kernels, BatchDecode on the
// prefill kernels (KVATTN_DECODE_KERNEL=prefill), or BatchPrefill with 4, 9 and 2 queries.
enum class Reader { decode, decode_on_prefill_kernels, prefill };
const char* reader_name(Reader r) {
  return r == Reader::decode ? "decode" : r == Reader::prefill ? "prefill" : "decode on the prefill kernels";
}

// Runs 3 requests with request 1's page `bad_page` replaced by `bad_id` in the device table and
// checks: the error names position and value, request 1's rows are NaN (LSE too; every row of
// request 1 reads that page), requests 0 and 2 equal a run with the good table bit for bit, and
// the record clears.
void check_bad_id(Reader reader, DType kv, int32_t bad_id, int split, Rng& rng) {
  const int hq = 8, hkv = 2, D = 64, P = 16;
  std::optional<ScopedOverride> route;
  if (reader != Reader::prefill)
    route.emplace("KVATTN_DECODE_KERNEL", reader == Reader::decode ? nullptr : "prefill");
  PagedKVSpec spec{{300, 1000, 77}, P, hkv, D, D, kv, kvattn::KVLayout::NHD, false, false, false, 2};
  PagedKV pool(spec, rng);
  for (size_t b = 0; b < 3; ++b)
    for (int64_t t = 0; t < spec.kv_lens[b]; ++t)
      for (int h = 0; h < hkv; ++h)
        for (int e = 0; e < D; ++e) {
          pool.set_k(b, t, h, e, rng.normal());
          pool.set_v(b, t, h, e, rng.uniform(-1, 1));
        }
  const std::vector<int32_t> qo_indptr = reader == Reader::prefill ? std::vector<int32_t>{0, 4, 13, 15}
                                                                   : std::vector<int32_t>{0, 1, 2, 3};
  const int64_t rows = qo_indptr.back();
  HostTensor q(DType::bf16, {rows, hq, D}), out(DType::bf16, {rows, hq, D}), lse(DType::f32, {rows, hq});
  for (int64_t i = 0; i < q.numel(); ++i) q.set_at(i, rng.normal());
  HostTensor good_out = out, good_lse = lse, qo = int32_tensor(qo_indptr);
  DeviceMirror dk(pool.k), dv(pool.v), dq(q), dindices(pool.indices);
  const auto cache = kvattn::PagedKVCache::split(dk.view(), dv.view(), kvattn::KVLayout::NHD);
  DeviceBytes ws(int64_t(16) << 20);
  kvattn::AttentionShape shape;
  shape.num_qo_heads = hq;
  shape.num_kv_heads = hkv;
  shape.head_dim_qk = D;
  shape.kv_dtype = kv;
  kvattn::PageTable table = pool.table();
  table.indices = dindices.view();
  kvattn::BatchDecode decode(ws.view());
  kvattn::BatchPrefill prefill(ws.view());
  if (reader == Reader::prefill) {
    kvattn::BatchPrefillPlan p;
    static_cast<kvattn::AttentionShape&>(p) = shape;
    p.qo_indptr = qo.view();
    p.page_table = table;
    p.page_size = P;
    p.scheduler.fixed_split_size = split;
    prefill.plan(p);
  } else {
    kvattn::BatchDecodePlan p;
    static_cast<kvattn::AttentionShape&>(p) = shape;
    p.page_table = table;
    p.page_size = P;
    p.scheduler.fixed_split_size = split;
    decode.plan(p);
  }
  auto check_errors = [&] { reader == Reader::prefill ? prefill.check_errors() : decode.check_errors(); };

  auto run = [&](HostTensor& o, HostTensor& l) {
    o.poison();
    l.poison();
    DeviceMirror d_o(o), d_l(l);
    if (reader == Reader::prefill)
      prefill.run(dq.view(), cache, d_o.view(), d_l.view());
    else
      decode.run(dq.view(), cache, d_o.view(), d_l.view());
    device_synchronize();
    d_o.copy_back(o);
    d_l.copy_back(l);
  };
  run(good_out, good_lse);
  check_errors();  // clean
  for (int64_t i = 0; i < good_out.numel(); ++i) ASSERT_TRUE(std::isfinite(good_out.get_at(i))) << "element " << i;

  const int64_t pos = as_int32(pool.indptr)[1] + 40;  // request 1, page 40 of 63
  auto* slot = static_cast<int32_t*>(const_cast<void*>(dindices.view().data())) + pos;
  int32_t good_id = 0;
  ASSERT_EQ(cudaMemcpy(&good_id, slot, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(slot, &bad_id, 4, cudaMemcpyHostToDevice), cudaSuccess);
  run(out, lse);  // no re-plan: the kernels read the table in place
  EXPECT_KVATTN_ERROR(check_errors(), "kv_indices[" + std::to_string(pos) + "] = " + std::to_string(bad_id) +
                                          " is out of range [0, " + std::to_string(pool.num_pages()) + ")");
  check_errors();  // the record was cleared
  for (int64_t row = 0; row < rows; ++row) {
    const bool poisoned = row >= qo_indptr[1] && row < qo_indptr[2];
    for (int h = 0; h < hq; ++h) {
      if (poisoned) {
        EXPECT_TRUE(std::isnan(lse.get({row, h}))) << "row " << row << " head " << h;
        for (int e = 0; e < D; ++e) ASSERT_TRUE(std::isnan(out.get({row, h, e}))) << "row " << row << " head " << h;
      } else {
        EXPECT_EQ(lse.get({row, h}), good_lse.get({row, h})) << "row " << row << " head " << h;
        for (int e = 0; e < D; ++e)
          ASSERT_EQ(out.get({row, h, e}), good_out.get({row, h, e})) << "row " << row << " head " << h;
      }
    }
  }
  // Restored, the same plan runs clean again.
  ASSERT_EQ(cudaMemcpy(slot, &good_id, 4, cudaMemcpyHostToDevice), cudaSuccess);
  run(out, lse);
  check_errors();
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.get_at(i), good_out.get_at(i)) << "element " << i;
}
#endif

TEST(GpuPageTable, OutOfRangeIdIsReportedAndPoisonsOnlyItsRequest) {
  SKIP_WITHOUT_GPU();
#if KVATTN_WITH_CUDA
  for (Reader reader : {Reader::decode, Reader::decode_on_prefill_kernels, Reader::prefill})
    for (DType kv : {DType::bf16, DType::e5m2})  // decode: tensor-core and CUDA-core kernels
      for (int32_t bad : {-3, 1 << 20})
        for (int split : {0, 256}) {  // split: the poison must survive the merge kernel
          KVATTN_CASE_RNG(rng);
          SCOPED_TRACE(std::string(reader_name(reader)) + " " + std::string(kvattn::dtype_name(kv)) + " id " +
                       std::to_string(bad) + " split " + std::to_string(split));
          check_bad_id(reader, kv, bad, split, rng);
        }
#endif
}

// The one-request decode plan of the plan-time error tests below (4/1 heads, head dim 64, page 16).
kvattn::BatchDecodePlan small_decode_plan(const kvattn::PageTable& table) {
  kvattn::BatchDecodePlan p;
  p.num_qo_heads = 4;
  p.num_kv_heads = 1;
  p.head_dim_qk = 64;
  p.page_size = 16;
  p.page_table = table;
  return p;
}
// The same shape and page table as a BatchPrefill plan of one query token (qo holds {0, 1}).
kvattn::BatchPrefillPlan as_prefill_plan(const kvattn::BatchDecodePlan& p, const HostTensor& qo) {
  kvattn::BatchPrefillPlan pp;
  static_cast<kvattn::AttentionShape&>(pp) = p;
  pp.qo_indptr = qo.view();
  pp.page_table = p.page_table;
  pp.page_size = p.page_size;
  return pp;
}

// Plan-time errors need no GPU: the views are only inspected.
TEST(GpuPageTable, DeviceIdsNeedAGpuWorkspace) {
  std::vector<int32_t> indptr{0, 1}, last{1};
  HostTensor ti = int32_tensor(indptr), tl = int32_tensor(last);
  int32_t fake = 0;
  kvattn::BatchDecodePlan p = small_decode_plan(
      {ti.view(), kvattn::TensorView(&fake, DType::i32, {1}, kvattn::Device::cuda(0)), tl.view()});
  kvattn::BatchDecode cpu_op;
  EXPECT_KVATTN_ERROR(cpu_op.plan(p), "kv_indices is on cuda:0; only BatchDecode and BatchPrefill with a CUDA workspace");
  HostTensor qo = int32_tensor({0, 1});
  kvattn::BatchPrefillPlan pp = as_prefill_plan(p, qo);
  kvattn::BatchPrefill prefill;
  EXPECT_KVATTN_ERROR(prefill.plan(pp), "kv_indices is on cuda:0");
  // Shape errors of a device table are still caught on the host.
  p.page_table.indices = kvattn::TensorView(&fake, DType::u8, {1}, kvattn::Device::cuda(0));
  EXPECT_KVATTN_ERROR(cpu_op.plan(p), "kv_indices is on cuda:0");
}

// A GPU workspace must be 16-byte aligned (the kernels move partial states and work items in
// 16-byte pieces): checked at plan(), before any device work, so this runs without a GPU.
TEST(GpuWorkspace, MisalignedWorkspaceIsAnError) {
#if KVATTN_WITH_CUDA
  alignas(16) static uint8_t fake[64];
  const kvattn::TensorView misaligned(fake + 4, DType::u8, {32}, kvattn::Device::cuda(0));
  std::vector<int32_t> indptr{0, 1}, indices{0}, last{1};
  HostTensor ti = int32_tensor(indptr), tx = int32_tensor(indices), tl = int32_tensor(last);
  kvattn::BatchDecodePlan p = small_decode_plan({ti.view(), tx.view(), tl.view()});
  kvattn::BatchDecode decode(misaligned);
  EXPECT_KVATTN_ERROR(decode.plan(p), "workspace must be 16-byte aligned on the GPU, got address 0x");
  HostTensor qo = int32_tensor({0, 1});
  kvattn::BatchPrefillPlan pp = as_prefill_plan(p, qo);
  kvattn::BatchPrefill prefill(misaligned);
  EXPECT_KVATTN_ERROR(prefill.plan(pp), "workspace must be 16-byte aligned on the GPU");
#else
  GTEST_SKIP() << "built without the CUDA backend";
#endif
}

TEST(GpuPageTable, DeviceTableShapeIsCheckedOnTheHost) {
  SKIP_WITHOUT_GPU();
#if KVATTN_WITH_CUDA
  std::vector<int32_t> indptr{0, 3}, last{1}, ids{0, 1, 2};
  HostTensor ti = int32_tensor(indptr), tl = int32_tensor(last), tx = int32_tensor(ids);
  DeviceMirror dx(tx);
  DeviceBytes ws(int64_t(1) << 20);
  kvattn::BatchDecode op(ws.view());
  kvattn::BatchDecodePlan p;
  p.num_qo_heads = 4;
  p.num_kv_heads = 1;
  p.head_dim_qk = 64;
  p.page_size = 16;
  const kvattn::TensorView full = dx.view();
  p.page_table = {ti.view(), kvattn::TensorView(full.data(), DType::i32, {2}, full.device()), tl.view()};
  EXPECT_KVATTN_ERROR(op.plan(p), "kv_indptr[1] = 3 exceeds the length of kv_indices (2)");
  p.page_table.indices = kvattn::TensorView(full.data(), DType::u8, {1}, full.device());
  EXPECT_KVATTN_ERROR(op.plan(p), "kv_indices has dtype u8 but i32 is expected");
  EXPECT_KVATTN_ERROR(op.check_errors(), "BatchDecode.check_errors() was called before plan()");
#endif
}

// A plan runs where it was made for: a GPU plan given host tensors names q (it used to fall back to
// the CPU engine, which read page ids a GPU decode plan had not copied to the host).
TEST(GpuPageTable, GpuPlanRunWithHostTensorsIsAnError) {
  SKIP_WITHOUT_GPU();
#if KVATTN_WITH_CUDA
  std::vector<int32_t> indptr{0, 1}, indices{0}, last{1};
  HostTensor ti = int32_tensor(indptr), tx = int32_tensor(indices), tl = int32_tensor(last);
  kvattn::BatchDecodePlan p = small_decode_plan({ti.view(), tx.view(), tl.view()});
  DeviceBytes ws(int64_t(1) << 20);
  kvattn::BatchDecode op(ws.view());
  op.plan(p);
  HostTensor q(DType::bf16, {1, p.num_qo_heads, p.head_dim_qk}), out(DType::bf16, {1, p.num_qo_heads, p.head_dim_qk});
  HostTensor kc(DType::bf16, {1, p.page_size, p.num_kv_heads, p.head_dim_qk});
  const auto cache = kvattn::PagedKVCache::split(kc.view(), kc.view(), kvattn::KVLayout::NHD);
  EXPECT_KVATTN_ERROR(op.run(q.view(), cache, out.view()),
                      "q is on cpu but BatchDecode was planned with a workspace on cuda:0");
#endif
}

}  // namespace
}  // namespace kvattn_test
