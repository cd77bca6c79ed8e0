// plan() and run() of the batch attention wrappers: validation, then lowering to the backend.
#include "kvattn/attention.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "core/attention_plan.h"
#include "core/overrides.h"
#include "core/block_sparse_gpu.h"
#include "core/prefill_gpu.h"
#include "core/validate.h"
#include "cpu/attention_engine.h"
#include "cpu/plan_executor.h"
#include "cpu/thread_pool.h"

#if KVATTN_WITH_CUDA
#include "cuda/runtime.h"
#endif

namespace kvattn {

using detail::AttentionPlan;
using detail::KVKind;

namespace {

// Copies a validated custom mask and checks each request's bytes are there.
void plan_custom_mask(AttentionPlan& plan, const TensorView& mask, const TensorView& mask_indptr) {
  if (!plan.shape.variant.custom_mask) {
    KVATTN_CHECK(!mask.defined(), "custom_mask was given but the variant has custom_mask off");
    return;
  }
  KVATTN_CHECK(mask.defined(), "the variant has custom_mask on but no custom_mask was given");
  auto ind = validate::indptr("mask_indptr", mask_indptr, plan.batch_size() + 1);
  validate::ndim("custom_mask", mask, 1);
  validate::dtype("custom_mask", mask, DType::u8);
  validate::host("custom_mask", mask);
  KVATTN_CHECK(mask.size(0) <= 1 || mask.stride(0) == 1, "custom_mask must be contiguous");
  KVATTN_CHECK(mask.size(0) == 0 || mask.data() != nullptr, "custom_mask has a null data pointer");
  KVATTN_CHECK(mask.size(0) >= ind.back(), "mask_indptr[", ind.size() - 1, "] = ", ind.back(),
               " exceeds the length of custom_mask (", mask.size(0), ")");
  for (int64_t b = 0; b < plan.batch_size(); ++b) {
    int64_t bits = int64_t(plan.qo_indptr[b + 1] - plan.qo_indptr[b]) * plan.kv_len[size_t(b)];
    int64_t have = ind[b + 1] - ind[b];
    KVATTN_CHECK(have >= (bits + 7) / 8, "custom_mask of request ", b, " has ", have,
                 " bytes (mask_indptr) but qo_len * kv_len = ", bits, " bits need ",
                 (bits + 7) / 8);
  }
  auto p = mask.data_as<const uint8_t>();
  plan.custom_mask.assign(p, p + mask.size(0));
  plan.mask_indptr.assign(ind.begin(), ind.end());
  plan.variant.custom_mask = plan.custom_mask.data();
  plan.variant.mask_indptr = plan.mask_indptr.data();
}

// Validates and records a page table. for_gpu: the ids may live on the workspace's device, and
// host ids are not copied into the plan (the GPU decode runner stages them from the table itself;
// the prefill paths copy them when they need them).
validate::PageTableInfo plan_page_table(AttentionPlan& plan, const PageTable& table, int page_size,
                                        bool for_gpu = false) {
  auto info = validate::page_table(table, page_size, -1, for_gpu);
  plan.page_size = page_size;
  plan.kv_indptr.assign(info.indptr.begin(), info.indptr.end());
  plan.last_page_len.assign(info.last_page_len.begin(), info.last_page_len.end());
  plan.kv_len.resize(size_t(info.batch_size));
  for (int64_t b = 0; b < info.batch_size; ++b)
    plan.kv_len[size_t(b)] = validate::paged_kv_len(info, page_size, b);
  plan.device_kv_indices = info.device_indices;
  info.indices = info.indices.first(plan.device_kv_indices ? 0 : size_t(info.indptr.back()));
  // One pass for the smallest and largest id (the run checks the largest against the cache).
  int32_t lo = 0, hi = -1;
  int64_t lo_pos = -1;
  plan.max_page_pos = -1;
  for (size_t i = 0; i < info.indices.size(); ++i) {
    const int32_t id = info.indices[i];
    if (id < lo) { lo = id; lo_pos = int64_t(i); }
    if (id > hi) { hi = id; plan.max_page_pos = int64_t(i); }
  }
  KVATTN_CHECK(lo_pos < 0, "kv_indices[", lo_pos, "] = ", lo, " is negative; page ids are in [0, num_pages)");
  plan.max_page_index = hi;
  if (!for_gpu) plan.kv_indices.assign(info.indices.begin(), info.indices.end());
  return info;
}

// A device-resident table must live where the kernels run.
void check_table_device(const validate::PageTableInfo& table, const TensorView& workspace) {
  KVATTN_CHECK(!table.device_indices || table.indices_device == workspace.device(), "kv_indices is on ",
               table.indices_device.str(), " but the workspace is on ", workspace.device().str());
}

// ---- run-time checks --------------------------------------------------------------------------
void check_plan(const std::unique_ptr<AttentionPlan>& plan, const char* who, const char* method = "run") {
  KVATTN_CHECK(plan != nullptr, who, ".", method, "() was called before plan()");
}

void check_backend(const TensorView& q) {
  KVATTN_CHECK(q.device().is_cpu(), "q is on ", q.device().str(),
               " but this build of kvattn has no CUDA backend; pass host (cpu) tensors");
}

void check_rows_tensor(const char* name, const TensorView& t, DType dtype, const char* planned,
                       int64_t rows, const char* rows_what, int heads, const char* heads_what,
                       int dim, const char* dim_what, Device dev) {
  validate::ndim(name, t, 3);
  KVATTN_CHECK(t.dtype() == dtype, name, " has dtype ", dtype_name(t.dtype()), " but the plan was made for ",
               planned, " = ", dtype_name(dtype));
  validate::dim(name, t, 0, rows, rows_what);
  validate::dim(name, t, 1, heads, heads_what);
  validate::dim(name, t, 2, dim, dim_what);
  validate::last_dim_contiguous(name, t);
  (void)dev;  // devices are checked after every shape (check_run_devices)
  KVATTN_CHECK(t.numel() == 0 || t.data() != nullptr, name, " has a null data pointer");
}

// q decides where run() computes: on the host (the CPU backend runs any plan), or on the CUDA
// device of a GPU plan's workspace. A q anywhere else is the argument to blame.
void check_run_device(const AttentionPlan& plan, const TensorView& q) {
  validate::defined("q", q);
  if (q.device().is_cpu()) return;
  const Device planned = plan.workspace.defined() ? plan.workspace.device() : Device::cpu();
  KVATTN_CHECK(q.device() == planned, "q is on ", q.device().str(), " but ", plan.api, " was planned ",
               planned.is_cpu() ? std::string("for the CPU (no CUDA workspace); pass host (cpu) tensors or "
                                              "give the wrapper a CUDA workspace")
                                : "with a workspace on " + planned.str());
}

// The aliasing rules of kvattn/attention.h: out and lse are free of self-overlap and share no
// memory with each other, with q, K, V or the workspace (no exact aliasing either: other work items
// still read q rows and K/V after an item writes its output).
// After every shape and dtype: where run() computes (check_run_device), every tensor there, then
// the aliasing rules.
void check_run_aliasing(const AttentionPlan& plan, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& out, const TensorView& lse) {
  check_run_device(plan, q);
  const char* k_device_name = plan.kind == KVKind::paged ? "paged k" : "k";
  const char* v_device_name = plan.kind == KVKind::paged ? "paged v" : "v";
  validate::same_device("out", out, q.device(), "q");
  if (lse.defined()) validate::same_device("lse", lse, q.device(), "q");
  validate::same_device(k_device_name, k, q.device(), "q");
  validate::same_device(v_device_name, v, q.device(), "q");
  validate::no_self_overlap("out", out);
  validate::no_self_overlap("lse", lse);
  const char* k_name = plan.kind == KVKind::paged ? "paged k" : "k";
  const char* v_name = plan.kind == KVKind::paged ? "paged v" : "v";
  for (const auto& [name, t] : {std::pair{"out", &out}, std::pair{"lse", &lse}}) {
    if (!t->defined()) continue;
    validate::no_overlap(name, *t, "q", q);
    validate::no_overlap(name, *t, k_name, k);
    validate::no_overlap(name, *t, v_name, v);
    if (plan.workspace.defined()) validate::no_overlap(name, *t, "the workspace", plan.workspace);
  }
  if (lse.defined()) validate::no_overlap("out", out, "lse", lse);
  if (plan.workspace.defined() && !plan.workspace.device().is_cpu()) {
    validate::no_overlap("the workspace", plan.workspace, "q", q);
    validate::no_overlap("the workspace", plan.workspace, k_name, k);
    validate::no_overlap("the workspace", plan.workspace, v_name, v);
  }
}

// Checks q, out and lse against the plan (any device).
void check_query_output(const AttentionPlan& plan, const TensorView& q, const TensorView& out,
                        const TensorView& lse) {
  validate::defined("q", q);
  const auto& s = plan.shape;
  int64_t rows = plan.total_q_rows();
  const char* rows_what = plan.is_decode                     ? "batch_size"
                          : plan.kind == KVKind::block_sparse ? "bsr M"
                                                              : "qo_indptr[-1]";
  check_rows_tensor("q", q, s.q_dtype, "q_dtype", rows, rows_what, s.num_qo_heads,
                    "num_qo_heads", s.head_dim_qk, "head_dim_qk", q.device());
  check_rows_tensor("out", out, s.o_dtype, "o_dtype", rows, rows_what, s.num_qo_heads,
                    "num_qo_heads", s.head_dim_vo, "head_dim_vo", q.device());
  if (lse.defined()) {
    KVATTN_CHECK(!s.variant.sigmoid, "lse was requested but sigmoid attention has no lse");
    validate::ndim("lse", lse, 2);
    validate::dtype("lse", lse, DType::f32);
    validate::dim("lse", lse, 0, rows, rows_what);
    validate::dim("lse", lse, 1, s.num_qo_heads, "num_qo_heads");
    KVATTN_CHECK(lse.numel() == 0 || lse.data() != nullptr, "lse has a null data pointer");
  }
}

// Checks q, out and lse against the plan and fills the query/output part of the CPU problem.
cpu::EngineProblem begin_problem(const AttentionPlan& plan, const TensorView& q,
                                 const TensorView& out, const TensorView& lse) {
  check_query_output(plan, q, out, lse);
  check_backend(q);
  const auto& s = plan.shape;
  cpu::EngineProblem p;
  p.num_qo_heads = s.num_qo_heads;
  p.num_kv_heads = s.num_kv_heads;
  p.head_dim_qk = s.head_dim_qk;
  p.head_dim_vo = s.head_dim_vo;
  p.q = static_cast<const char*>(q.data());
  p.q_dtype = q.dtype();
  p.q_row_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.out = static_cast<char*>(out.data());
  p.o_dtype = out.dtype();
  p.o_row_stride = out.stride(0);
  p.o_head_stride = out.stride(1);
  if (lse.defined()) {
    p.lse = lse.data_as<float>();
    p.lse_row_stride = lse.stride(0);
    p.lse_head_stride = lse.stride(1);
  }
  p.kv_dtype = s.kv_dtype;
  p.variant = plan.variant;
  return p;
}

void check_paged_cache(const AttentionPlan& plan, const PagedKVCache& kv, KVLayout layout,
                       Device dev) {
  KVATTN_CHECK(plan.kind == KVKind::paged,
               "run() was given a paged KV cache but the plan was made for ragged k and v");
  const auto& s = plan.shape;
  validate::ndim("paged k", kv.k, 4);
  validate::ndim("paged v", kv.v, 4);
  KVATTN_CHECK(kv.layout == layout, "the paged KV cache has layout ", kv_layout_name(kv.layout),
               " but the wrapper was created for ", kv_layout_name(layout));
  for (const auto& [name, t] : {std::pair{"paged k", kv.k}, std::pair{"paged v", kv.v}}) {
    KVATTN_CHECK(t.dtype() == s.kv_dtype, name, " has dtype ", dtype_name(t.dtype()),
                 " but the plan was made for kv_dtype = ", dtype_name(s.kv_dtype));
    validate::last_dim_contiguous(name, t);
    (void)dev;  // devices are checked after every shape (check_run_devices)
    KVATTN_CHECK(t.numel() == 0 || t.data() != nullptr, name, " has a null data pointer");
  }
  int tok_dim = layout == KVLayout::NHD ? 1 : 2, head_dim = layout == KVLayout::NHD ? 2 : 1;
  validate::dim("paged k", kv.k, tok_dim, plan.page_size, "page_size");
  validate::dim("paged v", kv.v, tok_dim, plan.page_size, "page_size");
  validate::dim("paged k", kv.k, head_dim, s.num_kv_heads, "num_kv_heads");
  validate::dim("paged v", kv.v, head_dim, s.num_kv_heads, "num_kv_heads");
  validate::dim("paged k", kv.k, 3, s.head_dim_qk, "head_dim_qk");
  validate::dim("paged v", kv.v, 3, s.head_dim_vo, "head_dim_vo");
  validate::dim("paged v", kv.v, 0, kv.k.size(0), "paged k.shape[0] (num_pages)");
  KVATTN_CHECK(plan.max_page_index < kv.num_pages(), "kv_indices[", plan.max_page_pos, "] = ",
               plan.max_page_index, " is out of range [0, ", kv.num_pages(), ")");
}

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
    int64_t n_pages = plan.kv_indptr[b + 1] - plan.kv_indptr[b];
    for (int64_t j = 0; j < n_pages; ++j) {
      int64_t page = plan.kv_indices[size_t(plan.kv_indptr[b] + j)];
      int32_t n = j + 1 == n_pages ? plan.last_page_len[b] : plan.page_size;
      p.segments.push_back({static_cast<const char*>(kv.k.data()) + page * kv.k.stride(0) * esz,
                            static_cast<const char*>(kv.v.data()) + page * kv.v.stride(0) * esz, n,
                            j * plan.page_size, j * plan.page_size});
    }
    r.seg_end = int64_t(p.segments.size());
    p.requests.push_back(r);
  }
}

