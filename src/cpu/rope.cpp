// apply_rope and apply_rope_with_cos_sin_cache on the CPU. apply_rope's frequencies come from
// kernels::rope_frequency, and the rotation is kernels::rope_rotate's formula with cos/sin hoisted
// out of the head loop (they depend only on the row's position): a = float(pos) * f_t, (x0, x1) <-
// (x0 c - x1 s, x1 c + x0 s), all in f32. So apply_rope gives bit for bit what the fused RoPE of
// attention computes on the same f32 vector. With a cos/sin table (vLLM's and SGLang's form,
// FlashInfer's apply_rope_with_cos_sin_cache) c = table[pos][t] and s = table[pos][rotary_dim / 2 +
// t] replace cosf/sinf; the pairs and the arithmetic are the same (both layouts use index t, as
// FlashInfer's kernel does).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/convert.h"
#include "cpu/ops.h"
#include "kernels/variants/rope.cuh"

namespace kvattn::cpu {

namespace {
void rotate_side(const RopeProblem& p, const RopeSide& s, int64_t r, const float* cs,
                 const float* sn, float* x) {
  const size_t esz = dtype_size(s.dtype);
  const int D = p.head_dim, half = p.rotary_dim / 2;
  for (int h = 0; h < s.num_heads; ++h) {
    convert::load_row(s.in + (r * s.in_row + h * s.in_head) * int64_t(esz), s.dtype, D, x);
    for (int t = 0; t < half; ++t) {
      const int i0 = p.interleave ? 2 * t : t;
      const int i1 = p.interleave ? 2 * t + 1 : t + half;
      const float x0 = x[i0], x1 = x[i1];
      x[i0] = x0 * cs[t] - x1 * sn[t];
      x[i1] = x1 * cs[t] + x0 * sn[t];
    }
    // Elements past rotary_dim were loaded and are stored back unchanged (exact: a round trip
    // through f32 of an f32/f16/bf16 value is the identity).
    convert::store_row(s.out + (r * s.out_row + h * s.out_head) * int64_t(esz), s.dtype, D, x);
  }
}
}  // namespace

void rope(const RopeProblem& p) {
  const int half = p.rotary_dim / 2;
  std::vector<float> freq(static_cast<size_t>(p.cos_sin ? 0 : half));
  for (int t = 0; t < half && !p.cos_sin; ++t)
    freq[size_t(t)] = kernels::rope_frequency(p.params, t, p.rotary_dim, p.llama31);
  const int64_t per_row = int64_t(p.q.num_heads + p.k.num_heads) * p.head_dim;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, per_row));
  parallel_chunks(p.num_rows, grain, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> cs, sn, x;
    cs.resize(size_t(half));
    sn.resize(size_t(half));
    x.resize(size_t(p.head_dim));
    for (int64_t r = begin; r < end; ++r) {
      if (p.cos_sin) {  // the table's row (positions checked by the caller)
        const float* row = p.cos_sin + int64_t(p.pos_ids[r]) * p.cos_sin_row;
        rotate_side(p, p.q, r, row, row + half, x.data());
        rotate_side(p, p.k, r, row, row + half, x.data());
        continue;
      }
      const float pos = float(int64_t(p.pos_ids[r]));
      for (int t = 0; t < half; ++t) {
        const float a = pos * freq[size_t(t)];
        cs[size_t(t)] = cosf(a);
        sn[size_t(t)] = sinf(a);
      }
      rotate_side(p, p.q, r, cs.data(), sn.data(), x.data());
      rotate_side(p, p.k, r, cs.data(), sn.data(), x.data());
    }
  });
}

}  // namespace kvattn::cpu
