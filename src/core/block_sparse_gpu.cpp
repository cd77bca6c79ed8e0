#include "core/block_sparse_gpu.h"

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>

#include "core/prefill_gpu.h"
#include "kvattn/error.h"

namespace kvattn::detail {

void check_block_sparse_gpu_variant(const ResolvedShape& shape) {
  const Variant& v = shape.variant;
  std::ostringstream what;
  int n = 0;
  auto add = [&](const char* name) { what << (n++ ? ", " : "") << name; };
  if (v.causal) add("causal mask");
  if (v.window_left >= 0) add("sliding window");
  if (v.alibi) add("ALiBi bias");
  if (v.rope) add("fused RoPE");
  KVATTN_CHECK(n == 0, "BlockSparseAttention on the GPU does not support the ", what.str(), " (variant ",
               v.describe(), "): the GPU prefill kernels it runs on place a key at its index among the "
               "block row's gathered column blocks, not at its absolute index j, so position-dependent "
               "variants would be silently wrong; run it on the CPU (no workspace, host tensors) or "
               "use a variant without positions (softmax, soft-cap, sigmoid, sm_scale, q/k/v scales)");
}

void plan_block_sparse_gpu(AttentionPlan& plan, const AttentionPlan* previous, const TensorView& workspace,
                           const SchedulerOptions& scheduler, void* stream) {
  check_block_sparse_gpu_variant(plan.shape);
  KVATTN_CHECK(plan.bsr_C <= std::numeric_limits<int32_t>::max(), "bsr C = ", plan.bsr_C,
               " is wider than the GPU prefill kernels' int32 page size");
  // Every column block is a full page of C tokens (the indices were checked against N / C); a block
  // row without blocks is a request without pages (length 0).
  plan.page_size = int(plan.bsr_C);
  plan.last_page_len.resize(size_t(plan.batch_size()));
  for (int64_t br = 0; br < plan.batch_size(); ++br)
    plan.last_page_len[size_t(br)] = plan.kv_len[size_t(br)] > 0 ? int32_t(plan.bsr_C) : 0;
  plan_prefill_gpu(plan, previous, workspace, scheduler, stream);  // throws in a build without CUDA
}

#if KVATTN_WITH_CUDA

void run_block_sparse_gpu(const AttentionPlan& plan, Device workspace_device, const TensorView& q,
                          const TensorView& k, const TensorView& v, const TensorView& out,
                          const TensorView& lse, void* stream) {
  KVATTN_CHECK(plan.gpu_prefill != nullptr, "q is on ", q.device().str(),
               " but BlockSparseAttention was planned for the CPU (give it a CUDA workspace)");
  KVATTN_CHECK(q.device() == workspace_device, "q is on ", q.device().str(),
               " but BlockSparseAttention was planned with a workspace on ", workspace_device.str());
  check_kv_alignment("k", k, 2);
  check_kv_alignment("v", v, 2);
  // k [N, Hkv, D] as pages [N / C, C, Hkv, D]: page p is rows [p C, (p + 1) C).
  const int64_t C = plan.bsr_C, pages = plan.bsr_N / C;
  auto as_pages = [&](const TensorView& t) {
    const int64_t shape[4] = {pages, C, t.size(1), t.size(2)};
    const int64_t strides[4] = {C * t.stride(0), t.stride(0), t.stride(1), t.stride(2)};
    return TensorView(t.data(), t.dtype(), 4, shape, strides, t.device());
  };
  const PagedKVCache cache = PagedKVCache::split(as_pages(k), as_pages(v), KVLayout::NHD);
  run_prefill_gpu(plan, q, &cache, nullptr, nullptr, out, lse, stream, "BlockSparseAttention");
}

#else

void run_block_sparse_gpu(const AttentionPlan&, Device, const TensorView& q, const TensorView&,
                          const TensorView&, const TensorView&, const TensorView&, void*) {
  throw_error("q is on ", q.device().str(), " but this build of kvattn has no CUDA backend; pass host (cpu) tensors");
}

#endif

}  // namespace kvattn::detail