// qo_indptr for a batch whose size the KV side set (`kv_what` names the array that did); every
// request must have qo_len <= kv_len (its queries sit at the last qo_len positions).
void plan_qo_indptr(AttentionPlan& plan, const TensorView& qo_indptr, std::string_view kv_what) {
  const int64_t batch = int64_t(plan.kv_len.size());
  validate::ndim("qo_indptr", qo_indptr, 1);
  KVATTN_CHECK(qo_indptr.size(0) == batch + 1, "qo_indptr has ", qo_indptr.size(0), " elements (batch_size ",
               qo_indptr.size(0) - 1, ") but ", kv_what, " describes batch_size ", batch,
               "; both need batch_size + 1 elements");
  auto ind = validate::indptr("qo_indptr", qo_indptr, batch + 1);
  KVATTN_CHECK(ind.back() <= kMaxTotalTokens, "qo_indptr[", batch, "] = ", ind.back(),
               " query tokens exceed the limit of ", kMaxTotalTokens, " (kvattn/plan.h)");
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t qo = int64_t(ind[b + 1]) - ind[b];
    KVATTN_CHECK(qo <= plan.kv_len[size_t(b)], "request ", b, " has qo_len = ", qo, " > kv_len = ",
                 plan.kv_len[size_t(b)], " (qo_indptr[", b, "..", b + 1, "] = ", ind[b], "..", ind[b + 1],
                 "); a request's queries are its last qo_len positions, so qo_len <= kv_len");
  }
  plan.qo_indptr.assign(ind.begin(), ind.end());
}

