// The CUDA half of core/attention_backend.h in a build without the CUDA backend (compiled only
// then): a plan for a CUDA workspace is an error that says why.
#include "core/attention_backend.h"

#include "kvattn/error.h"

namespace kvattn::detail {

namespace {
[[noreturn]] void no_cuda_backend(const TensorView& workspace) {
  throw_error("the workspace is on ", workspace.device().str(), " but this build of kvattn has no CUDA backend");
}
}  // namespace

GpuKernels decode_kernels_for(const AttentionPlan&, const TensorView& workspace) { no_cuda_backend(workspace); }

std::unique_ptr<GpuPlan> plan_on_gpu(AttentionPlan&, const GpuPlan*, GpuKernels, std::span<const int32_t>,
                                     const TensorView& workspace, const SchedulerOptions&, void*) {
  no_cuda_backend(workspace);
}

void copy_host_to_gpu(const TensorView& dst, const void*, void*) { no_cuda_backend(dst); }

}  // namespace kvattn::detail
