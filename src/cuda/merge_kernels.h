// The GPU merge kernels (kernels/merge/merge_states.cuh): their JIT specs and launchers. src/core's
// merge ops (kvattn/ops.h) validate CUDA tensors, lower them to MergeStatesParams /
// MergePairParams and call these.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "cuda/jit.h"
#include "kernels/merge/merge_states.cuh"
#include "kvattn/dtype.h"

namespace kvattn::cuda {

// in, out: f32, f16 or bf16; arch: "sm_90a", "sm_80", ...
KernelSpec merge_states_spec(DType in, DType out, const std::string& arch);  // merge_states
KernelSpec merge_pair_spec(DType in, DType out, const std::string& arch);    // merge_state(_in_place)

// Launch on `stream` on the current device: no allocation, no synchronisation, graph-capturable
// (the grid depends only on num_rows * num_heads). The first launch of a dtype combination on a
// device compiles or loads its kernel (JIT); warm it up before capturing a graph. Nothing is
// launched when there is no (row, head) pair.
void launch_merge_states(const kernels::MergeStatesParams& p, DType in, DType out, cudaStream_t stream);
void launch_merge_pair(const kernels::MergePairParams& p, DType in, DType out, cudaStream_t stream);

}  // namespace kvattn::cuda
