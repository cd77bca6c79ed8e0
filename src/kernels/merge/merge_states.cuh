// Merging attention states (SEMANTICS.md, "Merging attention states") on the GPU: the kernels of
// merge_states (k states per (row, head), strided) and of merge_state / merge_state_in_place (two
// states with their own strides, an optional row mask). With base-2 LSEs s_i and values o_i:
//   m = max_i s_i,  d = sum_i 2^(s_i - m),  lse = m + log2(d),  o = (sum_i o_i 2^(s_i - m)) / d
// which equals folding (o_a, s_a) (+) (o_b, s_b) pairwise in index order, and is what the CPU
// backend computes (src/cpu/merge.cpp), in f32:
//  - a state with s_i = -inf contributes nothing and its o_i is not read (garbage there is
//    harmless); when every state is -inf the result is o = 0, lse = -inf; when exactly one is
//    finite, o and lse are that state's, bit for bit (before the rounding to the output dtype);
//  - a NaN lse makes the whole (row, head) NaN (o and lse), as on the CPU.
// One warp per (row, head). Each lane reads all states of its elements before writing them, and
// the LSE is written after a __syncwarp(), so the output may alias an input exactly (same pointer
// and strides).
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
  // Nonzero: head_dim, every v pointer and every v stride are multiples of 4 elements (and the
  // pointers aligned to 4 elements), so each lane moves 4 elements per access (8 or 16 bytes).
  int32_t vec4 = 0;
};

// (v_a, s_a) (+) (v_b, s_b) -> (v_out, s_out), each [n, H, D] / [n, H] with its own strides.
// Rows whose mask byte is 0 are skipped (nothing is read or written for them).
struct MergePairParams {
  const void* v_a = nullptr;
  int64_t va_row = 0, va_head = 0;
  const float* s_a = nullptr;
  int64_t sa_row = 0, sa_head = 0;
  const void* v_b = nullptr;
  int64_t vb_row = 0, vb_head = 0;
  const float* s_b = nullptr;
  int64_t sb_row = 0, sb_head = 0;
  void* v_out = nullptr;
  int64_t vo_row = 0, vo_head = 0;
  float* s_out = nullptr;
  int64_t so_row = 0, so_head = 0;
  const uint8_t* mask = nullptr;  // optional, [n] u8 with mask_stride
  int64_t mask_stride = 0;
  int64_t num_rows = 0;
  int32_t num_heads = 0, head_dim = 0;
  int32_t vec4 = 0;  // as MergeStatesParams::vec4
};

// One warp per (row, head); the block size the launchers must use.
constexpr int kMergeWarpsPerBlock = 4;
constexpr int kMergeThreads = 32 * kMergeWarpsPerBlock;

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)

namespace merge_detail {

// The states of one (row, head) of merge_states: k states `v_state` elements apart.
struct StridedStates {
  const char* v;  // state 0's head vector
  int64_t v_state_bytes;
  const float* s;
  int64_t s_state;
  int n;
  __device__ __forceinline__ int count() const { return n; }
  __device__ __forceinline__ float lse(int i) const { return s[i * s_state]; }
  __device__ __forceinline__ const char* head(int i) const { return v + i * v_state_bytes; }
};

// The two states of merge_state: each with its own address.
struct PairStates {
  const char* va;
  const char* vb;
  float sa, sb;  // read once, before anything is written
  __device__ __forceinline__ int count() const { return 2; }
  __device__ __forceinline__ float lse(int i) const { return i == 0 ? sa : sb; }
  __device__ __forceinline__ const char* head(int i) const { return i == 0 ? va : vb; }
};

// 4 elements of DT at p (aligned to 4 elements) as f32.
template <int DT>
__device__ __forceinline__ void load4(const char* p, float* out) {
  if constexpr (DT == kF32) {
    const uint4 w = *reinterpret_cast<const uint4*>(p);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
    unpack<DT, 4>(words, out);
  } else {
    const uint2 w = *reinterpret_cast<const uint2*>(p);
    const uint32_t words[2] = {w.x, w.y};
    unpack<DT, 4>(words, out);
  }
}

// Two f32 values rounded (ptx.cuh's store_from_f32: nearest even) into one packed f16x2 / bf16x2
// word, lo in the low half. The halves stay in registers.
template <int DT>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint16_t h[2];
  store_from_f32<DT>(h, 0, lo);
  store_from_f32<DT>(h, 1, hi);
  return uint32_t(h[0]) | (uint32_t(h[1]) << 16);
}

template <int DT>
__device__ __forceinline__ void store4(char* p, const float* v) {
  if constexpr (DT == kF32) {
    *reinterpret_cast<uint4*>(p) =
        make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
  } else {
    *reinterpret_cast<uint2*>(p) = make_uint2(pack2<DT>(v[0], v[1]), pack2<DT>(v[2], v[3]));
  }
}

