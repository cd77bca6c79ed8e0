// The CUDA backend of the attention API (core/attention_backend.h): a validated AttentionPlan
// becomes a DecodeRunner or PrefillRunner plan, and a run()'s tensors become the runners'
// AttentionTensors. The one place where KV tensors are turned into pointers and element strides
// and checked for what the kernels' 16-byte copies need, for decode, prefill and block-sparse.
#include "core/attention_backend.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/overrides.h"
#include "core/validate.h"
#include "cuda/decode_runner.h"
#include "cuda/runtime.h"
#include "cuda/prefill_runner.h"
#include "kvattn/error.h"

namespace kvattn::detail {

namespace {

const char* kernels_name(GpuKernels k) {
  return k == GpuKernels::decode ? "the GPU decode kernels" : "the GPU prefill kernels";
}

// The kernels copy K/V rows in 16-byte pieces (cp.async, bulk copies): the base address and the
// strides of the first `ndim_checked` dimensions must be multiples of 16 bytes (a dimension of
// size 1 excepted).
void check_kv_alignment(const char* name, const TensorView& t, int ndim_checked, GpuKernels kernels) {
  const int64_t esz = int64_t(dtype_size(t.dtype()));
  const auto addr = reinterpret_cast<uintptr_t>(t.data());
  KVATTN_CHECK(addr % 16 == 0, name, " starts at an address that is not 16-byte aligned (", t.describe(),
               "); ", kernels_name(kernels), " copy 16-byte pieces of each row");
  for (int d = 0; d < ndim_checked; ++d)
    KVATTN_CHECK((t.stride(d) * esz) % 16 == 0 || t.size(d) == 1, name, ".stride(", d, ") = ", t.stride(d),
                 " elements is not a multiple of 16 bytes (", t.describe(), "); ", kernels_name(kernels),
                 " copy 16-byte pieces of each row");
}

// k [N, Hkv, D] of a block-sparse run as the paged cache [N / C, C, Hkv, D] (NHD) its lowering
// reads: page p is rows [p C, (p + 1) C).
TensorView bsr_as_pages(const TensorView& t, int64_t C) {
  const int64_t shape[4] = {t.size(0) / C, C, t.size(1), t.size(2)};
  const int64_t strides[4] = {C * t.stride(0), t.stride(0), t.stride(1), t.stride(2)};
  return TensorView(t.data(), t.dtype(), 4, shape, strides, t.device());
}

cuda::AttentionTensors attention_tensors(const AttentionPlan& plan, const RunTensors& in,
                                         GpuKernels kernels) {
  cuda::AttentionTensors t;
  t.q = in.q.data();
  t.q_stride_n = in.q.stride(0);
  t.q_stride_h = in.q.stride(1);
  t.o = in.out.data();
  t.o_stride_n = in.out.stride(0);
  t.o_stride_h = in.out.stride(1);
  if (in.lse.defined()) {
    t.lse = in.lse.data_as<float>();
    t.lse_stride_n = in.lse.stride(0);
    t.lse_stride_h = in.lse.stride(1);
  }
  // Block-sparse K/V are checked as the [N, Hkv, D] tensors they are, then read as pages.
  std::optional<PagedKVCache> bsr_cache;
  const PagedKVCache* paged = in.paged;
  if (paged) {
    check_kv_alignment("paged k", paged->k, 3, kernels);
    check_kv_alignment("paged v", paged->v, 3, kernels);
  } else {
    check_kv_alignment("k", in.k, 2, kernels);
    check_kv_alignment("v", in.v, 2, kernels);
    if (plan.kind == KVKind::block_sparse)
      paged = &bsr_cache.emplace(PagedKVCache::split(bsr_as_pages(in.k, plan.bsr_C),
                                                     bsr_as_pages(in.v, plan.bsr_C), KVLayout::NHD));
  }
  if (paged) {
    t.k = paged->k.data();
    t.v = paged->v.data();
    t.num_pages = paged->num_pages();
    t.k_stride_page = paged->k.stride(0);
    t.k_stride_token = paged->k_token_stride();
    t.k_stride_head = paged->k_head_stride();
    t.v_stride_page = paged->v.stride(0);
    t.v_stride_token = paged->v_token_stride();
    t.v_stride_head = paged->v_head_stride();
  } else {
    t.k = in.k.data();
    t.v = in.v.data();
    t.k_stride_token = in.k.stride(0);
    t.k_stride_head = in.k.stride(1);
    t.v_stride_token = in.v.stride(0);
    t.v_stride_head = in.v.stride(1);
  }
  return t;
}

// The kernels of a block-sparse plan place a key at its index among the block row's gathered
// column blocks, not at its absolute index j, so variants that read positions would be wrong.
void check_block_sparse_variant(const ResolvedShape& shape) {
  const Variant& v = shape.variant;
  std::ostringstream what;
  int n = 0;
  auto add = [&](const char* name) { what << (n++ ? ", " : "") << name; };
  if (v.causal) add("causal mask");
  if (v.window_left >= 0) add("sliding window");
  if (v.alibi) add("ALiBi bias");
  if (v.rope) add("fused RoPE");
  if (v.custom) add("user variant");
  KVATTN_CHECK(n == 0, "BlockSparseAttention on the GPU does not support the ", what.str(), " (variant ",
               v.describe(), "): the GPU prefill kernels it runs on place a key at its index among the "
               "block row's gathered column blocks, not at its absolute index j, so position-dependent "
               "variants would be silently wrong; run it on the CPU (no workspace, host tensors) or "
               "use a variant without positions (softmax, soft-cap, sigmoid, sm_scale, q/k/v scales)");
}

// Block row r as a request whose pages are its column blocks, each a full page of C tokens (the
// indices were checked against N / C); a block row without blocks is a request of length 0.
void lower_block_sparse(AttentionPlan& plan) {
  check_block_sparse_variant(plan.shape);
  KVATTN_CHECK(plan.bsr_C <= std::numeric_limits<int32_t>::max(), "bsr C = ", plan.bsr_C,
               " is wider than the GPU prefill kernels' int32 page size");
  plan.page_size = int(plan.bsr_C);
  plan.last_page_len.resize(size_t(plan.batch_size()));
  for (int64_t br = 0; br < plan.batch_size(); ++br)
    plan.last_page_len[size_t(br)] = plan.kv_len[size_t(br)] > 0 ? int32_t(plan.bsr_C) : 0;
}

cuda::DecodeProblemKey decode_key(const AttentionPlan& plan) {
  const auto& s = plan.shape;
  cuda::DecodeProblemKey key;
  key.q_dtype = s.q_dtype;
  key.kv_dtype = s.kv_dtype;
  key.o_dtype = s.o_dtype;
  key.head_dim_qk = s.head_dim_qk;
  key.head_dim_vo = s.head_dim_vo;
  key.group_size = s.num_qo_heads / s.num_kv_heads;
  key.page_size = plan.page_size;
  key.features = plan.variant.features;
  return key;
}

std::vector<int32_t> int32_lengths(const AttentionPlan& plan) {
  std::vector<int32_t> kv_len(plan.kv_len.size());
  for (size_t b = 0; b < kv_len.size(); ++b) {
    KVATTN_CHECK(plan.kv_len[b] <= std::numeric_limits<int32_t>::max(), "request ", b, " has ",
                 plan.kv_len[b], " KV tokens, more than the GPU kernels' int32 limit");
    kv_len[b] = int32_t(plan.kv_len[b]);
  }
  return kv_len;
}

class CudaPlan final : public GpuPlan {
 public:
  // Both runners are kept across plans (graph mode reuses their buffers; BatchDecode moves
  // between the two families by batch, and a new runner would allocate its pinned staging again).
  std::shared_ptr<cuda::DecodeRunner> decode;
  std::shared_ptr<cuda::PrefillRunner> prefill;
  GpuKernels family = GpuKernels::prefill;

