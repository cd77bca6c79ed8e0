// The demo's oracle: attention of one (query row, query head) in float64, computed directly
// (max, exp, sum over every visible key) from the request's tokens in logical order, written
// independently of the library and its backends.
#pragma once

#include <cstdint>
#include <vector>

#include "host_tensors.h"

namespace kvattn_cli {

struct ReferenceRow {
  std::vector<double> o;  // [head_dim]
  double lse = 0;         // base 2, as kvattn's: log2(sum_j exp(s_j))
};

struct ReferenceQuery {
  const HostTensor* q = nullptr;  // [rows, Hq, D]
  int64_t q_row = 0;
  int qo_head = 0;
  // The request's keys and values in token order: token t of the request is row kv_row0 + t of
  // k and v ([tokens, Hkv, D]).
  const HostTensor* k = nullptr;
  const HostTensor* v = nullptr;
  int64_t kv_row0 = 0;
  int64_t kv_len = 0;
  int kv_head = 0;
  int64_t q_pos = 0;   // position of the query (keys are at 0 .. kv_len - 1)
  bool causal = false; // key t visible iff t <= q_pos
  double sm_scale = 0;
};

ReferenceRow attention_reference(const ReferenceQuery& query);

// Largest |a - b| and whether every element satisfies |a - b| <= atol + rtol * |b|.
struct Comparison {
  double max_abs_error = 0;
  bool ok = true;
};
void compare(double got, double want, double atol, double rtol, Comparison& c);

}  // namespace kvattn_cli
