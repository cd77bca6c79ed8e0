// Appending rows of K and V to the paged cache on the CPU. Destinations were resolved and checked
// by src/api/ops.cpp (no two rows share a slot), so rows are independent.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/convert.h"
#include "cpu/ops.h"

namespace kvattn::cpu {

namespace {
void copy_row(const AppendSide& s, int64_t r, int h, int64_t page, int64_t slot, float* tmp) {
  const size_t ssz = dtype_size(s.src_dtype), dsz = dtype_size(s.dst_dtype);
  const char* src = s.src + (r * s.src_row + h * s.src_head) * int64_t(ssz);
  char* dst = s.dst + (page * s.dst_page + slot * s.dst_token + h * s.dst_head) * int64_t(dsz);
  if (s.src_dtype == s.dst_dtype) {
    std::memcpy(dst, src, size_t(s.head_dim) * ssz);  // bit-exact, NaN payloads included
  } else {
    convert::load_row(src, s.src_dtype, s.head_dim, tmp);
    convert::store_row(dst, s.dst_dtype, s.head_dim, tmp);
  }
}
}  // namespace

void append_paged(const AppendProblem& p) {
  const int64_t per_row = int64_t(p.num_heads) * (p.k.head_dim + p.v.head_dim);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, per_row));
  parallel_chunks(p.num_rows, grain, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> tmp;
    tmp.resize(size_t(std::max(p.k.head_dim, p.v.head_dim)));
    for (int64_t r = begin; r < end; ++r) {
      const int64_t page = p.page[size_t(r)], slot = p.slot[size_t(r)];
      for (int h = 0; h < p.num_heads; ++h) {
        copy_row(p.k, r, h, page, slot, tmp.data());
        copy_row(p.v, r, h, page, slot, tmp.data());
      }
    }
  });
}

}  // namespace kvattn::cpu
