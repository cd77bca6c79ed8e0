// plan() and run() of the batch attention wrappers: validation, then the backend
// (core/attention_backend.h): the CPU engine, or the CUDA runners of a plan made for a GPU workspace.
#include "kvattn/attention.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "core/attention_backend.h"
#include "core/attention_plan.h"
#include "core/custom_params.h"
#include "core/overrides.h"
#include "core/shared_prefix.h"
#include "core/validate.h"
#include "kvattn/cascade.h"

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
  // The smallest and largest id (the run checks the largest against the cache).
  const validate::IdRange range = validate::page_id_range(info.indices);
  plan.max_page_pos = range.max_pos;
  plan.max_page_index = range.max;
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

void check_rows_tensor(const char* name, const TensorView& t, DType dtype, const char* planned,
                       int64_t rows, const char* rows_what, int heads, const char* heads_what,
                       int dim, const char* dim_what) {
  validate::ndim(name, t, 3);
  KVATTN_CHECK(t.dtype() == dtype, name, " has dtype ", dtype_name(t.dtype()), " but the plan was made for ",
               planned, " = ", dtype_name(dtype));
  validate::dim(name, t, 0, rows, rows_what);
  validate::dim(name, t, 1, heads, heads_what);
  validate::dim(name, t, 2, dim, dim_what);
  validate::last_dim_contiguous(name, t);
  KVATTN_CHECK(t.numel() == 0 || t.data() != nullptr, name, " has a null data pointer");
}

// A plan computes where it was made for: on the host, or on the CUDA device of its workspace. A q
// anywhere else is the argument to blame.
void check_run_device(const AttentionPlan& plan, const TensorView& q) {
  validate::defined("q", q);
  if (!plan.gpu) {
    KVATTN_CHECK(q.device().is_cpu(), "q is on ", q.device().str(), " but ", plan.api,
                 " was planned for the CPU (no CUDA workspace); pass host (cpu) tensors or give the "
                 "wrapper a CUDA workspace");
    return;
  }
  KVATTN_CHECK(q.device() == plan.workspace.device(), "q is on ", q.device().str(), " but ", plan.api,
               " was planned with a workspace on ", plan.workspace.device().str(),
               "; a plan runs where it was made for");
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
                    "num_qo_heads", s.head_dim_qk, "head_dim_qk");
  check_rows_tensor("out", out, s.o_dtype, "o_dtype", rows, rows_what, s.num_qo_heads,
                    "num_qo_heads", s.head_dim_vo, "head_dim_vo");
  if (lse.defined()) {
    KVATTN_CHECK(!s.variant.sigmoid, "lse was requested but sigmoid attention has no lse");
    validate::ndim("lse", lse, 2);
    validate::dtype("lse", lse, DType::f32);
    validate::dim("lse", lse, 0, rows, rows_what);
    validate::dim("lse", lse, 1, s.num_qo_heads, "num_qo_heads");
    KVATTN_CHECK(lse.numel() == 0 || lse.data() != nullptr, "lse has a null data pointer");
  }
}