  void run(const AttentionPlan& plan, const RunTensors& in, void* stream) const override {
    const bool has_lse = family == GpuKernels::decode ? decode->has_lse() : prefill->has_lse();
    KVATTN_CHECK(!in.lse.defined() || has_lse, "lse was requested but the user variant ",
                 plan.shape.variant.custom ? plan.shape.variant.custom->name : "", " has use_softmax = false (no lse)");
    const cuda::AttentionTensors t = attention_tensors(plan, in, family);
    if (family == GpuKernels::decode)
      decode->run(t, static_cast<cudaStream_t>(stream));
    else
      prefill->run(t, static_cast<cudaStream_t>(stream));
  }
  void check_errors(void* stream) const override {
    if (family == GpuKernels::decode)
      decode->check_errors(static_cast<cudaStream_t>(stream));
    else
      prefill->check_errors(static_cast<cudaStream_t>(stream));
  }
  const Plan& schedule() const override {
    return family == GpuKernels::decode ? decode->schedule() : prefill->schedule();
  }
  GpuKernels kernels() const override { return family; }
  std::string kernel_name() const override {
    return family == GpuKernels::decode ? decode->config().name() : prefill->config().name();
  }
};

}  // namespace

GpuKernels decode_kernels_for(const AttentionPlan& plan, const TensorView& workspace) {
  validate::gpu_workspace(workspace);
  const cuda::DeviceLimits limits = cuda::decode_device_limits(workspace.device().index);  // throws without a device
  cuda::DecodeBatchShape batch;
  batch.kv_len = plan.kv_len;
  batch.num_kv_heads = plan.shape.num_kv_heads;
  batch.cuda_graph = plan.scheduler.cuda_graph.has_value();
  return cuda::decode_uses_prefill_kernels(decode_key(plan), limits, active_overrides(), batch)
             ? GpuKernels::prefill
             : GpuKernels::decode;
}

std::unique_ptr<GpuPlan> plan_on_gpu(AttentionPlan& plan, const GpuPlan* previous, GpuKernels kernels,
                                     std::span<const int32_t> host_kv_indices,
                                     const TensorView& workspace, const SchedulerOptions& scheduler,
                                     void* stream) {
  validate::gpu_workspace(workspace);
  if (plan.kind == KVKind::block_sparse) lower_block_sparse(plan);
  auto gpu = std::make_unique<CudaPlan>();
  if (const auto* was = dynamic_cast<const CudaPlan*>(previous)) {
    gpu->decode = was->decode;
    gpu->prefill = was->prefill;
  }
  gpu->family = kernels;
  const auto& s = plan.shape;
  const std::vector<int32_t> kv_len = int32_lengths(plan);
  void* const bytes = workspace.data();
  const int64_t num_bytes = workspace.numel() * int64_t(dtype_size(workspace.dtype()));
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  if (kernels == GpuKernels::decode) {
    if (!gpu->decode) gpu->decode = std::make_shared<cuda::DecodeRunner>();
    cuda::DecodeProblem pr;
    pr.num_qo_heads = s.num_qo_heads;
    pr.num_kv_heads = s.num_kv_heads;
    pr.head_dim_qk = s.head_dim_qk;
    pr.head_dim_vo = s.head_dim_vo;
    pr.page_size = plan.page_size;
    pr.q_dtype = s.q_dtype;
    pr.kv_dtype = s.kv_dtype;
    pr.o_dtype = s.o_dtype;
    pr.variant = plan.variant;
    pr.kv_indptr = plan.kv_indptr;
    pr.kv_indices = host_kv_indices;
    pr.device_kv_indices = plan.device_kv_indices;
    pr.kv_len = kv_len;
    pr.scheduler = scheduler;
    pr.custom = s.variant.custom.get();
    pr.custom_params = plan.custom_params;
    gpu->decode->plan(pr, bytes, num_bytes, workspace.device().index, cuda_stream);
  } else {
    if (!gpu->prefill) gpu->prefill = std::make_shared<cuda::PrefillRunner>();
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
    pr.kv_indices = host_kv_indices;
    pr.device_kv_indices = plan.device_kv_indices;
    pr.kv_last_page_len = plan.last_page_len;
    pr.kv_len = kv_len;
    pr.custom_mask = plan.custom_mask;
    pr.mask_indptr = plan.mask_indptr;
    pr.scheduler = scheduler;
    pr.one_query_per_request = plan.is_decode;
    pr.custom = s.variant.custom.get();
    pr.custom_params = plan.custom_params;
    gpu->prefill->plan(pr, bytes, num_bytes, workspace.device().index, cuda_stream);
  }
  return gpu;
}

void copy_host_to_gpu(const TensorView& dst, const void* src, void* stream) {
  cuda::DeviceGuard on(dst.device().index);
  cuda::check(cudaMemcpyAsync(dst.data(), src, size_t(dst.numel()) * dtype_size(dst.dtype()), cudaMemcpyHostToDevice,
                              static_cast<cudaStream_t>(stream)),
              "cudaMemcpyAsync (a cascade's merge mask)");
}

}  // namespace kvattn::detail
