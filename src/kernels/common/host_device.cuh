// Lets the same functor compile as CUDA device code (NVRTC/nvcc) and as plain host C++, so the CPU
// backend runs the very code the GPU kernels run.
#pragma once

#if defined(__CUDACC_RTC__)
// NVRTC has no C++ standard library headers (the JIT passes only kvattn's embedded headers), so
// the fixed-width integer types the params structs use are declared here. The widths hold on every
// target NVRTC supports (LP64 device ABI).
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)  // device code only
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fc00000)  // device code only
#endif
#define KVATTN_HD __host__ __device__ __forceinline__
#elif defined(__CUDACC__)
#include <cstdint>
#define KVATTN_HD __host__ __device__ __forceinline__
#else
#include <cmath>
#include <cstdint>
#define KVATTN_HD inline
#endif
