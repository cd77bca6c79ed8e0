// merge_states (SEMANTICS.md, "Merging attention states"): folds k partial attention states per
// (row, head) into one. With base-2 LSEs s_i and values o_i:
//   lse = log2(sum_i 2^s_i),  o = sum_i o_i * 2^(s_i - lse)
// which equals folding (o_a, s_a) (+) (o_b, s_b) pairwise in index order. A state with s_i = -inf
// contributes nothing (its o_i is not even read, so garbage there is harmless); when every state
// is -inf the result is o = 0, lse = -inf.
#pragma once

#include "kernels/common/host_device.cuh"
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#include "kernels/common/ptx.cuh"
#endif

namespace kvattn::kernels {

// v [n, k, H, D] of dtype DIn, s [n, k, H] f32 -> v_out [n, H, D] of DOut, s_out [n, H] f32 (optional).
// Strides in elements; each head vector (D) is contiguous.
struct MergeStatesParams {
  const void* v = nullptr;
  int64_t v_row = 0, v_state = 0, v_head = 0;
  const float* s = nullptr;
  int64_t s_row = 0, s_state = 0, s_head = 0;
  void* v_out = nullptr;
  int64_t vo_row = 0, vo_head = 0;
  float* s_out = nullptr;  // may be null
  int64_t so_row = 0, so_head = 0;
  int64_t num_rows = 0;
  int32_t num_states = 0, num_heads = 0, head_dim = 0;
};

// One warp per (row, head); the block size the launcher must use.
constexpr int kMergeWarpsPerBlock = 4;
constexpr int kMergeThreads = 32 * kMergeWarpsPerBlock;

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)

// DIn, DOut: DTypeCode (kF32, kF16, kBF16), numbered as kvattn::DType.
template <int DIn, int DOut>
__device__ __forceinline__ void merge_states(const MergeStatesParams& p) {
  const float neg_inf = __uint_as_float(0xff800000u);
  const int64_t pair = int64_t(blockIdx.x) * kMergeWarpsPerBlock + threadIdx.x / 32;
  if (pair >= p.num_rows * p.num_heads) return;
  const int lane = threadIdx.x % 32;
  const int64_t row = pair / p.num_heads;
  const int head = int(pair % p.num_heads);
  const float* s = p.s + row * p.s_row + head * p.s_head;

  // The max first, so that no 2^(s_i - m) overflows.
  float m = neg_inf;
  for (int i = 0; i < p.num_states; ++i) m = fmaxf(m, s[i * p.s_state]);
  float lse = neg_inf;
  if (m != neg_inf) {
    float sum = 0.0f;
    for (int i = 0; i < p.num_states; ++i) sum += exp2f(s[i * p.s_state] - m);
    lse = m + log2f(sum);
  }

  const int64_t v0 = row * p.v_row + head * p.v_head;
  const int64_t o0 = row * p.vo_row + head * p.vo_head;
  for (int d = lane; d < p.head_dim; d += 32) {
    float acc = 0.0f;
    if (lse != neg_inf) {
      for (int i = 0; i < p.num_states; ++i) {
        float si = s[i * p.s_state];
        if (si != neg_inf) acc += load_as_f32<DIn>(p.v, v0 + i * p.v_state + d) * exp2f(si - lse);
      }
    }
    store_from_f32<DOut>(p.v_out, o0 + d, acc);
  }
  if (lane == 0 && p.s_out) p.s_out[row * p.so_row + head * p.so_head] = lse;
}

#endif

}  // namespace kvattn::kernels