// Each request's KV length within kMaxKVLen (positions and tile ends stay in int32).
void check_kv_lengths(const AttentionPlan& plan) {
  for (size_t b = 0; b < plan.kv_len.size(); ++b)
    KVATTN_CHECK(plan.kv_len[b] <= kMaxKVLen, "request ", b, " has kv_len = ", plan.kv_len[b],
                 ", more than the limit of ", kMaxKVLen, " tokens (kvattn/plan.h)");
}

// ---- CPU schedule -------------------------------------------------------------------------------
// The CPU backend's plan: query tiles of the engine's kQueryTile rows; KV chunks of whole pages
// (paged) or whole column blocks (BSR), at least 64 tokens; causal masks and sliding windows
// shrink the work of paged and ragged KV (BSR's KV indices are not positions, so its work is not
// shrunk; the engine still applies every mask); workers: the CPU threads unless given.
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

void plan_cpu(AttentionPlan& plan, const SchedulerOptions& scheduler) {
  plan.scheduler = scheduler;
  plan.cpu_work = cpu_schedule(plan, scheduler);
}

// Runs the plan's CPU schedule (made now if plan() scheduled for the GPU only). The partial
// states of split rows go to the workspace when it is a large enough host buffer, else to memory
// allocated here.
void run_cpu(const AttentionPlan& plan, const cpu::EngineProblem& p, const TensorView& workspace) {
  std::optional<Plan> local;
  const Plan& work =
      plan.cpu_work ? *plan.cpu_work : local.emplace(cpu_schedule(plan, plan.scheduler));
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

// ---- GPU decode -------------------------------------------------------------------------------
// BatchDecode's choice between the decode kernels and the prefill kernels
// (cuda::decode_uses_prefill_kernels documents the heuristic).
bool decode_on_prefill_kernels(const AttentionPlan& plan, const TensorView& workspace) {
#if KVATTN_WITH_CUDA
  validate::gpu_workspace(workspace);
  const auto& s = plan.shape;
  const int device = workspace.device().index;
  const cuda::DeviceLimits limits = cuda::decode_device_limits(device);  // throws without a CUDA device
  cuda::DecodeBatchShape batch;
  batch.kv_len = plan.kv_len;
  batch.num_kv_heads = s.num_kv_heads;
  batch.cuda_graph = plan.scheduler.cuda_graph.has_value();
  cuda::DecodeProblemKey key;
  key.q_dtype = s.q_dtype;
  key.kv_dtype = s.kv_dtype;
  key.o_dtype = s.o_dtype;
  key.head_dim_qk = s.head_dim_qk;
  key.head_dim_vo = s.head_dim_vo;
  key.group_size = s.num_qo_heads / s.num_kv_heads;
  key.page_size = plan.page_size;
  key.features = plan.variant.features;
  return cuda::decode_uses_prefill_kernels(key, limits, detail::active_overrides(), batch);
#else
  (void)plan; (void)workspace;
  return false;  // plan_decode_gpu says why there is no GPU path
#endif
}

void plan_decode_gpu(AttentionPlan& plan, const AttentionPlan* previous, const TensorView& workspace,
                     const validate::PageTableInfo& table, const SchedulerOptions& scheduler,
                     void* stream) {
#if KVATTN_WITH_CUDA
  validate::gpu_workspace(workspace);
  plan.gpu_decode = previous && previous->gpu_decode   ? previous->gpu_decode
                    : previous && previous->spare_decode ? previous->spare_decode
                                                         : std::make_shared<cuda::DecodeRunner>();
  if (previous) plan.spare_prefill = previous->gpu_prefill ? previous->gpu_prefill : previous->spare_prefill;
  std::vector<int32_t> kv_len(plan.kv_len.begin(), plan.kv_len.end());
  cuda::DecodeProblem pr;
  const auto& s = plan.shape;
  pr.num_qo_heads = s.num_qo_heads;
  pr.num_kv_heads = s.num_kv_heads;
  pr.head_dim_qk = s.head_dim_qk;
  pr.head_dim_vo = s.head_dim_vo;
  pr.page_size = plan.page_size;
  pr.q_dtype = s.q_dtype;
  pr.kv_dtype = s.kv_dtype;
  pr.o_dtype = s.o_dtype;
  pr.variant = plan.variant;
  pr.kv_indptr = plan.kv_indptr;
  pr.kv_indices = table.indices;
  pr.device_kv_indices = table.device_indices;
  pr.kv_len = kv_len;
  pr.scheduler = scheduler;
  plan.gpu_decode->plan(pr, workspace.data(), workspace.numel() * int64_t(dtype_size(workspace.dtype())),
                        workspace.device().index, static_cast<cudaStream_t>(stream));
#else
  (void)plan; (void)previous; (void)table; (void)scheduler; (void)stream;
  detail::throw_error("the workspace is on ", workspace.device().str(),
                      " but this build of kvattn has no CUDA backend");
#endif
}

void run_decode_gpu(const AttentionPlan& plan, const TensorView& q, const PagedKVCache& kv,
                    KVLayout layout, const TensorView& out, const TensorView& lse, void* stream) {
  check_query_output(plan, q, out, lse);
  check_paged_cache(plan, kv, layout, q.device());
  check_run_aliasing(plan, q, kv.k, kv.v, out, lse);
  // The kernels copy K/V rows with 16-byte asynchronous copies.
  const int64_t esz = int64_t(dtype_size(kv.k.dtype()));
  for (const auto& [name, t] : {std::pair{"paged k", kv.k}, std::pair{"paged v", kv.v}}) {
    const auto addr = reinterpret_cast<uintptr_t>(t.data());
    KVATTN_CHECK(addr % 16 == 0, name, " starts at an address that is not 16-byte aligned (", t.describe(),
                 "); the GPU decode kernels copy 16-byte pieces of each row");
    for (int d = 0; d < 3; ++d)
      KVATTN_CHECK((t.stride(d) * esz) % 16 == 0 || t.size(d) == 1, name, ".stride(", d, ") = ", t.stride(d),
                   " elements is not a multiple of 16 bytes (", t.describe(),
                   "); the GPU decode kernels copy 16-byte pieces of each row");
  }
#if KVATTN_WITH_CUDA
  if (plan.gpu_prefill) {  // decode on the prefill kernels: one query per request
    detail::run_prefill_gpu(plan, q, &kv, nullptr, nullptr, out, lse, stream, "BatchDecode");
    return;
  }
  KVATTN_CHECK(plan.gpu_decode != nullptr, "q is on ", q.device().str(),
               " but BatchDecode was planned for the CPU (give it a CUDA workspace)");
  cuda::DecodeTensors t{};
  t.q = q.data();
  t.q_stride_n = q.stride(0);
  t.q_stride_h = q.stride(1);
  t.o = out.data();
  t.o_stride_n = out.stride(0);
  t.o_stride_h = out.stride(1);
  if (lse.defined()) {
    t.lse = lse.data_as<float>();
    t.lse_stride_n = lse.stride(0);
    t.lse_stride_h = lse.stride(1);
  }
  t.k = kv.k.data();
  t.v = kv.v.data();
  t.num_pages = kv.num_pages();
  t.k_stride_page = kv.k.stride(0);
  t.k_stride_token = kv.k_token_stride();
  t.k_stride_head = kv.k_head_stride();
  t.v_stride_page = kv.v.stride(0);
  t.v_stride_token = kv.v_token_stride();
  t.v_stride_head = kv.v_head_stride();
  plan.gpu_decode->run(t, static_cast<cudaStream_t>(stream));
#else
  (void)stream;
  check_backend(q);
#endif
}
}  // namespace

