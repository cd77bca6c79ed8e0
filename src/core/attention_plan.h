// The host-side state a plan() leaves for run(): resolved shape, variant parameters, and copies of
// the index arrays (so the caller's host buffers may be reused after plan()).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kernels/variants/params.cuh"
#include "kvattn/attention.h"

namespace kvattn::detail {

enum class KVKind : uint8_t { paged, ragged, block_sparse };
class GpuPlan;  // core/attention_backend.h

struct ResolvedShape {
  int num_qo_heads = 0, num_kv_heads = 0, head_dim_qk = 0, head_dim_vo = 0;
  DType q_dtype = DType::bf16, kv_dtype = DType::bf16, o_dtype = DType::bf16;
  Variant variant;
};

// Checks an AttentionShape and fills in its defaults; throws kvattn::Error naming the field.
ResolvedShape resolve_shape(const AttentionShape& s);
// The flat parameter block of the built-in variant for this shape.
kernels::VariantParams make_variant_params(const ResolvedShape& s);

struct AttentionPlan {
  KVKind kind = KVKind::paged;
  bool is_decode = false;
  const char* api = "";  // "BatchDecode", ... (for messages)
  // The wrapper's workspace (a GPU plan's kernels write partial states into it at run()).
  TensorView workspace;
  ResolvedShape shape;
  kernels::VariantParams variant;  // custom-mask pointers point into the vectors below
  int page_size = 0;
  std::vector<int32_t> qo_indptr;      // query rows per request (decode: 0, 1, ..., B)
  std::vector<int32_t> kv_indptr;      // pages (paged), tokens (ragged), blocks (BSR) per request
  std::vector<int32_t> kv_indices;     // page ids (paged) or column blocks (BSR)
  std::vector<int32_t> last_page_len;  // paged
  std::vector<int64_t> kv_len;         // tokens per request
  std::vector<uint8_t> custom_mask;
  std::vector<int32_t> mask_indptr;
  int64_t bsr_M = 0, bsr_N = 0, bsr_R = 1, bsr_C = 1;
  int64_t max_page_index = -1;         // largest page id referenced (checked against the cache)
  int64_t max_page_pos = -1;           // its position in kv_indices
  // A device-resident page table (GPU paths only): read in place and checked by the kernels;
  // kv_indices is then empty. Null: host ids.
  const int32_t* device_kv_indices = nullptr;
  // A user variant's packed parameters (core/custom_params.h; variant.user_params points here) and,
  // on the CPU backend, its compiled engine entry points (cpu::VariantKernels).
  std::vector<uint64_t> custom_params;
  const void* cpu_user_kernels = nullptr;
  // The CPU backend's schedule (src/cpu/plan_executor.h) and the options it was made with.
  SchedulerOptions scheduler;
  std::optional<Plan> cpu_work;
  // The GPU side of the plan (core/attention_backend.h); null for a CPU plan.
  std::shared_ptr<const GpuPlan> gpu;

  int64_t batch_size() const { return int64_t(qo_indptr.size()) - 1; }
  int64_t total_q_rows() const { return qo_indptr.back(); }
};

// In CUDA-graph mode a captured run() replays the kernels and parameter values of the plan it
// captured, so between two graph-mode plans only the batch may change (lengths, page ids, mask
// bits), not the shape (heads, head dims, dtypes) or the variant's values. Throws kvattn::Error
// naming the first field that changed; `api` names the caller ("BatchPrefill"). Enforced on the CPU
// backend too, so that the contract is the same everywhere (and tested without a GPU).
void check_graph_replan(const AttentionPlan* previous, const AttentionPlan& next,
                        const SchedulerOptions& scheduler, const char* api);

}  // namespace kvattn::detail
