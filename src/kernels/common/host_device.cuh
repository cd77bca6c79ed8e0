// Lets the same functor compile as CUDA device code (NVRTC/nvcc) and as plain host C++, so the CPU
// backend runs the very code the GPU kernels run.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KVATTN_HD __host__ __device__ __forceinline__
#else
#include <cmath>
#include <cstdint>
#define KVATTN_HD inline
#endif