// ---- BatchDecode --------------------------------------------------------------------------------
BatchDecode::BatchDecode(TensorView workspace, KVLayout kv_layout)
    : workspace_(workspace), kv_layout_(kv_layout) {}
BatchDecode::~BatchDecode() = default;
BatchDecode::BatchDecode(BatchDecode&&) noexcept = default;
BatchDecode& BatchDecode::operator=(BatchDecode&&) noexcept = default;

void BatchDecode::plan(const BatchDecodePlan& params, void* stream) {
  detail::EnvironmentOverridesScope overrides;  // the KVATTN_* overrides, parsed once per plan()
  auto plan = std::make_unique<AttentionPlan>();
  plan->kind = KVKind::paged;
  plan->is_decode = true;
  plan->api = "BatchDecode";
  plan->workspace = workspace_;
  plan->shape = detail::resolve_shape(params);
  KVATTN_CHECK(!params.variant.custom_mask,
               "custom_mask is not supported by BatchDecode; use BatchPrefill with a page table");
  plan->variant = detail::make_variant_params(plan->shape);
  const bool gpu = workspace_.defined() && !workspace_.device().is_cpu();
  const auto table = plan_page_table(*plan, params.page_table, params.page_size, gpu);
  check_kv_lengths(*plan);
  KVATTN_CHECK(int64_t(plan->kv_len.size()) <= kMaxTotalTokens, "the batch has ", plan->kv_len.size(),
               " requests, more than the limit of ", kMaxTotalTokens, " query tokens (kvattn/plan.h)");
  plan->qo_indptr.resize(plan->kv_len.size() + 1);
  std::iota(plan->qo_indptr.begin(), plan->qo_indptr.end(), 0);
  detail::check_graph_replan(plan_.get(), *plan, params.scheduler, "BatchDecode");
  if (gpu) {
    plan->scheduler = params.scheduler;
    check_table_device(table, workspace_);
    const bool on_prefill = decode_on_prefill_kernels(*plan, workspace_);
    // Only a switch between two graph-mode plans can break a captured run(); an eager plan before
    // (sm_90's long batches run on the prefill kernels) captured nothing.
#if KVATTN_WITH_CUDA  // (without the CUDA backend the plan has no GPU runners; plan_decode_gpu throws)
    KVATTN_CHECK(!params.scheduler.cuda_graph || !plan_ || !plan_->scheduler.cuda_graph ||
                     !(plan_->gpu_prefill || plan_->gpu_decode) || (plan_->gpu_prefill != nullptr) == on_prefill,
                 "BatchDecode in CUDA-graph mode cannot move from the ", on_prefill ? "decode" : "prefill",
                 " kernels to the ", on_prefill ? "prefill" : "decode",
                 " kernels between plans (a captured run() replays the kernels it captured); "
                 "KVATTN_DECODE_KERNEL changed");
#endif
    if (on_prefill) {
      plan->kv_indices.assign(table.indices.begin(), table.indices.end());
      detail::plan_prefill_gpu(*plan, plan_.get(), workspace_, params.scheduler, stream);
    } else {
      plan_decode_gpu(*plan, plan_.get(), workspace_, table, params.scheduler, stream);
    }
  } else {
    plan_cpu(*plan, params.scheduler);
  }
  plan_ = std::move(plan);  // only a fully valid plan replaces the previous one
}

