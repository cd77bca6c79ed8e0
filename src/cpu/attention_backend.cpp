// The CPU backend of the attention API (core/attention_backend.h): every KV format is lowered to
// the engine's per-request KV segments (cpu/attention_engine.h) and run on the plan's schedule.
#include "core/attention_backend.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "cpu/attention_engine.h"
#include "cpu/plan_executor.h"
#include "cpu/thread_pool.h"
#include "cpu/variant_compiler.h"
#include "kvattn/error.h"

namespace kvattn::detail {

namespace {

// The query/output part of the engine's problem.
cpu::EngineProblem begin_problem(const AttentionPlan& plan, const RunTensors& t) {
  const auto& s = plan.shape;
  cpu::EngineProblem p;
  p.num_qo_heads = s.num_qo_heads;
  p.num_kv_heads = s.num_kv_heads;
  p.head_dim_qk = s.head_dim_qk;
  p.head_dim_vo = s.head_dim_vo;
  p.q = static_cast<const char*>(t.q.data());
  p.q_dtype = t.q.dtype();
  p.q_row_stride = t.q.stride(0);
  p.q_head_stride = t.q.stride(1);
  p.out = static_cast<char*>(t.out.data());
  p.o_dtype = t.out.dtype();
  p.o_row_stride = t.out.stride(0);
  p.o_head_stride = t.out.stride(1);
  if (t.lse.defined()) {
    p.lse = t.lse.data_as<float>();
    p.lse_row_stride = t.lse.stride(0);
    p.lse_head_stride = t.lse.stride(1);
  }
  p.kv_dtype = s.kv_dtype;
  p.variant = plan.variant;
  return p;
}

// Paged: one segment per page (the last one partly filled).
void add_paged_segments(const AttentionPlan& plan, const PagedKVCache& kv, cpu::EngineProblem& p) {
  p.k_token_stride = kv.k_token_stride();
  p.k_head_stride = kv.k_head_stride();
  p.v_token_stride = kv.v_token_stride();
  p.v_head_stride = kv.v_head_stride();
  const int64_t esz = int64_t(dtype_size(kv.k.dtype()));
  for (int64_t b = 0; b < plan.batch_size(); ++b) {
    cpu::EngineRequest r;
    r.q_row0 = plan.qo_indptr[b];
    r.qo_len = plan.qo_indptr[b + 1] - plan.qo_indptr[b];
    r.kv_len = plan.kv_len[size_t(b)];
    r.q_pos0 = r.kv_len - r.qo_len;
    r.seg_begin = int64_t(p.segments.size());
    const int64_t n_pages = plan.kv_indptr[b + 1] - plan.kv_indptr[b];
    for (int64_t j = 0; j < n_pages; ++j) {
      const int64_t page = plan.kv_indices[size_t(plan.kv_indptr[b] + j)];
      const int32_t n = j + 1 == n_pages ? plan.last_page_len[b] : plan.page_size;
      p.segments.push_back({static_cast<const char*>(kv.k.data()) + page * kv.k.stride(0) * esz,
                            static_cast<const char*>(kv.v.data()) + page * kv.v.stride(0) * esz, n,
                            j * plan.page_size, j * plan.page_size});
    }
    r.seg_end = int64_t(p.segments.size());
    p.requests.push_back(r);
  }
}

void set_kv_strides(const TensorView& k, const TensorView& v, cpu::EngineProblem& p) {
  p.k_token_stride = k.stride(0);
  p.k_head_stride = k.stride(1);
  p.v_token_stride = v.stride(0);
  p.v_head_stride = v.stride(1);
}

// Ragged: one segment per request.
void add_ragged_segments(const AttentionPlan& plan, const TensorView& k, const TensorView& v,
                         cpu::EngineProblem& p) {
  set_kv_strides(k, v, p);
  const int64_t esz = int64_t(dtype_size(k.dtype()));
  for (int64_t b = 0; b < plan.batch_size(); ++b) {
    cpu::EngineRequest r;
    r.q_row0 = plan.qo_indptr[b];
    r.qo_len = plan.qo_indptr[b + 1] - plan.qo_indptr[b];
    r.kv_len = plan.kv_len[size_t(b)];
    r.q_pos0 = r.kv_len - r.qo_len;
    r.seg_begin = int64_t(p.segments.size());
    if (r.kv_len > 0)
      p.segments.push_back({static_cast<const char*>(k.data()) + plan.kv_indptr[b] * k.stride(0) * esz,
                            static_cast<const char*>(v.data()) + plan.kv_indptr[b] * v.stride(0) * esz,
                            int32_t(r.kv_len), 0, 0});
    r.seg_end = int64_t(p.segments.size());
    p.requests.push_back(r);
  }
}

// Block-sparse: block row r is a request of R queries at positions r R + N - M, one segment per
// column block, each at its absolute position.
void add_block_sparse_segments(const AttentionPlan& plan, const TensorView& k, const TensorView& v,
                               cpu::EngineProblem& p) {
  set_kv_strides(k, v, p);
  const int64_t esz = int64_t(dtype_size(k.dtype()));
  for (int64_t br = 0; br < plan.batch_size(); ++br) {
    cpu::EngineRequest r;
    r.q_row0 = br * plan.bsr_R;
    r.qo_len = plan.bsr_R;
    r.kv_len = plan.kv_len[size_t(br)];
    r.q_pos0 = r.q_row0 + plan.bsr_N - plan.bsr_M;
    r.seg_begin = int64_t(p.segments.size());
    for (int32_t j = plan.kv_indptr[br]; j < plan.kv_indptr[br + 1]; ++j) {
      const int64_t col0 = int64_t(plan.kv_indices[size_t(j)]) * plan.bsr_C;
      p.segments.push_back({static_cast<const char*>(k.data()) + col0 * k.stride(0) * esz,
                            static_cast<const char*>(v.data()) + col0 * v.stride(0) * esz,
                            int32_t(plan.bsr_C), (j - plan.kv_indptr[br]) * plan.bsr_C, col0});
    }
    r.seg_end = int64_t(p.segments.size());
    p.requests.push_back(r);
  }
}

}  // namespace

// Query tiles of the engine's kQueryTile rows; KV chunks of whole pages (paged) or whole column
// blocks (BSR), at least 64 tokens; causal masks and sliding windows shrink the work of paged and
// ragged KV (BSR's KV indices are not positions, so its work is not shrunk; the engine still
// applies every mask); workers: the CPU threads unless given.
Plan cpu_schedule(const AttentionPlan& plan, const SchedulerOptions& scheduler) {
  std::vector<int32_t> kv_len(plan.kv_len.size());
  for (size_t b = 0; b < kv_len.size(); ++b) {
    KVATTN_CHECK(plan.kv_len[b] <= std::numeric_limits<int32_t>::max(), "request ", b, " has ",
                 plan.kv_len[b], " KV tokens, more than the planner's int32 limit");
    kv_len[b] = int32_t(plan.kv_len[b]);
  }
  const auto& s = plan.shape;
  PlannerInputs in;
  in.qo_indptr = plan.qo_indptr;
  in.kv_len = kv_len;
  in.num_qo_heads = s.num_qo_heads;
  in.num_kv_heads = s.num_kv_heads;
  in.head_dim_qk = s.head_dim_qk;
  in.head_dim_vo = s.head_dim_vo;
  const int64_t granule = plan.kind == KVKind::paged          ? plan.page_size
                          : plan.kind == KVKind::block_sparse ? plan.bsr_C
                                                              : 1;
  in.tile.query_tokens = int(cpu::kQueryTile);
  in.tile.kv_tokens = int(std::min<int64_t>(granule * ((64 + granule - 1) / granule),
                                            std::numeric_limits<int32_t>::max()));
  if (plan.kind != KVKind::block_sparse) {
    in.causal = s.variant.causal;
    in.window_left = s.variant.window_left;
  }
  SchedulerOptions opt = scheduler;
  if (opt.num_workers == 0) opt.num_workers = cpu::ThreadPool::global().num_threads();
  opt.slice_zero_only = false;  // the executor runs every worker's list
  return make_plan(in, opt);
}

void plan_on_cpu(AttentionPlan& plan, const SchedulerOptions& scheduler) {
  if (plan.shape.variant.custom) plan.cpu_user_kernels = &cpu::user_variant_kernels(*plan.shape.variant.custom);
  plan.cpu_work = cpu_schedule(plan, scheduler);
}

void run_on_cpu(const AttentionPlan& plan, const RunTensors& t, const TensorView& workspace) {
  cpu::EngineProblem p = begin_problem(plan, t);
  p.user_kernels = static_cast<const cpu::VariantKernels*>(plan.cpu_user_kernels);
  // A user variant without softmax has no LSE, as sigmoid attention (whose check is api/'s: only
  // the compiled variant knows its use_softmax). Before anything is written.
  KVATTN_CHECK(!t.lse.defined() || !p.user_kernels || p.user_kernels->use_softmax(plan.variant),
               "lse was requested but the user variant ", plan.shape.variant.custom->name,
               " has use_softmax = false (no lse)");
  switch (plan.kind) {
    case KVKind::paged: add_paged_segments(plan, *t.paged, p); break;
    case KVKind::ragged: add_ragged_segments(plan, t.k, t.v, p); break;
    case KVKind::block_sparse: add_block_sparse_segments(plan, t.k, t.v, p); break;
  }
  KVATTN_CHECK(plan.cpu_work.has_value(), plan.api, " was planned for the GPU; its run() computes there");
  const Plan& work = *plan.cpu_work;
  std::span<float> scratch;
  const int64_t need = cpu::plan_scratch_floats(work, p.head_dim_vo);
  const bool host_buffer = workspace.defined() && workspace.device().is_cpu() &&
                           workspace.is_contiguous() && workspace.data() != nullptr &&
                           reinterpret_cast<uintptr_t>(workspace.data()) % alignof(float) == 0;
  if (need > 0 && host_buffer) {
    const int64_t floats = workspace.numel() * int64_t(dtype_size(workspace.dtype())) / 4;
    if (floats >= need) scratch = {static_cast<float*>(workspace.data()), size_t(floats)};
  }
  cpu::run_plan(p, work, scratch);
}

}  // namespace kvattn::detail
