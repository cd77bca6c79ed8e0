// Batch prefill/append on the GPU: plan() schedules the batch with the planner (query tiles of the
// kernel's M tile, KV chunks of its KV tile), picks and loads the kernel, and stages the work list,
// the index arrays and the custom mask into the caller's device workspace with one copy; run()
// only launches, so it can be captured in a CUDA graph (graph mode keeps every buffer's address;
// with a custom mask and a paged cache the mask follows the page ids, so a captured run stays
// valid across re-plans only while the number of page ids is the same).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <vector>

#include "cuda/attention_tensors.h"
#include "cuda/prefill_kernels.h"
#include "cuda/plan_staging.h"
#include "kernels/prefill/params.cuh"
#include "kvattn/plan.h"

namespace kvattn::cuda {

struct PrefillProblem {
  int num_qo_heads = 0, num_kv_heads = 0, head_dim_qk = 0, head_dim_vo = 0;
  bool paged = false;
  int page_size = 0;
  DType q_dtype = DType::bf16, kv_dtype = DType::bf16, o_dtype = DType::bf16;
  kernels::VariantParams variant;  // its custom-mask pointers are replaced by the staged copies
  // Validated host arrays: qo_indptr [B+1]; kv_indptr [B+1] (tokens, ragged; pages, paged);
  // paged: kv_indices, kv_last_page_len [B]; kv_len [B].
  std::span<const int32_t> qo_indptr, kv_indptr, kv_indices, kv_last_page_len, kv_len;
  // Paged: the caller's device-resident page ids (kv_indices then empty), read and checked in
  // place by the kernels; null: kv_indices are host ids, staged into the workspace.
  const int32_t* device_kv_indices = nullptr;
  std::span<const uint8_t> custom_mask;      // with the kCustomMask feature
  std::span<const int32_t> mask_indptr;      // [B+1]
  SchedulerOptions scheduler;
  // BatchDecode on the prefill kernels: every request has one query, also in graph mode (whose
  // capacity then bounds the batch, not one request's query run).
  bool one_query_per_request = false;
  // A user variant (null: none) and its packed parameters (core/custom_params.h), which plan()
  // stages into the workspace for variant.user_params.
  const CustomVariant* custom = nullptr;
  std::span<const uint64_t> custom_params;
};

class PrefillRunner {
 public:
  PrefillRunner() = default;
  ~PrefillRunner() = default;
  PrefillRunner(const PrefillRunner&) = delete;
  PrefillRunner& operator=(const PrefillRunner&) = delete;

  // Throws kvattn::Error (workspace too small, unsupported shape, no device) before touching the
  // previous plan's buffers, except the staging copy, which it orders after the previous one.
  void plan(const PrefillProblem& problem, void* workspace, int64_t workspace_bytes, int device,
            cudaStream_t stream);
  void run(const AttentionTensors& t, cudaStream_t stream) const;
  // Waits for `stream`; throws when a run since the last plan() or check met a page id outside
  // [0, num_pages) (kernels/prefill/params.cuh), and clears the record.
  void check_errors(cudaStream_t stream) const;

  const Plan& schedule() const { return planners_[live_].current(); }
  const PrefillKernelConfig& config() const { return config_; }
  bool planned() const { return kernel_ != nullptr; }
  // Whether the planned kernel's weights are a softmax, so that run() can give an lse (false for a
  // user variant with use_softmax = false; the built-in sigmoid is refused before the backend).
  bool has_lse() const { return has_lse_; }
  int64_t workspace_used() const { return workspace_used_; }

 private:
  // plan() plans into the spare planner and makes it the live one only when it succeeds, so a
  // failed plan() (a workspace too small, ...) leaves schedule() showing the plan run() uses.
  Planner planners_[2];
  int live_ = 0;
  PrefillKernelConfig config_;
  cudaKernel_t kernel_ = nullptr, merge_kernel_ = nullptr;
  bool has_lse_ = true;
  int smem_bytes_ = 0, device_ = 0, head_chunks_ = 1, per_sm_ = 0;
  std::vector<int> active_;  // scratch of the round-robin staging
  int64_t grid_ = 0, merge_grid_ = 0, merge_grid_y_ = 1, workspace_used_ = 0;
  bool has_kv_tokens_ = false;  // some request of the plan has KV tokens
  bool graph_mode_ = false;     // the live plan was made with a CUDA-graph capacity
  kernels::PrefillParams base_{};  // the plan's part of the kernel parameters
  PlanStaging staging_;  // pinned buffers of the plan's copy to the workspace
  UserVariantCodeCache user_code_;  // the generated code of the last plan's user variant
};

}  // namespace kvattn::cuda
