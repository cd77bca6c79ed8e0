// The merge kernels' fold of split-KV rows, shared by decode and prefill: n partial states
// (o_k, lse_k), k = 0 .. n-1, of one output row (SEMANTICS.md merge rule, LSE in base 2; with
// softmax off, sigmoid attention, the plain sum of the o_k; a NaN lse makes the row NaN).
//
// A merge CTA has kMergeRowWarps warps; `row_warps` of them (1, 2, 4 or 8) fold one row, so a
// CTA folds kMergeRowWarps / row_warps rows. Each warp takes every row_warps-th slot, its lanes
// a float4 of the head dim each, and keeps a running max (online softmax), with 4 slots' loads in
// flight; then the row's warps combine their (max, weight sum, o) through shared memory.
// Why: one CTA per merge entry with one thread per output element (the first merge kernel) made
// 1 x 4096 decode a chain of 64 dependent L2 loads on 8 CTAs (measured 41.8 us, cuDNN ~15 us),
// and level 0 of a cascade (16 queries x 4096 prefix tokens: 8 entries of 64 slots) 236 us.
// Splitting a row's slots over warps cuts the chain; spreading rows over CTAs fills the GPU.
#pragma once

#include "kernels/common/host_device.cuh"

namespace kvattn::kernels {

constexpr int kMergeRowWarps = 8;
constexpr int kMergeRowThreads = 32 * kMergeRowWarps;

// Warps per row for merge entries of at most max_slots slots: enough that each warp has about
// slots_per_warp slots (8: two rounds of loads; decode takes 4, one round), at most the CTA. Host
// code calls this at plan() time.
KVATTN_HD int merge_row_warps_for(int max_slots, int slots_per_warp = 8) {
  int w = 1;
  while (w < kMergeRowWarps && w * slots_per_warp < max_slots) w *= 2;
  return w;
}

#if defined(__CUDACC__)

namespace merge_rows_detail {
template <int DVO>
struct alignas(16) Shared {  // o rows are stored as float4s
  float o[kMergeRowWarps][DVO];
  float max[kMergeRowWarps], wsum[kMergeRowWarps];
  int nan[kMergeRowWarps];
};
}  // namespace merge_rows_detail

// Called by every thread of the CTA (it synchronises the CTA once). The row of this thread's warp
// has states lse[k * lse_stride], o[k * o_stride .. + DVO) (f32, o 16-byte aligned, o_stride a
// multiple of 4); `valid` false (a row past the entry's end) folds nothing and stores nothing.
// store(e, o_e, lse) is called once per element e of a valid row (lse the row's, the same for all e).
template <int DVO, class Store>
__device__ __forceinline__ void fold_row_across_warps(const float* lse, int64_t lse_stride, const float* o,
                                                      int64_t o_stride, int n, bool softmax_on, int row_warps,
                                                      bool valid, Store store) {
  static_assert(DVO % 4 == 0, "the head dim is a multiple of 4 (float4 lanes)");
  constexpr int kVec4 = DVO / 4, kPerLane = (kVec4 + 31) / 32, kInFlight = 4;
  __shared__ merge_rows_detail::Shared<DVO> sh;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sub = warp % row_warps;  // this warp takes slots sub, sub + row_warps, ...

  float4 acc[kPerLane];
#pragma unroll
  for (int v = 0; v < kPerLane; ++v) acc[v] = make_float4(0.f, 0.f, 0.f, 0.f);
  float run_max = -INFINITY, wsum = 0.0f;
  bool nan = false;
  if (valid) {
    for (int k0 = sub; k0 < n; k0 += kInFlight * row_warps) {
      float l[kInFlight];
      float4 x[kInFlight][kPerLane];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int k = k0 + u * row_warps;
        const bool in = k < n;
        l[u] = in ? __ldcg(lse + k * lse_stride) : -INFINITY;
#pragma unroll
        for (int v = 0; v < kPerLane; ++v) {
          const int j = lane + 32 * v;
          x[u][v] = in && j < kVec4 ? __ldcg(reinterpret_cast<const float4*>(o + k * o_stride) + j)
                                    : make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
      float new_max = run_max;
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        nan |= l[u] != l[u];
        if (softmax_on && l[u] == l[u]) new_max = fmaxf(new_max, l[u]);
      }
      if (softmax_on && new_max != run_max) {  // rescale what was summed against the old max
        const float s = exp2f(run_max - new_max);  // run_max = -inf: 0, and acc is 0 anyway
        wsum *= s;
#pragma unroll
        for (int v = 0; v < kPerLane; ++v) acc[v] = make_float4(acc[v].x * s, acc[v].y * s, acc[v].z * s, acc[v].w * s);
        run_max = new_max;
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        // A state with lse = -inf (or NaN, or past n) adds nothing; its o is not used (may be garbage).
        float w;
        if (softmax_on)
          w = l[u] == -INFINITY || l[u] != l[u] ? 0.0f : exp2f(l[u] - run_max);
        else
          w = k0 + u * row_warps < n ? 1.0f : 0.0f;
        if (w == 0.0f) continue;
        wsum += w;
#pragma unroll
        for (int v = 0; v < kPerLane; ++v) {
          acc[v].x = fmaf(w, x[u][v].x, acc[v].x);
          acc[v].y = fmaf(w, x[u][v].y, acc[v].y);
          acc[v].z = fmaf(w, x[u][v].z, acc[v].z);
          acc[v].w = fmaf(w, x[u][v].w, acc[v].w);
        }
      }
    }
  }
#pragma unroll
  for (int v = 0; v < kPerLane; ++v) {
    const int j = lane + 32 * v;
    if (j < kVec4) reinterpret_cast<float4*>(sh.o[warp])[j] = acc[v];
  }
  if (lane == 0) {
    sh.max[warp] = run_max;
    sh.wsum[warp] = wsum;
    sh.nan[warp] = nan;
  }
  __syncthreads();
  if (!valid) return;
  const int first = warp - sub;  // the row's first warp
  float row_max = -INFINITY;
  bool row_nan = false;
  for (int w = 0; w < row_warps; ++w) {
    row_max = fmaxf(row_max, sh.max[first + w]);
    row_nan |= sh.nan[first + w] != 0;
  }
  float scale[kMergeRowWarps];
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kMergeRowWarps; ++w) {
    scale[w] = 0.0f;
    if (w < row_warps) {
      scale[w] = !softmax_on ? 1.0f : sh.max[first + w] == -INFINITY ? 0.0f : exp2f(sh.max[first + w] - row_max);
      total += scale[w] * sh.wsum[first + w];
    }
  }
  float row_lse = -INFINITY;
  if (softmax_on && total > 0.0f) row_lse = row_max + log2f(total);
  if (row_nan) row_lse = NAN;
  for (int e = sub * 32 + lane; e < DVO; e += row_warps * 32) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kMergeRowWarps; ++w)
      if (w < row_warps) sum = fmaf(scale[w], sh.o[first + w][e], sum);
    float out = softmax_on ? (total > 0.0f ? sum / total : 0.0f) : sum;
    if (row_nan) out = NAN;
    store(e, out, row_lse);
  }
}

#endif  // __CUDACC__

}  // namespace kvattn::kernels