void check_paged_cache(const AttentionPlan& plan, const PagedKVCache& kv, KVLayout layout) {
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

// qo_indptr for a batch whose size the KV side set (`kv_what` names the array that did); every
// request must have qo_len <= kv_len (its queries sit at the last qo_len positions).
void plan_qo_indptr(AttentionPlan& plan, const TensorView& qo_indptr, std::string_view kv_what) {
  const int64_t batch = int64_t(plan.kv_len.size());
  validate::ndim("qo_indptr", qo_indptr, 1);
  KVATTN_CHECK(qo_indptr.size(0) == batch + 1, "qo_indptr has ", qo_indptr.size(0), " elements",
               qo_indptr.size(0) >= 1 ? " (batch_size " + std::to_string(qo_indptr.size(0) - 1) + ")" : std::string(),
               " but ", kv_what, " describes batch_size ", batch, "; both need batch_size + 1 elements");
  auto ind = validate::indptr("qo_indptr", qo_indptr, batch + 1);
  KVATTN_CHECK(ind.back() <= kMaxTotalTokens, "qo_indptr[", batch, "] = ", ind.back(),
               " query tokens exceed the limit of ", kMaxTotalTokens, " (kvattn/plan.h)");
  // qo_len > kv_len is allowed (FlashInfer takes it): queries sit at kv_len - qo_len + i, so under a
  // causal mask the first qo_len - kv_len rows see no key (o = 0, lse = -inf).
  plan.qo_indptr.assign(ind.begin(), ind.end());
}

// Each request's KV length within kMaxKVLen (positions and tile ends stay in int32).
void check_kv_lengths(const AttentionPlan& plan) {
  for (size_t b = 0; b < plan.kv_len.size(); ++b)
    KVATTN_CHECK(plan.kv_len[b] <= kMaxKVLen, "request ", b, " has kv_len = ", plan.kv_len[b],
                 ", more than the limit of ", kMaxKVLen, " tokens (kvattn/plan.h)");
}

// Ragged and block-sparse k [rows, Hkv, Dqk] and v [rows, Hkv, Dvo].
void check_kv_rows(const AttentionPlan& plan, const TensorView& k, const TensorView& v) {
  const auto& s = plan.shape;
  const bool bsr = plan.kind == KVKind::block_sparse;
  const int64_t rows = bsr ? plan.bsr_N : plan.kv_indptr.back();
  const char* rows_what = bsr ? "bsr N" : "kv_indptr[-1]";
  check_rows_tensor("k", k, s.kv_dtype, "kv_dtype", rows, rows_what, s.num_kv_heads, "num_kv_heads",
                    s.head_dim_qk, "head_dim_qk");
  check_rows_tensor("v", v, s.kv_dtype, "kv_dtype", rows, rows_what, s.num_kv_heads, "num_kv_heads",
                    s.head_dim_vo, "head_dim_vo");
}

// Every run(): the shapes and dtypes of q, out, lse and the KV tensors, then the devices and the
// aliasing rules, then the backend the plan was made for.
void check_and_run(const AttentionPlan& plan, const detail::RunTensors& t, KVLayout layout,
                   const TensorView& workspace, void* stream) {
  check_query_output(plan, t.q, t.out, t.lse);
  if (t.paged)
    check_paged_cache(plan, *t.paged, layout);
  else
    check_kv_rows(plan, t.k, t.v);
  check_run_aliasing(plan, t.q, t.paged ? t.paged->k : t.k, t.paged ? t.paged->v : t.v, t.out, t.lse);
  if (plan.gpu)
    plan.gpu->run(plan, t, stream);
  else
    detail::run_on_cpu(plan, t, workspace);
}

bool is_gpu_workspace(const TensorView& workspace) {
  return workspace.defined() && !workspace.device().is_cpu();
}

// A user variant's parameter values, checked and packed where the plan computes.
void plan_custom_params(AttentionPlan& plan) {
  const Variant& v = plan.shape.variant;
  if (!v.custom) return;
  const Device where = is_gpu_workspace(plan.workspace) ? plan.workspace.device() : Device::cpu();
  plan.custom_params = detail::pack_custom_params(*v.custom, v.custom_values, where);
  plan.variant.user_params = plan.custom_params.data();
}

// The backend half of a validated plan: the GPU's for a CUDA workspace, else the CPU's schedule.
void plan_backend(AttentionPlan& plan, const AttentionPlan* previous, detail::GpuKernels kernels,
                  std::span<const int32_t> host_kv_indices, const SchedulerOptions& scheduler, void* stream) {
  plan.scheduler = scheduler;
  if (is_gpu_workspace(plan.workspace))
    plan.gpu = detail::plan_on_gpu(plan, previous ? previous->gpu.get() : nullptr, kernels, host_kv_indices,
                                   plan.workspace, scheduler, stream);
  else
    detail::plan_on_cpu(plan, scheduler);
}

const Plan* schedule_of(const std::unique_ptr<AttentionPlan>& plan) {
  if (!plan) return nullptr;
  if (plan->gpu) return &plan->gpu->schedule();
  return plan->cpu_work ? &*plan->cpu_work : nullptr;
}

void check_errors_of(const std::unique_ptr<AttentionPlan>& plan, const char* who, void* stream) {
  check_plan(plan, who, "check_errors");
  if (plan->gpu) plan->gpu->check_errors(stream);
}

// ---- shared prefixes in a decode batch (SharedPrefix) -------------------------------------------
// The cascade BatchDecode runs instead of flat decode: per shared level one group per run of
// requests sharing pages there (plus one group without pages per stretch of requests that share
// none), then each request's remaining pages.
struct SharedPrefixCascade {
  struct Level {
    std::vector<int32_t> qo{0}, indptr{0}, indices, last;
  };
  std::vector<Level> levels;

  CascadePlan plan(const BatchDecodePlan& params) const {
    auto host = [](const std::vector<int32_t>& v) { return TensorView(v.data(), DType::i32, {int64_t(v.size())}); };
    CascadePlan cp;
    static_cast<AttentionShape&>(cp) = params;
    cp.page_size = params.page_size;
    for (const Level& l : levels)
      cp.levels.push_back({host(l.qo), {host(l.indptr), host(l.indices), host(l.last)}});
    return cp;
  }
};

std::optional<SharedPrefixCascade> shared_prefix_cascade(const AttentionPlan& plan, const BatchDecodePlan& params,
                                                         const validate::PageTableInfo& table) {
  if (params.shared_prefix == SharedPrefix::never || table.device_indices || params.scheduler.cuda_graph ||
      detail::cascade_unsupported_feature(plan.shape.variant) != nullptr || table.batch_size < 2)
    return std::nullopt;
  const int P = params.page_size;
  auto shared_levels = detail::find_shared_prefix_levels(table.indptr, table.indices, (128 + P - 1) / P);
  if (shared_levels[0].empty()) return std::nullopt;
  if (params.shared_prefix == SharedPrefix::automatic) {
    const auto& s = plan.shape;
    detail::CascadeCostInputs in;
    in.kv_len = plan.kv_len;
    in.page_size = P;
    in.num_qo_heads = s.num_qo_heads;
    in.head_dim_qk = s.head_dim_qk;
    in.bytes_per_token = int64_t(s.num_kv_heads) * (s.head_dim_qk + s.head_dim_vo) * int64_t(dtype_size(s.kv_dtype));
    const auto two = detail::cascade_cost(in, std::span(shared_levels).first(1));
    if (shared_levels.size() > 1 && detail::cascade_cost(in, shared_levels).cascade_us >= two.cascade_us)
      shared_levels.resize(1);  // the nested level does not pay for its launch
    if (!detail::cascade_cost(in, shared_levels).cascade_wins()) return std::nullopt;
  }
  SharedPrefixCascade cascade;
  const int64_t B = table.batch_size;
  std::vector<int32_t> shared(size_t(B), 0);  // pages of request b in the shared levels so far
  for (const auto& groups : shared_levels) {
    SharedPrefixCascade::Level& L = cascade.levels.emplace_back();
    size_t gi = 0;
    for (int64_t b = 0; b < B;) {
      if (gi < groups.size() && groups[gi].first == b) {
        const auto& g = groups[gi++];
        const int32_t* ids = table.indices.data() + table.indptr[size_t(b)] + g.skip_pages;
        L.indices.insert(L.indices.end(), ids, ids + g.shared_pages);
        L.last.push_back(P);
        L.qo.push_back(L.qo.back() + g.count);
        for (int64_t m = b; m < b + g.count; ++m) shared[size_t(m)] += g.shared_pages;
        b += g.count;
      } else {  // the requests up to the next run take nothing from this level
        const int64_t end = gi < groups.size() ? groups[gi].first : B;
        L.last.push_back(0);
        L.qo.push_back(L.qo.back() + int32_t(end - b));
        b = end;
      }
      L.indptr.push_back(int32_t(L.indices.size()));
    }
  }
  SharedPrefixCascade::Level& own = cascade.levels.emplace_back();
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* ids = table.indices.data() + table.indptr[size_t(b)] + shared[size_t(b)];
    const int32_t* end = table.indices.data() + table.indptr[size_t(b) + 1];
    own.indices.insert(own.indices.end(), ids, end);
    own.indptr.push_back(int32_t(own.indices.size()));
    own.last.push_back(table.last_page_len[size_t(b)]);
    own.qo.push_back(int32_t(b + 1));
  }
  return cascade;
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
  plan->variant = detail::make_variant_params(plan->shape);
  plan_custom_params(*plan);
  const bool gpu = workspace_.defined() && !workspace_.device().is_cpu();
  const auto table = plan_page_table(*plan, params.page_table, params.page_size, gpu);
  check_kv_lengths(*plan);
  KVATTN_CHECK(int64_t(plan->kv_len.size()) <= kMaxTotalTokens, "the batch has ", plan->kv_len.size(),
               " requests, more than the limit of ", kMaxTotalTokens, " query tokens (kvattn/plan.h)");
  plan->qo_indptr.resize(plan->kv_len.size() + 1);
  std::iota(plan->qo_indptr.begin(), plan->qo_indptr.end(), 0);
  plan_custom_mask(*plan, params.custom_mask, params.mask_indptr);
  detail::check_graph_replan(plan_.get(), *plan, params.scheduler, "BatchDecode");
  if (const auto shared = shared_prefix_cascade(*plan, params, table)) {
    if (!cascade_) cascade_ = std::make_unique<CascadeAttention>(workspace_, kv_layout_);
    cascade_->plan(shared->plan(params), stream);
    plan_ = std::move(plan);
    cascade_active_ = true;
    return;
  }
  using detail::GpuKernels;
  GpuKernels kernels = GpuKernels::decode;
  if (gpu) {
    plan->scheduler = params.scheduler;
    check_table_device(table, workspace_);
    // The decode kernels have no custom mask; the prefill kernels' decode shape reads it.
    kernels = plan->shape.variant.custom_mask ? GpuKernels::prefill : detail::decode_kernels_for(*plan, workspace_);
    // Only a switch between two graph-mode plans can break a captured run(); an eager plan before
    // (sm_90's long batches run on the prefill kernels) captured nothing.
    const bool on_prefill = kernels == GpuKernels::prefill;
    KVATTN_CHECK(!params.scheduler.cuda_graph || !plan_ || !plan_->scheduler.cuda_graph || !plan_->gpu ||
                     plan_->gpu->kernels() == kernels,
                 "BatchDecode in CUDA-graph mode cannot move from the ", on_prefill ? "decode" : "prefill",
                 " kernels to the ", on_prefill ? "prefill" : "decode",
                 " kernels between plans (a captured run() replays the kernels it captured); "
                 "KVATTN_DECODE_KERNEL changed");
    // The prefill runner stages the host page ids from the plan (the decode runner from the table).
    if (on_prefill) plan->kv_indices.assign(table.indices.begin(), table.indices.end());
  }
  plan_backend(*plan, plan_.get(), kernels, kernels == GpuKernels::prefill ? plan->kv_indices : table.indices,
               params.scheduler, stream);
  plan_ = std::move(plan);  // only a fully valid plan replaces the previous one
  cascade_active_ = false;
}

