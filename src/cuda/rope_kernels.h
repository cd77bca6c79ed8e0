// The GPU RoPE kernels (kernels/rope/rope.cuh): their named configurations, JIT specs and launcher.
// src/api/ops.cpp validates CUDA tensors (kvattn/ops.h says what is checked where), lowers them to
// RopeParams and a RopeKernelConfig and calls launch_rope.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "cuda/jit.h"
#include "kernels/rope/rope.cuh"
#include "kvattn/dtype.h"

namespace kvattn::cuda {

// One kernel: the dtype of q and k (f32, f16 or bf16), how it pairs the rotated elements, where its
// cos/sin come from, and its accesses (16: 16-byte vectors, which need every address, stride and
// the split points of the head 16-byte aligned; 0: scalar elements, for everything else).
struct RopeKernelConfig {
  DType dtype = DType::bf16;
  kernels::RopePairs pairs = kernels::RopePairs::rotate_half;
  kernels::RopeCosSin cos_sin = kernels::RopeCosSin::computed;
  int vector_bytes = 16;
  // "rope_bf16_half_computed_vec16", "rope_f16_interleaved_table_scalar"
  std::string name() const;
};

KernelSpec rope_spec(const RopeKernelConfig& c, const std::string& arch);

// The largest rotary_dim the GPU kernels take (a CTA holds its rows' cos/sin in shared memory).
constexpr int kMaxGpuRotaryDim = 8192;

// Whether the head's split points allow the 16-byte kernel (elems_per_vector = 16 / element size):
// the head dim, and the rotate-half partner offset rotary_dim / 2 (interleaved: rotary_dim), whole
// vectors. The caller checks that every address and stride is a multiple of 16 bytes.
bool rope_vectorizable(kernels::RopePairs pairs, int head_dim, int rotary_dim, int elems_per_vector);

// The launch of a problem: rows per CTA, CTAs, dynamic shared memory. A pure function of the shape
// and the SM count: about 4 items per thread per CTA, at least 2 CTAs per SM when there are rows
// enough, the cos/sin rows within 48 KB.
struct RopeLaunch {
  int tokens_per_block = 1;
  int64_t blocks = 0;
  int64_t smem_bytes = 0;
};
// items_per_row: (q heads + k heads) x pieces per head (rope_items_per_head).
RopeLaunch choose_rope_launch(int64_t num_rows, int64_t items_per_row, int rotary_dim, int sm_count);
// Pieces per head, as the kernel counts them.
int64_t rope_items_per_head(const kernels::RopeParams& p, const RopeKernelConfig& c);

// Launches on `stream` on the current device: no allocation, no synchronisation, graph-capturable
// (the grid depends only on the shape). The first launch of a config on a device compiles or loads
// its kernel (JIT); warm it up before capturing a graph. Nothing is launched when there is nothing
// to write.
void launch_rope(const kernels::RopeParams& p, const RopeKernelConfig& c, cudaStream_t stream);

// For `kvattn bench rope --sweep` only: rows per CTA for every later launch_rope in the process
// instead of choose_rope_launch's (0: the choice again). Not for serving code: nothing else reads it.
void set_rope_rows_per_cta_for_benchmarks(int rows_per_cta);
// The rows per CTA of the last launch_rope (benchmarks report it).
int last_rope_rows_per_cta();

}  // namespace kvattn::cuda