void BatchDecode::run(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
                      const TensorView& lse, void* stream) const {
  check_plan(plan_, "BatchDecode");
  if (!q.device().is_cpu()) {
    run_decode_gpu(*plan_, q, kv, kv_layout_, out, lse, stream);
    return;
  }
  cpu::EngineProblem p = begin_problem(*plan_, q, out, lse);
  check_paged_cache(*plan_, kv, kv_layout_, q.device());
  check_run_aliasing(*plan_, q, kv.k, kv.v, out, lse);
  add_paged_segments(*plan_, kv, p);
  run_cpu(*plan_, p, workspace_);
}

std::string_view BatchDecode::kernel_family() const {
  if (!plan_) return {};
#if KVATTN_WITH_CUDA
  if (plan_->gpu_prefill) return "prefill";
  if (plan_->gpu_decode) return "decode";
#endif
  return "cpu";
}

void BatchDecode::check_errors(void* stream) const {
  check_plan(plan_, "BatchDecode", "check_errors");
#if KVATTN_WITH_CUDA
  if (plan_->gpu_decode) plan_->gpu_decode->check_errors(static_cast<cudaStream_t>(stream));
  if (plan_->gpu_prefill) plan_->gpu_prefill->check_errors(static_cast<cudaStream_t>(stream));
#else
  (void)stream;
#endif
}