void BatchDecode::run(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
                      const TensorView& lse, void* stream) const {
  check_plan(plan_, "BatchDecode");
  if (cascade_active_) return cascade_->run(q, kv, out, lse, stream);
  check_and_run(*plan_, {.q = q, .out = out, .lse = lse, .paged = &kv}, kv_layout_, workspace_, stream);
}

const CascadeAttention* BatchDecode::cascade() const { return cascade_active_ ? cascade_.get() : nullptr; }

std::string_view BatchDecode::kernel_family() const {
  if (!plan_) return {};
  if (cascade_active_) return "cascade";
  if (!plan_->gpu) return "cpu";
  return plan_->gpu->kernels() == detail::GpuKernels::prefill ? "prefill" : "decode";
}

namespace {
std::string kernel_name_of(const std::unique_ptr<detail::AttentionPlan>& plan) {
  if (!plan) return {};
  return plan->gpu ? plan->gpu->kernel_name() : "cpu";
}
}  // namespace

std::string BatchDecode::kernel_name() const {
  if (cascade_active_ && plan_) return "cascade";
  return kernel_name_of(plan_);
}

void BatchDecode::check_errors(void* stream) const {
  if (cascade_active_ && plan_) return cascade_->check_errors(stream);
  check_errors_of(plan_, "BatchDecode", stream);
}

