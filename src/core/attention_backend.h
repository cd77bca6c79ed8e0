// The seam between the attention API (src/api/) and the backends (src/cpu/, src/cuda/): the API
// validates a plan() into an AttentionPlan and a run()'s tensors against it, then hands both to a
// backend through the functions declared here. core/ declares them and the backends define them,
// so core/ depends on neither backend and each backend on core/ only.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/attention_plan.h"

namespace kvattn::detail {

// The tensors of one run(), already checked against the plan (shapes, dtypes, devices, aliasing).
struct RunTensors {
  TensorView q{}, out{}, lse{};         // lse may be undefined
  const PagedKVCache* paged = nullptr;  // paged plans
  TensorView k{}, v{};                  // ragged and block-sparse plans
};

// ---- CPU backend (src/cpu/attention_backend.cpp) ------------------------------------------------
// The schedule the CPU engine runs for `plan` (SchedulerOptions::num_workers 0: the CPU threads).
Plan cpu_schedule(const AttentionPlan& plan, const SchedulerOptions& scheduler);
// Completes `plan` for the CPU: a user variant compiled (or found in the cache), the schedule made.
void plan_on_cpu(AttentionPlan& plan, const SchedulerOptions& scheduler);
// Runs a plan made for the CPU (plan.cpu_work). Split rows keep their partial states in
// `workspace` when it is a large enough host buffer.
void run_on_cpu(const AttentionPlan& plan, const RunTensors& t, const TensorView& workspace);

// ---- CUDA backend (src/cuda/attention_backend.cpp; src/api/without_cuda.cpp in a build without
// it, where each of these throws kvattn::Error saying so) -----------------------------------------
enum class GpuKernels { decode, prefill };

// The GPU half of a plan: the kernels chosen, the schedule staged in the workspace, the runners.
class GpuPlan {
 public:
  virtual ~GpuPlan() = default;
  virtual void run(const AttentionPlan& plan, const RunTensors& t, void* stream) const = 0;
  // Waits for `stream`; throws naming the first out-of-range device page id a run met.
  virtual void check_errors(void* stream) const = 0;
  virtual const Plan& schedule() const = 0;
  virtual GpuKernels kernels() const = 0;
  // The name of the attention kernel run() launches (its JIT spec's; the merge of split rows not named).
  virtual std::string kernel_name() const = 0;
};

// BatchDecode's choice of kernels for `plan` on the workspace's device
// (cuda::decode_uses_prefill_kernels documents the heuristic).
GpuKernels decode_kernels_for(const AttentionPlan& plan, const TensorView& workspace);

// Schedules `plan` on `kernels` and stages it into `workspace` (a CUDA byte buffer). Paged plans
// take their host page ids from `host_kv_indices` (plan.kv_indices need not hold a copy); a
// block-sparse plan is completed as the paged plan it runs as. The runners of `previous` are
// reused (graph mode keeps their buffers).
std::unique_ptr<GpuPlan> plan_on_gpu(AttentionPlan& plan, const GpuPlan* previous, GpuKernels kernels,
                                     std::span<const int32_t> host_kv_indices,
                                     const TensorView& workspace, const SchedulerOptions& scheduler,
                                     void* stream);

// Copies dst.numel() bytes from host memory to dst (a u8 view on a CUDA device) on `stream`; the
// host buffer may be reused when it returns.
void copy_host_to_gpu(const TensorView& dst, const void* src, void* stream);

}  // namespace kvattn::detail