const Plan* BatchDecode::schedule() const {
  if (!plan_) return nullptr;
#if KVATTN_WITH_CUDA
  if (plan_->gpu_decode) return &plan_->gpu_decode->schedule();
  if (plan_->gpu_prefill) return &plan_->gpu_prefill->schedule();
#endif
  return plan_->cpu_work ? &*plan_->cpu_work : nullptr;
}

// ---- BatchPrefill -------------------------------------------------------------------------------
BatchPrefill::BatchPrefill(TensorView workspace, KVLayout kv_layout)
    : workspace_(workspace), kv_layout_(kv_layout) {}
BatchPrefill::~BatchPrefill() = default;
BatchPrefill::BatchPrefill(BatchPrefill&&) noexcept = default;
BatchPrefill& BatchPrefill::operator=(BatchPrefill&&) noexcept = default;

void BatchPrefill::plan(const BatchPrefillPlan& params, void* stream) {
  detail::EnvironmentOverridesScope overrides;  // the KVATTN_* overrides, parsed once per plan()
  auto plan = std::make_unique<AttentionPlan>();
  plan->api = "BatchPrefill";
  plan->workspace = workspace_;
  plan->shape = detail::resolve_shape(params);
  plan->variant = detail::make_variant_params(plan->shape);
  if (params.page_table) {
    KVATTN_CHECK(!params.kv_indptr.defined(),
                 "give either kv_indptr (ragged KV) or page_table (paged KV), not both");
    plan->kind = KVKind::paged;
    const bool gpu = workspace_.defined() && !workspace_.device().is_cpu();
    const auto table = plan_page_table(*plan, *params.page_table, params.page_size, gpu);
    if (gpu) {
      check_table_device(table, workspace_);
      plan->kv_indices.assign(table.indices.begin(), table.indices.end());  // empty for device ids
    }
  } else {
    KVATTN_CHECK(params.kv_indptr.defined(),
                 "BatchPrefill needs kv_indptr (ragged KV) or page_table (paged KV)");
    plan->kind = KVKind::ragged;
    auto ind = validate::indptr("kv_indptr", params.kv_indptr);
    KVATTN_CHECK(ind.back() <= kMaxTotalTokens, "kv_indptr[", ind.size() - 1, "] = ", ind.back(),
                 " KV tokens exceed the limit of ", kMaxTotalTokens, " (kvattn/plan.h)");
    plan->kv_indptr.assign(ind.begin(), ind.end());
    for (size_t b = 0; b + 1 < ind.size(); ++b) plan->kv_len.push_back(ind[b + 1] - ind[b]);
  }
  check_kv_lengths(*plan);
  plan_qo_indptr(*plan, params.qo_indptr, params.page_table ? "kv_indptr (page table)" : "kv_indptr");
  plan_custom_mask(*plan, params.custom_mask, params.mask_indptr);
  detail::check_graph_replan(plan_.get(), *plan, params.scheduler, "BatchPrefill");
  if (workspace_.defined() && !workspace_.device().is_cpu()) {
    plan->scheduler = params.scheduler;
    detail::plan_prefill_gpu(*plan, plan_.get(), workspace_, params.scheduler, stream);
  } else {
    plan_cpu(*plan, params.scheduler);
  }
  plan_ = std::move(plan);  // only a fully valid plan replaces the previous one
}

void BatchPrefill::run(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
                       const TensorView& lse, void* stream) const {
  check_plan(plan_, "BatchPrefill");
  if (!q.device().is_cpu()) {
    check_query_output(*plan_, q, out, lse);
    check_paged_cache(*plan_, kv, kv_layout_, q.device());
    check_run_aliasing(*plan_, q, kv.k, kv.v, out, lse);
    detail::run_prefill_gpu(*plan_, q, &kv, nullptr, nullptr, out, lse, stream);
    return;
  }
  cpu::EngineProblem p = begin_problem(*plan_, q, out, lse);
  check_paged_cache(*plan_, kv, kv_layout_, q.device());
  check_run_aliasing(*plan_, q, kv.k, kv.v, out, lse);
  add_paged_segments(*plan_, kv, p);
  run_cpu(*plan_, p, workspace_);
}

