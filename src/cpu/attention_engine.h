// The CPU attention engine. Every KV format (paged, ragged, block-sparse) is lowered to the same
// description: per request, a list of KV segments (runs of tokens contiguous in their token
// stride), and the engine runs online-softmax attention over them with the built-in variant
// functor, the same code the GPU kernels use.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/variants/params.cuh"
#include "kvattn/dtype.h"

namespace kvattn::cpu {

// A run of tokens of one request: token t of the run (all heads) starts at k + t * k_token_stride.
struct KVSegment {
  const char* k;
  const char* v;
  int32_t num_tokens;
  int64_t kv_idx0;  // local index of the first token within the request
  int64_t kv_pos0;  // absolute position of the first token (masks, ALiBi, RoPE)
};

struct EngineRequest {
  int64_t q_row0;   // first row of q / out
  int64_t qo_len;
  int64_t kv_len;
  int64_t q_pos0;   // position of query 0 (kv_len - qo_len for append semantics)
  int64_t seg_begin, seg_end;
};

struct EngineProblem;
struct WorkUnit;
struct UnitState;

// The engine's entry points for one variant type (cpu/engine_kernels.h instantiates them): the
// built-in variant's are in the library; a user variant's come from the shared object its source
// was compiled into (cpu/variant_compiler.h), which exports kvattn_cpu_variant_kernels().
struct VariantKernels {
  int abi_version;  // kVariantKernelsAbi of the compiling engine
  void (*compute_unit)(const EngineProblem&, const WorkUnit&, const UnitState&);
  void (*store_unit)(const EngineProblem&, const WorkUnit&, const UnitState&);
  bool (*use_softmax)(const kernels::VariantParams&);
};
inline constexpr int kVariantKernelsAbi = 1;

// Strides are in elements; the head dim is contiguous everywhere.
struct EngineProblem {
  int num_qo_heads = 0, num_kv_heads = 0, head_dim_qk = 0, head_dim_vo = 0;
  const char* q = nullptr;
  DType q_dtype = DType::f32;
  int64_t q_row_stride = 0, q_head_stride = 0;
  DType kv_dtype = DType::f32;
  int64_t k_token_stride = 0, k_head_stride = 0, v_token_stride = 0, v_head_stride = 0;
  char* out = nullptr;
  DType o_dtype = DType::f32;
  int64_t o_row_stride = 0, o_head_stride = 0;
  float* lse = nullptr;  // optional
  int64_t lse_row_stride = 0, lse_head_stride = 0;
  kernels::VariantParams variant;
  const VariantKernels* user_kernels = nullptr;  // a user variant's; null: the built-in variant
  std::vector<EngineRequest> requests;
  std::vector<KVSegment> segments;
};

// One piece of work: query rows [q_begin, q_end) of a request for the query heads of one KV head,
// against local KV tokens [kv_begin, kv_end).
struct WorkUnit {
  int32_t request;
  int32_t kv_head;
  int64_t q_begin, q_end;
  int64_t kv_begin, kv_end;
};

// The (unnormalised) state of a work unit, f32, laid out [row][group head][...]: o is already
// divided by the softmax denominator; lse is base 2 (-inf for a fully masked row). For sigmoid
// attention o is the plain sum and lse is unused.
struct UnitState {
  float* o;    // [rows * group * head_dim_vo]
  float* lse;  // [rows * group]
};

// Computes a unit into `state` (scratch owned by the caller's thread).
void compute_unit(const EngineProblem& p, const WorkUnit& unit, const UnitState& state);
// Writes a unit's state to the problem's out (in o_dtype, times v_scale; a user variant's sink and
// output transform applied) and lse.
void store_unit(const EngineProblem& p, const WorkUnit& unit, const UnitState& state);
// Whether the problem's variant normalises with a softmax (else: no lse, partial sums add).
bool uses_softmax(const EngineProblem& p);

// Runs the whole problem without splitting KV: units of up to kQueryTile rows per request and KV
// head, spread over the global thread pool.
void run_unsplit(const EngineProblem& p);

inline constexpr int64_t kQueryTile = 16;

}  // namespace kvattn::cpu
