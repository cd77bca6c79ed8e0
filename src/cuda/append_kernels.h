// The GPU paged-append kernel (kernels/append/append_paged.cuh): its JIT spec and launcher.
// src/api/ops.cpp validates CUDA tensors (kvattn/ops.h says what is checked where), lowers them to
// AppendParams and calls launch_append_paged.
#pragma once

#include <cuda_runtime_api.h>

#include <initializer_list>
#include <string>

#include "cuda/jit.h"
#include "kernels/append/append_paged.cuh"

namespace kvattn::cuda {

// One kernel for every layout and dtype pair (the dtypes are run-time parameters).
KernelSpec append_paged_spec(const std::string& arch);

// The widest copy (16, 8, 4, 2 or 1 bytes) that divides every byte address and byte stride in
// `values` (pointers as integers, strides already multiplied by the element size).
int copy_width(std::initializer_list<int64_t> values);

// Launches on `stream` on the current device: no allocation, no synchronisation, graph-capturable
// (the grid depends only on num_rows). The first launch on a device compiles or loads the kernel
// (JIT); warm it up before capturing a graph. Nothing is launched for num_rows == 0.
void launch_append_paged(const kernels::AppendParams& p, cudaStream_t stream);

}  // namespace kvattn::cuda
