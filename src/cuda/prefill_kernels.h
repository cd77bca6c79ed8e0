// The batch prefill/append kernel family (tensor cores, src/kernels/prefill/): which kernel a
// prefill problem runs (a plain host function, unit-tested on the CPU), its JIT specs and its
// shared-memory size.
#pragma once

#include <cstdint>
#include <string>

#include "cuda/jit.h"
#include "kvattn/dtype.h"

namespace kvattn::cuda {

// Everything that specialises one prefill kernel.
struct PrefillKernelConfig {
  DType q_dtype = DType::bf16, kv_dtype = DType::bf16, o_dtype = DType::bf16;
  int head_dim_qk = 128, head_dim_vo = 128;
  int heads_per_cta = 1;  // query heads of one KV head's group packed into the M tile (blockIdx.y: the rest)
  int warps = 4;          // each owns 16 rows of the M tile: M = 16 x warps
  int kv_tile = 64;       // KV tokens per pipeline stage
  int stages = 2;
  bool paged = false;
  int page_size = 0;      // paged: baked in when a power of two <= 128, else 0 (read at run time)
  uint32_t features = 0;  // kernels::VariantFeature bits

  int threads() const { return warps * 32; }
  int rows() const { return warps * 16; }
  // Query tokens per work item (the planner's TileShape::query_tokens).
  int query_tokens() const { return rows() / heads_per_cta; }
  std::string name() const;  // "prefill_bf16_hd128_g4_w4_k64_s2_paged16_f1"
};

// The heuristic (unit-tested in tests/prefill_config_test.cpp):
//  - tensor cores always: q is f16 or bf16 and the MMA type; KV is the same dtype or fp8 (e4m3,
//    e5m2: converted in shared memory, scales folded into sm_scale and the output);
//  - heads per CTA: the largest divisor of the GQA group up to 128 (the whole group, in practice);
//  - warps (M = 16 x warps rows): the fewest that hold the longest request's packed rows
//    (max_qo_len x heads), at most 8 (4 for head dims above 128: registers and shared memory);
//  - KV tiles of 64 tokens (32 for head dims above 128 or a single warp), 2 stages.
// Throws kvattn::Error naming the value for dtypes or head dims the GPU kernels do not take.
PrefillKernelConfig choose_prefill_config(DType q, DType kv, DType o, int head_dim_qk, int head_dim_vo,
                                          int group_size, bool paged, int page_size, uint32_t features,
                                          int64_t max_qo_len);

int prefill_smem_bytes(const PrefillKernelConfig& c);
KernelSpec prefill_spec(const PrefillKernelConfig& c, const std::string& arch);
// The merge of split rows for the same output dtype, head dim and softmax/sigmoid choice.
KernelSpec prefill_merge_spec(const PrefillKernelConfig& c, const std::string& arch);
inline constexpr int kPrefillMergeThreads = 256;

}  // namespace kvattn::cuda
