// The merge of split-KV partial states for the decode kernels' in-kernel fold
// (decode/split_fold.cuh): n states (o_k, lse_k), k = 0 .. n-1 in KV order, of four elements of
// one output row (SEMANTICS.md merge rule, LSE in base 2; with softmax off, sigmoid attention, the
// plain sum of the o_k). A split row can have tens of slots (1 x 4096 decode on 264 workers: 64),
// and a loop that loads one slot at a time is a chain of L2 round trips (measured on the H200:
// 1 x 4096 at 403 GB/s against cuDNN's 1,114, most of it in the merge). The states were written by
// other CTAs: they are read through L2 (__ldcg).
#pragma once

#include "kernels/common/host_device.cuh"

namespace kvattn::kernels {

// Four consecutive elements of one output row, folded from n states: o (the first state's four
// elements, 16-byte aligned) and o_stride in floats (a multiple of 4). Online over the slots in
// slot order (a running maximum, rescaled when it moves: the loop of merge_rows.cuh's
// fold_row_across_warps for one float4 and contiguous slots; sharing one helper between them
// changed the merge kernel's code and left it a spilled register at head dim 256), with
// kInFlight slots' loads issued before any is used: an output element is then ceil(n / kInFlight)
// L2 round trips, where a max pass and a sum pass over one element at a time (the first in-kernel
// fold) made 1 x 2048 decode's fold about 16 round trips per thread (21 us against 13 with the
// merge kernel; H200, 2026-11-30, docs/perf/HISTORY.md "Decode experiments").
struct FoldedState4 {
  float4 o;
  float lse;
  bool nan_state;  // some lse_k was NaN (a poisoned state): the caller makes the row NaN
};

template <int kInFlight = 8>
__device__ __forceinline__ FoldedState4 fold_states4(const float* lse, int64_t lse_stride, const float* o,
                                                     int64_t o_stride, int n, bool softmax_on) {
  float run_max = -INFINITY, wsum = 0.0f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  bool nan_state = false;
  for (int k0 = 0; k0 < n; k0 += kInFlight) {
    float l[kInFlight];
    float4 x[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const bool in = k0 + u < n;
      l[u] = in ? __ldcg(lse + (k0 + u) * lse_stride) : -INFINITY;
      x[u] = in ? __ldcg(reinterpret_cast<const float4*>(o + (k0 + u) * o_stride)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float new_max = run_max;
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      nan_state |= l[u] != l[u];
      if (softmax_on && l[u] == l[u]) new_max = fmaxf(new_max, l[u]);
    }
    if (softmax_on && new_max != run_max) {  // rescale what was summed against the old maximum
      const float s = exp2f(run_max - new_max);  // run_max = -inf: 0, and nothing was summed
      wsum *= s;
      acc = make_float4(acc.x * s, acc.y * s, acc.z * s, acc.w * s);
      run_max = new_max;
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      // A state with lse = -inf (or past n) adds nothing (the decode kernels write its o as 0); a
      // NaN state adds NaN, and nan_state makes the row NaN anyway.
      float w;
      if (softmax_on)
        w = l[u] == -INFINITY || l[u] != l[u] ? 0.0f : exp2f(l[u] - run_max);
      else
        w = k0 + u < n ? 1.0f : 0.0f;
      wsum += w;
      acc.x = fmaf(w, x[u].x, acc.x);
      acc.y = fmaf(w, x[u].y, acc.y);
      acc.z = fmaf(w, x[u].z, acc.z);
      acc.w = fmaf(w, x[u].w, acc.w);
    }
  }
  FoldedState4 r{acc, -INFINITY, nan_state};
  if (softmax_on) {
    const float inv = wsum > 0.0f ? 1.0f / wsum : 0.0f;
    r.o = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    r.lse = wsum > 0.0f ? run_max + log2f(wsum) : -INFINITY;
  }
  return r;
}

}  // namespace kvattn::kernels
