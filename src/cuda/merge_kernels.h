// The GPU merge_states kernel: its JIT spec and its launcher. src/core's merge ops lower cuda
// tensors to MergeStatesParams and call launch_merge_states.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "cuda/jit.h"
#include "kernels/merge/merge_states.cuh"
#include "kvattn/dtype.h"

namespace kvattn::cuda {

// in, out: f32, f16 or bf16; arch: "sm_90a", "sm_80", ...
KernelSpec merge_states_spec(DType in, DType out, const std::string& arch);

// Launches on `stream` on the current device; no allocation, graph-capturable (the grid depends
// only on num_rows * num_heads). Compiles or loads the kernel on first use for this device's arch.
void launch_merge_states(const kernels::MergeStatesParams& p, DType in, DType out, cudaStream_t stream);

}  // namespace kvattn::cuda