const Plan* BatchDecode::schedule() const {
  if (cascade_active_ && plan_) return cascade_->schedule(cascade_->num_levels() - 1);
  return schedule_of(plan_);
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
  plan_custom_params(*plan);
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
  plan_backend(*plan, plan_.get(), detail::GpuKernels::prefill, plan->kv_indices, params.scheduler, stream);
  plan_ = std::move(plan);  // only a fully valid plan replaces the previous one
}

void BatchPrefill::run(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
                       const TensorView& lse, void* stream) const {
  check_plan(plan_, "BatchPrefill");
  check_and_run(*plan_, {.q = q, .out = out, .lse = lse, .paged = &kv}, kv_layout_, workspace_, stream);
}

void BatchPrefill::run(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const TensorView& lse, void* stream) const {
  check_plan(plan_, "BatchPrefill");
  KVATTN_CHECK(plan_->kind == KVKind::ragged,
               "run() was given ragged k and v but the plan was made for a paged KV cache");
  check_and_run(*plan_, {.q = q, .out = out, .lse = lse, .k = k, .v = v}, kv_layout_, workspace_, stream);
}

void BatchPrefill::check_errors(void* stream) const { check_errors_of(plan_, "BatchPrefill", stream); }

const Plan* BatchPrefill::schedule() const { return schedule_of(plan_); }

std::string BatchPrefill::kernel_name() const { return kernel_name_of(plan_); }

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
  plan->variant.one_sequence = 1;  // block rows are parts of one sequence (a user variant's batch 0)
  plan_custom_params(*plan);
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
  plan_backend(*plan, plan_.get(), detail::GpuKernels::prefill, plan->kv_indices, params.scheduler, stream);
  plan_ = std::move(plan);  // only a fully valid plan replaces the previous one
}

void BlockSparseAttention::run(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse, void* stream) const {
  check_plan(plan_, "BlockSparseAttention");
  check_and_run(*plan_, {.q = q, .out = out, .lse = lse, .k = k, .v = v}, KVLayout::NHD, workspace_, stream);
}

const Plan* BlockSparseAttention::schedule() const { return schedule_of(plan_); }

}  // namespace kvattn
