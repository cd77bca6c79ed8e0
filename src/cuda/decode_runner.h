// Paged batch decode on the GPU: plan() schedules the batch with the planner, picks and loads the
// kernel, and stages the work list and page table into the caller's device workspace; run() only
// launches (no allocation, no copy), so it can be captured in a CUDA graph and replayed after a
// new plan() for new lengths (graph mode keeps every buffer's address).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "cuda/attention_tensors.h"
#include "cuda/decode_kernels.h"
#include "cuda/plan_staging.h"
#include "cuda/tensor_map.h"
#include "kernels/decode/params.cuh"
#include "kvattn/plan.h"

namespace kvattn::cuda {

struct DecodeProblem {
  int num_qo_heads = 0, num_kv_heads = 0, head_dim_qk = 0, head_dim_vo = 0, page_size = 0;
  DType q_dtype = DType::bf16, kv_dtype = DType::bf16, o_dtype = DType::bf16;
  kernels::VariantParams variant;
  std::span<const int32_t> kv_indptr;  // validated, host (each staged item carries its page run)
  // The page ids: a host array copied into the workspace, or, when device_kv_indices is set, the
  // caller's table on the device, which the kernels read in place (and check) at run time.
  std::span<const int32_t> kv_indices;
  const int32_t* device_kv_indices = nullptr;
  std::span<const int32_t> kv_len;
  SchedulerOptions scheduler;
  // A user variant (null: none) and its packed parameters (core/custom_params.h), which plan()
  // stages into the workspace for variant.user_params.
  const CustomVariant* custom = nullptr;
  std::span<const uint64_t> custom_params;
};

// The limits of `device` for the kernel choices; throws when there is no CUDA device.
DeviceLimits decode_device_limits(int device);
// Whether `device` runs the bulk-copy decode kernel (DeviceLimits::has_bulk_copies).
inline bool device_has_bulk_decode(int device) { return decode_device_limits(device).has_bulk_copies(); }

class DecodeRunner {
 public:
  DecodeRunner() = default;
  ~DecodeRunner() = default;
  DecodeRunner(const DecodeRunner&) = delete;
  DecodeRunner& operator=(const DecodeRunner&) = delete;

  // Throws kvattn::Error (workspace too small, unsupported shape, no device) before touching the
  // previous plan's buffers, except the staging copy, which it orders after the previous one.
  void plan(const DecodeProblem& problem, void* workspace, int64_t workspace_bytes, int device,
            cudaStream_t stream);
  void run(const AttentionTensors& t, cudaStream_t stream) const;
  // Waits for `stream`, then throws kvattn::Error naming the first out-of-range page id a run
  // since the last plan() or check met (and clears the record); returns quietly otherwise.
  void check_errors(cudaStream_t stream) const;

  const Plan& schedule() const { return planners_[live_].current(); }
  const DecodeKernelConfig& config() const { return config_; }
  bool planned() const { return kernel_ != nullptr; }
  // Whether the planned kernel's weights are a softmax, so that run() can give an lse (false for a
  // user variant with use_softmax = false; the built-in sigmoid is refused before the backend).
  bool has_lse() const { return has_lse_; }
  // Bytes of device workspace the last plan() used.
  int64_t workspace_used() const { return workspace_used_; }

 private:
  // plan() plans into the spare planner and makes it the live one only when it succeeds, so a
  // failed plan() (a workspace too small, ...) leaves schedule() showing the plan run() uses.
  Planner planners_[2];
  int live_ = 0;
  bool graph_mode_ = false;  // the live plan was made with a CUDA-graph capacity
  DecodeKernelConfig config_;
  cudaKernel_t kernel_ = nullptr, merge_kernel_ = nullptr;
  bool has_lse_ = true;
  int smem_bytes_ = 0, device_ = 0, head_chunks_ = 1, per_sm_ = 0;
  std::vector<int32_t> qo_indptr_;  // 0, 1, ..., B for the planner
  std::vector<int> active_;         // scratch of the round-robin staging
  int64_t merge_grid_ = 0, merge_grid_y_ = 1, workspace_used_ = 0;
  kernels::DecodeParams base_{};  // the plan's part of the kernel parameters
  int64_t grid_ = 0;              // CTAs of the decode kernel (workers, or items)
  bool early_merge_launch_ = false;  // sm_90+: the merge launches during the decode kernel's tail
  bool tma_boxes_ = true;            // Overrides::decode_tma_boxes = false: the TMA kernel copies rows
  bool trace_ = false;               // Overrides::plan_trace: run() says when it has no tensor maps
  PlanStaging staging_;  // pinned buffers of the plan's copy to the workspace
  UserVariantCodeCache user_code_;  // the generated code of the last plan's user variant
  // DecodeTmaKernel's tensor maps of the caches run() was given, so that a serving loop that calls
  // run() once per layer (one cache each) encodes each layer's maps once: up to kMapSlots pairs,
  // replaced round-robin (a loop over more caches than that re-encodes two maps per run(), a few
  // microseconds of host time).
  struct TensorMaps {
    PagedCacheView k, v;
    kernels::TensorMapBytes k_map{}, v_map{};
    int token_dim = 0;
    bool ready = false;
  };
  static constexpr size_t kMapSlots = 128;
  const TensorMaps& tensor_maps(const PagedCacheView& k, const PagedCacheView& v) const;
  mutable std::vector<TensorMaps> maps_;
  mutable size_t next_map_slot_ = 0;
  mutable std::mutex maps_mutex_;  // run() is const: callers may run one plan from several threads
};

}  // namespace kvattn::cuda