void BatchPrefill::run(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const TensorView& lse, void* stream) const {
  check_plan(plan_, "BatchPrefill");
  const AttentionPlan& plan = *plan_;
  KVATTN_CHECK(plan.kind == KVKind::ragged,
               "run() was given ragged k and v but the plan was made for a paged KV cache");
  const auto& s = plan.shape;
  int64_t nnz = plan.kv_indptr.back();
  if (!q.device().is_cpu()) {
    check_query_output(plan, q, out, lse);
    check_rows_tensor("k", k, s.kv_dtype, "kv_dtype", nnz, "kv_indptr[-1]", s.num_kv_heads,
                      "num_kv_heads", s.head_dim_qk, "head_dim_qk", q.device());
    check_rows_tensor("v", v, s.kv_dtype, "kv_dtype", nnz, "kv_indptr[-1]", s.num_kv_heads,
                      "num_kv_heads", s.head_dim_vo, "head_dim_vo", q.device());
    check_run_aliasing(plan, q, k, v, out, lse);
    detail::run_prefill_gpu(plan, q, nullptr, &k, &v, out, lse, stream);
    return;
  }
  cpu::EngineProblem p = begin_problem(plan, q, out, lse);
  check_rows_tensor("k", k, s.kv_dtype, "kv_dtype", nnz, "kv_indptr[-1]", s.num_kv_heads,
                    "num_kv_heads", s.head_dim_qk, "head_dim_qk", q.device());
  check_rows_tensor("v", v, s.kv_dtype, "kv_dtype", nnz, "kv_indptr[-1]", s.num_kv_heads,
                    "num_kv_heads", s.head_dim_vo, "head_dim_vo", q.device());
  check_run_aliasing(plan, q, k, v, out, lse);
  p.k_token_stride = k.stride(0);
  p.k_head_stride = k.stride(1);
  p.v_token_stride = v.stride(0);
  p.v_head_stride = v.stride(1);
  const int64_t esz = int64_t(dtype_size(k.dtype()));
  for (int64_t b = 0; b < plan.batch_size(); ++b) {
    cpu::EngineRequest r;
    r.q_row0 = plan.qo_indptr[b];
    r.qo_len = plan.qo_indptr[b + 1] - plan.qo_indptr[b];
    r.kv_len = plan.kv_len[size_t(b)];
    r.q_pos0 = r.kv_len - r.qo_len;
    r.seg_begin = int64_t(p.segments.size());
    if (r.kv_len > 0)
      p.segments.push_back(
          {static_cast<const char*>(k.data()) + plan.kv_indptr[b] * k.stride(0) * esz,
           static_cast<const char*>(v.data()) + plan.kv_indptr[b] * v.stride(0) * esz,
           int32_t(r.kv_len), 0, 0});
    r.seg_end = int64_t(p.segments.size());
    p.requests.push_back(r);
  }
  run_cpu(plan, p, workspace_);
}

void BatchPrefill::check_errors(void* stream) const {
  check_plan(plan_, "BatchPrefill", "check_errors");
#if KVATTN_WITH_CUDA
  if (plan_->gpu_prefill) plan_->gpu_prefill->check_errors(static_cast<cudaStream_t>(stream));
#else
  (void)stream;
#endif
}

const Plan* BatchPrefill::schedule() const {
  if (!plan_) return nullptr;
#if KVATTN_WITH_CUDA
  if (plan_->gpu_prefill) return &plan_->gpu_prefill->schedule();
#endif
  return plan_->cpu_work ? &*plan_->cpu_work : nullptr;
}

// ---- BlockSparseAttention -----------------------------------------------------------------------
BlockSparseAttention::BlockSparseAttention(TensorView workspace) : workspace_(workspace) {}
BlockSparseAttention::~BlockSparseAttention() = default;
BlockSparseAttention::BlockSparseAttention(BlockSparseAttention&&) noexcept = default;
BlockSparseAttention& BlockSparseAttention::operator=(BlockSparseAttention&&) noexcept = default;

