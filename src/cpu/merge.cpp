// Merging attention states (SEMANTICS.md, "Merging attention states") on the CPU.
//
// The fold keeps a running maximum m of the LSEs, a denominator d = sum 2^(lse_i - m) and an
// accumulator acc = sum o_i 2^(lse_i - m), all in f32; the result is o = acc / d,
// lse = m + log2(d). An input with lse = -inf contributes nothing (its o is never read, so a NaN
// there cannot leak), which gives the rules of SEMANTICS.md exactly: one -inf side leaves the other
// unchanged bit for bit (d = 1, acc = o), and all -inf gives o = 0, lse = -inf.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/convert.h"
#include "cpu/ops.h"

namespace kvattn::cpu {

void merge(const MergeProblem& p) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int D = p.head_dim, H = p.num_heads;
  const size_t isz = dtype_size(p.in_dtype), osz = dtype_size(p.out_dtype);
  const int64_t items = p.num_rows * H;
  // About 16K elements of input per chunk.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, int64_t(D) *
                                                   std::max<size_t>(1, p.inputs.size())));
  parallel_chunks(items, grain, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> acc, row;
    acc.resize(size_t(D));
    row.resize(size_t(D));
    for (int64_t it = begin; it < end; ++it) {
      const int64_t r = it / H;
      const int h = int(it % H);
      if (p.mask && p.mask[r * p.mask_stride] == 0) continue;
      float m = kNegInf, d = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (const MergeInput& in : p.inputs) {
        const float lse = in.s[r * in.s_row + h * in.s_head];
        if (lse == kNegInf) continue;
        const float m_new = std::max(m, lse);
        const float scale_old = std::exp2(m - m_new);  // 0 while nothing has been accumulated
        const float w = std::exp2(lse - m_new);
        convert::load_row(in.v + (r * in.v_row + h * in.v_head) * int64_t(isz), p.in_dtype, D,
                          row.data());
        if (scale_old == 1.0f) {
          for (int e = 0; e < D; ++e) acc[size_t(e)] += w * row[size_t(e)];
        } else {
          for (int e = 0; e < D; ++e) acc[size_t(e)] = acc[size_t(e)] * scale_old + w * row[size_t(e)];
        }
        d = d * scale_old + w;
        m = m_new;
      }
      float lse_out = kNegInf;
      if (d > 0.0f) {  // else: every input was -inf, o = 0
        const float inv = 1.0f / d;
        if (inv != 1.0f)
          for (int e = 0; e < D; ++e) acc[size_t(e)] *= inv;
        lse_out = m + std::log2(d);
      } else if (d != d) {  // NaN lse or o: propagate
        std::fill(acc.begin(), acc.end(), d);
        lse_out = d;
      }
      convert::store_row(p.v_out + (r * p.vo_row + h * p.vo_head) * int64_t(osz), p.out_dtype, D,
                         acc.data());
      p.s_out[r * p.so_row + h * p.so_head] = lse_out;
    }
  });
}

}  // namespace kvattn::cpu
