#include "core/prefill_gpu.h"

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "core/validate.h"
#include "kvattn/error.h"

namespace kvattn::detail {

void check_kv_alignment(const char* name, const TensorView& t, int ndim_checked) {
  const int64_t esz = int64_t(dtype_size(t.dtype()));
  const auto addr = reinterpret_cast<uintptr_t>(t.data());
  KVATTN_CHECK(addr % 16 == 0, name, " starts at an address that is not 16-byte aligned (", t.describe(),
               "); the GPU prefill kernels copy 16-byte pieces of each row");
  for (int d = 0; d < ndim_checked; ++d)
    KVATTN_CHECK((t.stride(d) * esz) % 16 == 0 || t.size(d) == 1, name, ".stride(", d, ") = ", t.stride(d),
                 " elements is not a multiple of 16 bytes (", t.describe(),
                 "); the GPU prefill kernels copy 16-byte pieces of each row");
}

#if KVATTN_WITH_CUDA

void plan_prefill_gpu(AttentionPlan& plan, const AttentionPlan* previous, const TensorView& workspace,
                      const SchedulerOptions& scheduler, void* stream) {
  validate::gpu_workspace(workspace);
  plan.gpu_prefill = previous && previous->gpu_prefill   ? previous->gpu_prefill
                     : previous && previous->spare_prefill ? previous->spare_prefill
                                                           : std::make_shared<cuda::PrefillRunner>();
  if (previous) plan.spare_decode = previous->gpu_decode ? previous->gpu_decode : previous->spare_decode;
  std::vector<int32_t> kv_len(plan.kv_len.size());
  for (size_t b = 0; b < kv_len.size(); ++b) {
    KVATTN_CHECK(plan.kv_len[b] <= std::numeric_limits<int32_t>::max(), "request ", b, " has ",
                 plan.kv_len[b], " KV tokens, more than the GPU kernels' int32 limit");
    kv_len[b] = int32_t(plan.kv_len[b]);
  }
  const auto& s = plan.shape;
  cuda::PrefillProblem pr;
  pr.num_qo_heads = s.num_qo_heads;
  pr.num_kv_heads = s.num_kv_heads;
  pr.head_dim_qk = s.head_dim_qk;
  pr.head_dim_vo = s.head_dim_vo;
  pr.paged = plan.kind != KVKind::ragged;  // block-sparse: column blocks are pages
  pr.page_size = plan.page_size;
  pr.q_dtype = s.q_dtype;
  pr.kv_dtype = s.kv_dtype;
  pr.o_dtype = s.o_dtype;
  pr.variant = plan.variant;
  pr.qo_indptr = plan.qo_indptr;
  pr.kv_indptr = plan.kv_indptr;
  pr.kv_indices = plan.kv_indices;
  pr.device_kv_indices = plan.device_kv_indices;
  pr.kv_last_page_len = plan.last_page_len;
  pr.kv_len = kv_len;
  pr.custom_mask = plan.custom_mask;
  pr.mask_indptr = plan.mask_indptr;
  pr.scheduler = scheduler;
  pr.one_query_per_request = plan.is_decode;
  plan.gpu_prefill->plan(pr, workspace.data(), workspace.numel() * int64_t(dtype_size(workspace.dtype())),
                         workspace.device().index, static_cast<cudaStream_t>(stream));
}

void run_prefill_gpu(const AttentionPlan& plan, const TensorView& q, const PagedKVCache* paged,
                     const TensorView* k, const TensorView* v, const TensorView& out,
                     const TensorView& lse, void* stream, const char* who) {
  const std::pair<const char*, TensorView> kv[] = {
      {paged ? "paged k" : "k", paged ? paged->k : *k}, {paged ? "paged v" : "v", paged ? paged->v : *v}};
  for (const auto& [name, t] : kv) check_kv_alignment(name, t, paged ? 3 : 2);
  KVATTN_CHECK(plan.gpu_prefill != nullptr, "q is on ", q.device().str(), " but ", who,
               " was planned for the CPU (give it a CUDA workspace)");
  cuda::PrefillTensors t{};
  t.q = q.data();
  t.q_stride_n = q.stride(0);
  t.q_stride_h = q.stride(1);
  t.o = out.data();
  t.o_stride_n = out.stride(0);
  t.o_stride_h = out.stride(1);
  if (lse.defined()) {
    t.lse = lse.data_as<float>();
    t.lse_stride_n = lse.stride(0);
    t.lse_stride_h = lse.stride(1);
  }
  if (paged) {
    t.k = paged->k.data();
    t.v = paged->v.data();
    t.k_stride_page = paged->k.stride(0);
    t.k_stride_token = paged->k_token_stride();
    t.k_stride_head = paged->k_head_stride();
    t.v_stride_page = paged->v.stride(0);
    t.v_stride_token = paged->v_token_stride();
    t.v_stride_head = paged->v_head_stride();
    t.num_pages = paged->num_pages();
  } else {
    t.k = k->data();
    t.v = v->data();
    t.k_stride_token = k->stride(0);
    t.k_stride_head = k->stride(1);
    t.v_stride_token = v->stride(0);
    t.v_stride_head = v->stride(1);
  }
  plan.gpu_prefill->run(t, static_cast<cudaStream_t>(stream));
}

#else

void plan_prefill_gpu(AttentionPlan&, const AttentionPlan*, const TensorView& workspace,
                      const SchedulerOptions&, void*) {
  detail::throw_error("the workspace is on ", workspace.device().str(),
                      " but this build of kvattn has no CUDA backend");
}

void run_prefill_gpu(const AttentionPlan&, const TensorView& q, const PagedKVCache*, const TensorView*,
                     const TensorView*, const TensorView&, const TensorView&, void*, const char*) {
  detail::throw_error("q is on ", q.device().str(),
                      " but this build of kvattn has no CUDA backend; pass host (cpu) tensors");
}

#endif

}  // namespace kvattn::detail