// Folds the states of one (row, head) into out / s_out on the calling warp (all 32 lanes call it).
template <int DIn, int DOut, class States>
__device__ __forceinline__ void merge_head(const States& st, char* out, float* s_out, int head_dim,
                                           bool vec4) {
  const float neg_inf = __uint_as_float(0xff800000u), nan = __uint_as_float(0x7fffffffu);
  const int lane = threadIdx.x % 32;
  const int n = st.count();
  float m = neg_inf;
  bool any_nan = false;
  for (int i = 0; i < n; ++i) {
    const float si = st.lse(i);
    any_nan |= si != si;
    m = fmaxf(m, si);
  }
  // mode 0: every state -inf (o = 0); 1: merge; 2: a NaN lse (everything NaN).
  const int mode = any_nan ? 2 : m == neg_inf ? 0 : 1;
  float d = 0.0f;
  if (mode == 1)
    for (int i = 0; i < n; ++i) {
      const float si = st.lse(i);
      if (si != neg_inf) d += exp2f(si - m);
    }
  const float inv = mode == 1 ? 1.0f / d : 0.0f;
  const float fill = mode == 2 ? nan : 0.0f;
  constexpr int in_bytes = DTypeInfo<DIn>::bytes, out_bytes = DTypeInfo<DOut>::bytes;

  if (vec4) {
    for (int e = lane * 4; e < head_dim; e += 32 * 4) {
      float acc[4] = {fill, fill, fill, fill};
      if (mode == 1) {
        for (int i = 0; i < n; ++i) {
          const float si = st.lse(i);
          if (si == neg_inf) continue;
          const float w = exp2f(si - m);
          float x[4];
          load4<DIn>(st.head(i) + int64_t(e) * in_bytes, x);
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[j] += w * x[j];
        }
        if (inv != 1.0f) {
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[j] *= inv;
        }
      }
      store4<DOut>(out + int64_t(e) * out_bytes, acc);
    }
  } else {
    for (int e = lane; e < head_dim; e += 32) {
      float acc = fill;
      if (mode == 1) {
        for (int i = 0; i < n; ++i) {
          const float si = st.lse(i);
          if (si == neg_inf) continue;
          acc += exp2f(si - m) * load_as_f32<DIn>(st.head(i), e);
        }
        if (inv != 1.0f) acc *= inv;
      }
      store_from_f32<DOut>(out, e, acc);
    }
  }
  // Every lane has read its inputs (an aliased s_out may be one of them) before the LSE is written.
  __syncwarp();
  if (lane == 0 && s_out) *s_out = mode == 1 ? m + log2f(d) : mode == 2 ? nan : neg_inf;
}

}  // namespace merge_detail

// DIn, DOut: DTypeCode (kF32, kF16, kBF16), numbered as kvattn::DType.
template <int DIn, int DOut>
__device__ __forceinline__ void merge_states(const MergeStatesParams& p) {
  const int64_t pair = int64_t(blockIdx.x) * kMergeWarpsPerBlock + threadIdx.x / 32;
  if (pair >= p.num_rows * p.num_heads) return;
  const int64_t row = pair / p.num_heads;
  const int head = int(pair % p.num_heads);
  constexpr int in_bytes = DTypeInfo<DIn>::bytes, out_bytes = DTypeInfo<DOut>::bytes;
  merge_detail::StridedStates st{
      static_cast<const char*>(p.v) + (row * p.v_row + head * p.v_head) * in_bytes,
      p.v_state * in_bytes, p.s + row * p.s_row + head * p.s_head, p.s_state, p.num_states};
  char* out = static_cast<char*>(p.v_out) + (row * p.vo_row + head * p.vo_head) * out_bytes;
  float* s_out = p.s_out ? p.s_out + row * p.so_row + head * p.so_head : nullptr;
  merge_detail::merge_head<DIn, DOut>(st, out, s_out, p.head_dim, p.vec4 != 0);
}

template <int DIn, int DOut>
__device__ __forceinline__ void merge_pair(const MergePairParams& p) {
  const int64_t pair = int64_t(blockIdx.x) * kMergeWarpsPerBlock + threadIdx.x / 32;
  if (pair >= p.num_rows * p.num_heads) return;
  const int64_t row = pair / p.num_heads;
  const int head = int(pair % p.num_heads);
  if (p.mask && p.mask[row * p.mask_stride] == 0) return;  // the whole warp leaves
  constexpr int in_bytes = DTypeInfo<DIn>::bytes, out_bytes = DTypeInfo<DOut>::bytes;
  merge_detail::PairStates st{
      static_cast<const char*>(p.v_a) + (row * p.va_row + head * p.va_head) * in_bytes,
      static_cast<const char*>(p.v_b) + (row * p.vb_row + head * p.vb_head) * in_bytes,
      p.s_a[row * p.sa_row + head * p.sa_head], p.s_b[row * p.sb_row + head * p.sb_head]};
  char* out = static_cast<char*>(p.v_out) + (row * p.vo_row + head * p.vo_head) * out_bytes;
  merge_detail::merge_head<DIn, DOut>(st, out, p.s_out + row * p.so_row + head * p.so_head,
                                      p.head_dim, p.vec4 != 0);
}

#endif

}  // namespace kvattn::kernels
