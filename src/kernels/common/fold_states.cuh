// The merge of split-KV partial states, shared by the decode and prefill merges: n states (o_k,
// lse_k), k = 0 .. n-1 in KV order, of one output element (SEMANTICS.md merge rule, LSE in base 2;
// with softmax off, sigmoid attention, the plain sum of the o_k).
//
// A split row can have tens of slots (1 x 4096 decode on 264 workers: 64), and a loop that loads
// one slot at a time is a chain of L2 round trips (measured on the H200: 1 x 4096 at 403 GB/s
// against cuDNN's 1,114, most of it in the merge). So kInFlight slots' loads are issued together
// before any is used; the sums still run in slot order, so results are the same bits as a plain
// loop's. The states were written by other CTAs: they are read through L2 (__ldcg).
#pragma once

#include "kernels/common/host_device.cuh"

namespace kvattn::kernels {

struct FoldedState {
  float o, lse;
  bool nan_state;  // some lse_k was NaN (a poisoned state): the caller makes the row NaN
};

template <int kInFlight = 8>
__device__ __forceinline__ FoldedState fold_states(const float* lse, int64_t lse_stride, const float* o,
                                                   int64_t o_stride, int n, bool softmax_on) {
  float lse_max = -INFINITY;
  bool nan_state = false;
  if (softmax_on) {
    for (int k0 = 0; k0 < n; k0 += kInFlight) {
      float l[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) l[u] = k0 + u < n ? __ldcg(lse + (k0 + u) * lse_stride) : -INFINITY;
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) lse_max = fmaxf(lse_max, l[u]);
    }
  }
  float acc = 0.0f, wsum = 0.0f;
  for (int k0 = 0; k0 < n; k0 += kInFlight) {
    float l[kInFlight], x[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const bool in = k0 + u < n;
      l[u] = in ? __ldcg(lse + (k0 + u) * lse_stride) : -INFINITY;
      x[u] = in ? __ldcg(o + (k0 + u) * o_stride) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      if (k0 + u >= n) break;
      nan_state |= l[u] != l[u];
      if (!softmax_on) {
        acc += x[u];
        continue;
      }
      const float w = l[u] == -INFINITY ? 0.0f : exp2f(l[u] - lse_max);
      acc += w * x[u];
      wsum += w;
    }
  }
  FoldedState r{acc, -INFINITY, nan_state};
  if (softmax_on) {
    r.o = wsum > 0.0f ? acc / wsum : 0.0f;
    r.lse = wsum > 0.0f ? lse_max + log2f(wsum) : -INFINITY;
  }
  return r;
}

}  // namespace kvattn::kernels