void BlockSparseAttention::plan(const BlockSparsePlan& params, void* stream) {
  detail::EnvironmentOverridesScope overrides;  // the KVATTN_* overrides, parsed once per plan()
  auto plan = std::make_unique<AttentionPlan>();
  plan->kind = KVKind::block_sparse;
  plan->api = "BlockSparseAttention";
  plan->workspace = workspace_;
  plan->shape = detail::resolve_shape(params);
  KVATTN_CHECK(!params.variant.custom_mask,
               "custom_mask is not supported by BlockSparseAttention; the BSR is the mask");
  plan->variant = detail::make_variant_params(plan->shape);
  const BSRMatrix& m = params.bsr;
  KVATTN_CHECK(m.R >= 1 && m.C >= 1, "bsr block size R x C = ", m.R, " x ", m.C,
               " must be at least 1 x 1");
  KVATTN_CHECK(m.M >= 0 && m.M <= kMaxTotalTokens, "bsr M = ", m.M, " is out of range [0, ", kMaxTotalTokens,
               "] (query rows, kvattn/plan.h)");
  KVATTN_CHECK(m.N >= 0 && m.N <= kMaxKVLen, "bsr N = ", m.N, " is out of range [0, ", kMaxKVLen,
               "] (KV rows, kvattn/plan.h)");
  KVATTN_CHECK(m.R <= kMaxTotalTokens, "bsr R = ", m.R, " is out of range [1, ", kMaxTotalTokens, "]");
  KVATTN_CHECK(m.C <= kMaxKVLen, "bsr C = ", m.C, " is out of range [1, ", kMaxKVLen, "]");
  KVATTN_CHECK(m.M % m.R == 0, "bsr M = ", m.M, " is not a multiple of R = ", m.R);
  KVATTN_CHECK(m.N % m.C == 0, "bsr N = ", m.N, " is not a multiple of C = ", m.C);
  int64_t row_blocks = m.M / m.R, col_blocks = m.N / m.C;
  auto ind = validate::indptr("bsr indptr", m.indptr, row_blocks + 1);
  auto idx = validate::int32_array("bsr indices", m.indices);
  KVATTN_CHECK(int64_t(idx.size()) >= ind.back(), "bsr indptr[", row_blocks, "] = ", ind.back(),
               " exceeds the length of bsr indices (", idx.size(), ")");
  validate::indices_in_range("bsr indices", idx.first(size_t(ind.back())), col_blocks);
  for (int64_t br = 0; br < row_blocks; ++br)
    KVATTN_CHECK(int64_t(ind[br + 1] - ind[br]) * m.C <= kMaxKVLen, "bsr block row ", br, " has ",
                 ind[br + 1] - ind[br], " column blocks of ", m.C, " keys, more than the limit of ",
                 kMaxKVLen, " keys (kvattn/plan.h)");
  // Repeats within a block row, found by sorting each row's (index, position) pairs: memory in
  // O(blocks of one row), whatever N / C is.
  std::vector<std::pair<int32_t, int32_t>> row;
  for (int64_t br = 0; br < row_blocks; ++br) {
    row.clear();
    for (int32_t j = ind[br]; j < ind[br + 1]; ++j) row.emplace_back(idx[j], j);
    std::sort(row.begin(), row.end());
    for (size_t i = 1; i < row.size(); ++i)
      KVATTN_CHECK(row[i].first != row[i - 1].first, "bsr indices[", row[i].second, "] = ", row[i].first,
                   " repeats a column block already listed for block row ", br, " (at bsr indices[",
                   row[i - 1].second, "])");
  }
  plan->bsr_M = m.M;
  plan->bsr_N = m.N;
  plan->bsr_R = m.R;
  plan->bsr_C = m.C;
  plan->kv_indptr.assign(ind.begin(), ind.end());
  plan->kv_indices.assign(idx.begin(), idx.begin() + ind.back());
  plan->qo_indptr.resize(size_t(row_blocks + 1));
  for (int64_t br = 0; br <= row_blocks; ++br) plan->qo_indptr[size_t(br)] = int32_t(br * m.R);
  for (int64_t br = 0; br < row_blocks; ++br)
    plan->kv_len.push_back(int64_t(ind[br + 1] - ind[br]) * m.C);
  detail::check_graph_replan(plan_.get(), *plan, params.scheduler, "BlockSparseAttention");
  if (workspace_.defined() && !workspace_.device().is_cpu()) {
    plan->scheduler = params.scheduler;
    detail::plan_block_sparse_gpu(*plan, plan_.get(), workspace_, params.scheduler, stream);
  } else {
    plan_cpu(*plan, params.scheduler);
  }
  plan_ = std::move(plan);  // only a fully valid plan replaces the previous one
}

void BlockSparseAttention::run(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse, void* stream) const {
  check_plan(plan_, "BlockSparseAttention");
  const AttentionPlan& plan = *plan_;
  const auto& s = plan.shape;
  auto check_kv = [&] {
    check_rows_tensor("k", k, s.kv_dtype, "kv_dtype", plan.bsr_N, "bsr N", s.num_kv_heads,
                      "num_kv_heads", s.head_dim_qk, "head_dim_qk", q.device());
    check_rows_tensor("v", v, s.kv_dtype, "kv_dtype", plan.bsr_N, "bsr N", s.num_kv_heads,
                      "num_kv_heads", s.head_dim_vo, "head_dim_vo", q.device());
  };
  if (!q.device().is_cpu()) {
    check_query_output(plan, q, out, lse);
    check_kv();
    check_run_aliasing(plan, q, k, v, out, lse);
    detail::run_block_sparse_gpu(plan, workspace_.device(), q, k, v, out, lse, stream);
    return;
  }
  cpu::EngineProblem p = begin_problem(plan, q, out, lse);
  check_kv();
  check_run_aliasing(plan, q, k, v, out, lse);
  p.k_token_stride = k.stride(0);
  p.k_head_stride = k.stride(1);
  p.v_token_stride = v.stride(0);
  p.v_head_stride = v.stride(1);
  const int64_t esz = int64_t(dtype_size(k.dtype()));
  for (int64_t br = 0; br < plan.batch_size(); ++br) {
    cpu::EngineRequest r;
    r.q_row0 = br * plan.bsr_R;
    r.qo_len = plan.bsr_R;
    r.kv_len = plan.kv_len[size_t(br)];
    r.q_pos0 = r.q_row0 + plan.bsr_N - plan.bsr_M;
    r.seg_begin = int64_t(p.segments.size());
    for (int32_t j = plan.kv_indptr[br]; j < plan.kv_indptr[br + 1]; ++j) {
      int64_t col0 = int64_t(plan.kv_indices[size_t(j)]) * plan.bsr_C;
      p.segments.push_back({static_cast<const char*>(k.data()) + col0 * k.stride(0) * esz,
                            static_cast<const char*>(v.data()) + col0 * v.stride(0) * esz,
                            int32_t(plan.bsr_C), (j - plan.kv_indptr[br]) * plan.bsr_C, col0});
    }
    r.seg_end = int64_t(p.segments.size());
    p.requests.push_back(r);
  }
  run_cpu(plan, p, workspace_);
}

const Plan* BlockSparseAttention::schedule() const {
  if (!plan_) return nullptr;
#if KVATTN_WITH_CUDA
  if (plan_->gpu_prefill) return &plan_->gpu_prefill->schedule();
#endif
  return plan_->cpu_work ? &*plan_->cpu_work : nullptr;
}

}  // namespace kvattn
