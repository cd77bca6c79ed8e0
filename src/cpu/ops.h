// CPU kernels of the stand-alone operations (merge, paged append, RoPE). src/api/ops.cpp validates
// the arguments and lowers them to these flat descriptions; the kernels trust them. Strides are in
// elements; every head vector is contiguous.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/thread_pool.h"
#include "kernels/variants/params.cuh"
#include "kvattn/dtype.h"

namespace kvattn::cpu {

// fn(begin, end) over [0, n) in chunks of `grain` items on the global pool.
template <class Fn>
void parallel_chunks(int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int64_t chunks = (n + grain - 1) / grain;
  ThreadPool::global().parallel_for(chunks, [&](int64_t c, int) {
    int64_t b = c * grain;
    fn(b, b + grain < n ? b + grain : n);
  });
}

// ---- merge --------------------------------------------------------------------------------------
// One input state: v row r, head h at v + (r * v_row + h * v_head) elements of the problem's
// in_dtype; its lse at s[r * s_row + h * s_head].
struct MergeInput {
  const char* v;
  int64_t v_row, v_head;
  const float* s;
  int64_t s_row, s_head;
};

// Folds inputs[0], inputs[1], ... (in that order) per (row, head) into out. The output may alias an
// input exactly (same pointer and strides): each (row, head) is read completely before it is
// written. Rows whose mask byte is 0 are skipped (neither v_out nor s_out is written).
struct MergeProblem {
  int64_t num_rows = 0;
  int num_heads = 0, head_dim = 0;
  DType in_dtype = DType::f32;
  std::vector<MergeInput> inputs;
  char* v_out = nullptr;
  DType out_dtype = DType::f32;
  int64_t vo_row = 0, vo_head = 0;
  float* s_out = nullptr;
  int64_t so_row = 0, so_head = 0;
  const uint8_t* mask = nullptr;  // optional, [num_rows] with mask_stride
  int64_t mask_stride = 0;
};
void merge(const MergeProblem& p);

// ---- paged append -------------------------------------------------------------------------------
// One side (K or V) of the append: row r, head h of src goes to dst + page[r] * dst_page +
// slot[r] * dst_token + h * dst_head.
struct AppendSide {
  const char* src;
  DType src_dtype;
  int64_t src_row, src_head;
  char* dst;
  DType dst_dtype;
  int64_t dst_page, dst_token, dst_head;
  int head_dim;
};
struct AppendProblem {
  int64_t num_rows = 0;
  int num_heads = 0;
  AppendSide k{}, v{};
  std::vector<int64_t> page, slot;  // per row, already validated
};
void append_paged(const AppendProblem& p);

// ---- RoPE ---------------------------------------------------------------------------------------
struct RopeSide {
  const char* in;
  char* out;  // may equal in (with the same strides)
  DType dtype;
  int64_t in_row, in_head, out_row, out_head;
  int num_heads;
};
// Rotates the first rotary_dim elements of every head of row r by position pos_ids[r]; the rest of
// the head is copied. cos/sin come from cos_sin when given (apply_rope_with_cos_sin_cache: row p at
// cos_sin + p * cos_sin_row holds the cos of the rotary_dim / 2 frequencies, then their sin; the
// positions already checked against its rows), else from the frequencies of `params` (apply_rope).
struct RopeProblem {
  int64_t num_rows = 0;
  int head_dim = 0, rotary_dim = 0;
  bool interleave = false, llama31 = false;
  kernels::VariantParams params;  // rope_theta, rope_scale and the Llama 3.1 fields
  const int32_t* pos_ids = nullptr;
  const float* cos_sin = nullptr;
  int64_t cos_sin_row = 0;
  RopeSide q{}, k{};
};
void rope(const RopeProblem& p);

}  // namespace kvattn::cpu
