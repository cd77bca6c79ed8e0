#include "cuda/prefill_runner.h"

#include <algorithm>
#include <cstring>

#include "cuda/decode_kernels.h"
#include "cuda/runtime.h"
#include "cuda/workspace_fit.h"
#include "kvattn/error.h"

namespace kvattn::cuda {

using kernels::DeviceMergeEntry;
using kernels::DeviceWorkItem;

static_assert(sizeof(DeviceWorkItem) == sizeof(WorkItem) && sizeof(DeviceMergeEntry) == sizeof(MergeEntry),
              "device work items and merge entries mirror the planner's");

namespace {
constexpr int64_t kAlign = 256;
int64_t align_up(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Byte offsets of the plan's sections in the workspace: the partial states (sized by the
// capacity) first, then the metadata and index arrays (one copy), the variable-length page ids and
// custom mask last, so that a graph-mode re-plan moves nothing a captured launch points at.
struct WorkspaceLayout {
  int64_t partial_o = 0, partial_lse = 0;
  int64_t items = 0, merges = 0, qo_indptr = 0, kv_indptr = 0, last_page_len = 0, mask_indptr = 0;
  int64_t error = 0, user_params = 0, indices = 0, mask = 0, end = 0;
};
}  // namespace

void PrefillRunner::plan(const PrefillProblem& pr, void* workspace, int64_t workspace_bytes, int device,
                         cudaStream_t stream) {
  const detail::Overrides& ov = detail::active_overrides();
  PhaseTrace trace(ov.plan_trace);  // KVATTN_PLAN_TRACE=1 (plan_staging.h)
  require_cuda("BatchPrefill.plan on a CUDA workspace");
  DeviceGuard guard(device);
  const DeviceInfo& dev = device_info(device);
  const int group = pr.num_qo_heads / pr.num_kv_heads;
  const int64_t batch = int64_t(pr.kv_len.size());
  int64_t max_qo = 0;
  for (int64_t b = 0; b < batch; ++b)
    max_qo = std::max<int64_t>(max_qo, pr.qo_indptr[size_t(b + 1)] - pr.qo_indptr[size_t(b)]);
  // A captured run() replays the kernel (and query tile) of the plan it captured: in graph mode
  // the choice depends on the capacity only, never on the batch.
  if (pr.scheduler.cuda_graph && !pr.one_query_per_request)
    max_qo = std::max<int64_t>(max_qo, pr.scheduler.cuda_graph->max_tokens);
  // Decode of a batch without a dominant request takes the decode shape's uniform variant (not in
  // graph mode, whose captured kernel must serve every batch).
  const bool uniform_decode =
      pr.one_query_per_request && !pr.scheduler.cuda_graph && !decode_batch_is_skewed(pr.kv_len);
  PrefillProblemKey key;
  key.q_dtype = pr.q_dtype;
  key.kv_dtype = pr.kv_dtype;
  key.o_dtype = pr.o_dtype;
  key.head_dim_qk = pr.head_dim_qk;
  key.head_dim_vo = pr.head_dim_vo;
  key.group_size = group;
  key.paged = pr.paged;
  key.page_size = pr.page_size;
  key.features = pr.variant.features;
  key.max_qo_len = max_qo;
  key.uniform_decode = uniform_decode;
  key.soft_cap = pr.variant.soft_cap;
  if (pr.custom) key.user_variant = user_code_.code_of(*pr.custom);
  PrefillKernelConfig cfg = choose_prefill(key, limits_of(dev), ov);
  cfg.checked_ids = pr.paged && pr.device_kv_indices != nullptr;
  KVATTN_CHECK(!pr.scheduler.cuda_graph || !kernel_ || config_.checked_ids == cfg.checked_ids,
               "in CUDA-graph mode the page table cannot move between host and device between plans (a captured "
               "run() replays the kernel it captured, which ", config_.checked_ids ? "checks" : "does not check",
               " device page ids)");
  // A captured run() replays its kernel: whatever else chose it (an override read at
  // this plan) must not choose another between graph-mode plans (the wrappers check the rest).
  KVATTN_CHECK(!pr.scheduler.cuda_graph || !graph_mode_ || !kernel_ || cfg.name() == config_.name(),
               "in CUDA-graph mode the prefill kernel cannot change between plans (a captured run() replays ",
               config_.name(), "; this plan chose ", cfg.name(), ": a KVATTN_PREFILL_* setting changed)");
  // The kernels of the previous plan serve again when nothing that specialises them changed.
  cudaKernel_t kernel = kernel_, merge = merge_kernel_;
  bool has_lse = has_lse_;
  int per_sm = per_sm_;
  const int smem = prefill_smem_bytes(cfg);
  if (!kernel || device != device_ || cfg.name() != config_.name()) {
    KVATTN_CHECK(size_t(smem) <= dev.max_smem_per_block_optin, "prefill kernel ", cfg.name(), " needs ",
                 smem, " bytes of shared memory; ", dev.name, " allows ", dev.max_smem_per_block_optin);
    const KernelSpec spec = prefill_spec(cfg, dev.arch);
    kernel = KernelCache::global().kernel(spec);
    // A user variant's use_softmax, as its compiled code has it (no lse without a softmax).
    has_lse = !cfg.user_variant || KernelCache::global().device_int(spec, kUserSoftmaxSymbol) != 0;
    merge = KernelCache::global().kernel(prefill_merge_spec(cfg, dev.arch));
    check(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
          "raising the prefill kernel's shared-memory limit");
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, reinterpret_cast<const void*>(kernel),
                                                        cfg.threads(), smem),
          "querying the prefill kernel's occupancy");
  }
  const int head_chunks = group / cfg.heads_per_cta;
  SchedulerOptions opts = pr.scheduler;
  // Decode on the decode shape (outside graph mode) stages the plan's slice 0 only and the kernel
  // repeats it for the other KV heads (kernels/prefill/entry.cuh): the planner then schedules one
  // head's workers (1/8 at 32/8; its time halved at 64 x 4096 on 392 workers,
  // bench/plan_bench.cpp) and 1/8 of the items are staged. Workers a multiple of the KV heads give
  // one slice per head.
  const bool slice_zero = pr.one_query_per_request && !opts.cuda_graph && cfg.kv_warps > 1;
  if (opts.num_workers <= 0) {
    opts.num_workers = std::max(1, dev.sm_count * std::max(1, per_sm) / head_chunks);
    if (slice_zero && opts.num_workers >= pr.num_kv_heads) opts.num_workers -= opts.num_workers % pr.num_kv_heads;
  }
  opts.slice_zero_only = slice_zero;  // else the prefill kernels read every slice's items

  PlannerInputs in;
  in.qo_indptr = pr.qo_indptr;
  in.kv_len = pr.kv_len;
  in.num_qo_heads = pr.num_qo_heads;
  in.num_kv_heads = pr.num_kv_heads;
  in.head_dim_qk = pr.head_dim_qk;
  in.head_dim_vo = pr.head_dim_vo;
  // Decode on these kernels has one query per request: planning with one-token query tiles
  // gives the same items, and partial slots of `group` rows instead of the M tile's
  // query_tokens() x group (16x the workspace at group 4). The kernel indexes partial rows by
  // the plan's partial_rows, not by its tile.
  in.tile = TileShape{pr.one_query_per_request ? 1 : cfg.query_tokens(), cfg.kv_tile};
  in.causal = (pr.variant.features & kernels::kCausal) != 0;
  in.window_left = (pr.variant.features & kernels::kSlidingWindow) ? pr.variant.window_left : -1;
  trace.mark("kernels");

  // Lay out the workspace (cuda/workspace_fit.h: the unsplit plan when the split one does not fit).
  const int64_t batch_cap = opts.cuda_graph ? std::max<int64_t>(opts.cuda_graph->max_batch, batch) : batch;
  const bool has_mask = (pr.variant.features & kernels::kCustomMask) != 0;
  auto lay_out = [&](const Plan& plan) {
    const int64_t rows = plan.partial_slot_rows();
    const int64_t merge_cap = std::max<int64_t>(1, plan.merge_capacity());
    WorkspaceLayout L;
    L.partial_o = 0;
    L.partial_lse = align_up(plan.slot_capacity() * rows * pr.head_dim_vo * 4);
    L.items = align_up(L.partial_lse + plan.slot_capacity() * rows * 4);
    L.merges = L.items + plan.item_capacity() * int64_t(sizeof(WorkItem));
    L.qo_indptr = L.merges + merge_cap * int64_t(sizeof(MergeEntry));
    L.kv_indptr = L.qo_indptr + (batch_cap + 1) * 4;
    L.last_page_len = L.kv_indptr + (batch_cap + 1) * 4;
    L.mask_indptr = L.last_page_len + batch_cap * 4;
    L.error = L.mask_indptr + (batch_cap + 1) * 4;
    L.user_params = align_up(L.error + kPageErrorWords * 4);
    L.indices = L.user_params + int64_t(pr.custom_params.size_bytes());
    const int64_t staged_ids = pr.device_kv_indices ? 0 : int64_t(pr.kv_indices.size());
    L.mask = L.indices + staged_ids * 4;
    L.end = L.mask + (has_mask ? int64_t(pr.custom_mask.size()) : 0);
    return L;
  };
  const auto [planned, L] = plan_within_workspace(planners_[live_ ^ 1], in, opts, workspace_bytes, lay_out);
  trace.mark("planner");
  const Plan& plan = *planned;
  const int64_t rows = plan.partial_slot_rows();
  const int64_t merge_cap = std::max<int64_t>(1, plan.merge_capacity());

  // Stage everything in pinned memory, then one copy (cuda/plan_staging.h).
  const int64_t copy_bytes = L.end - L.items;
  char* host = staging_.acquire(copy_bytes) - L.items;  // host + offset mirrors the workspace
  trace.mark("wait+alloc");
  stage_items_round_robin(plan, slice_zero ? plan.slice_workers() : plan.num_workers(), plan.item_capacity(),
                          reinterpret_cast<WorkItem*>(host + L.items), active_);
  stage_merges(plan, reinterpret_cast<MergeEntry*>(host + L.merges), merge_cap);
  auto copy_ints = [&](int64_t at, std::span<const int32_t> v) {
    if (!v.empty()) std::memcpy(host + at, v.data(), v.size_bytes());
  };
  copy_ints(L.qo_indptr, pr.qo_indptr);
  copy_ints(L.kv_indptr, pr.kv_indptr);
  if (pr.paged) {
    copy_ints(L.last_page_len, pr.kv_last_page_len);
    if (!pr.device_kv_indices) copy_ints(L.indices, pr.kv_indices);
  }
  std::memset(host + L.error, 0, kPageErrorWords * 4);
  if (!pr.custom_params.empty()) std::memcpy(host + L.user_params, pr.custom_params.data(), pr.custom_params.size_bytes());
  if (has_mask) {
    copy_ints(L.mask_indptr, pr.mask_indptr);
    if (!pr.custom_mask.empty()) std::memcpy(host + L.mask, pr.custom_mask.data(), pr.custom_mask.size());
  }
  char* ws = static_cast<char*>(workspace);
  trace.mark("stage");
  staging_.copy(ws + L.items, copy_bytes, stream);
  trace.mark("copy");
  staging_.release(stream);
  trace.mark("release");

  kernels::PrefillParams b{};
  b.qo_indptr = reinterpret_cast<const int32_t*>(ws + L.qo_indptr);
  b.kv_indptr = reinterpret_cast<const int32_t*>(ws + L.kv_indptr);
  b.kv_indices = pr.device_kv_indices ? pr.device_kv_indices : reinterpret_cast<const int32_t*>(ws + L.indices);
  b.error = reinterpret_cast<int32_t*>(ws + L.error);
  b.kv_last_page_len = reinterpret_cast<const int32_t*>(ws + L.last_page_len);
  b.page_size = pr.page_size;
  b.items = reinterpret_cast<const DeviceWorkItem*>(ws + L.items);
  b.merges = reinterpret_cast<const DeviceMergeEntry*>(ws + L.merges);
  b.partial_o = reinterpret_cast<float*>(ws + L.partial_o);
  b.partial_lse = reinterpret_cast<float*>(ws + L.partial_lse);
  b.partial_rows = int32_t(rows);
  // The merge kernel's shape (common/merge_rows.cuh): warps per row from the most slots an entry
  // has, CTAs per entry from its most rows; a captured launch keeps its shape, so graph mode
  // takes a fixed middle value and the capacity's rows.
  b.merge_row_warps = opts.cuda_graph ? 4 : kernels::merge_row_warps_for(plan.max_merge_slots());
  int64_t merge_rows = rows;
  if (!opts.cuda_graph) {
    merge_rows = 0;
    for (const MergeEntry& m : plan.merges()) merge_rows = std::max<int64_t>(merge_rows, int64_t(m.q_end - m.q_begin) * group);
  }
  const int rows_per_merge_cta = kernels::kMergeRowWarps / b.merge_row_warps;
  b.num_qo_heads = pr.num_qo_heads;
  b.num_kv_heads = pr.num_kv_heads;
  b.slices = slice_zero ? plan.num_slices() : 1;
  b.slice_heads = plan.slice_heads();
  b.slice_slots = int32_t(plan.slice_slots());
  b.variant = pr.variant;
  b.variant.custom_mask = has_mask ? reinterpret_cast<const uint8_t*>(ws + L.mask) : nullptr;
  b.variant.mask_indptr = has_mask ? reinterpret_cast<const int32_t*>(ws + L.mask_indptr) : nullptr;
  b.variant.user_params = pr.custom ? ws + L.user_params : nullptr;

  config_ = cfg;
  graph_mode_ = bool(opts.cuda_graph);
  kernel_ = kernel;
  merge_kernel_ = merge;
  has_lse_ = has_lse;
  smem_bytes_ = smem;
  per_sm_ = per_sm;
  device_ = device;
  head_chunks_ = head_chunks;
  grid_ = opts.cuda_graph ? plan.item_capacity() : plan.num_items();
  merge_grid_ = opts.cuda_graph ? plan.merge_capacity() : plan.num_merges();
  merge_grid_y_ = std::max<int64_t>(1, (merge_rows + rows_per_merge_cta - 1) / rows_per_merge_cta);
  KVATTN_CHECK(merge_grid_y_ <= 65535, "the merge of this plan needs ", merge_grid_y_,
               " CTAs per entry, more than a grid's 65535 (query tile x group = ", rows, " rows)");
  workspace_used_ = L.end;
  has_kv_tokens_ = std::any_of(pr.kv_len.begin(), pr.kv_len.end(), [](int32_t n) { return n > 0; });
  base_ = b;
  live_ ^= 1;
}

void PrefillRunner::run(const AttentionTensors& t, cudaStream_t stream) const {
  KVATTN_CHECK(kernel_ != nullptr, "BatchPrefill.run() was called before plan()");
  DeviceGuard guard(device_);
  kernels::PrefillParams p = base_;
  p.q = t.q;
  p.q_stride_n = t.q_stride_n;
  p.q_stride_h = t.q_stride_h;
  p.o = t.o;
  p.o_stride_n = t.o_stride_n;
  p.o_stride_h = t.o_stride_h;
  p.lse = t.lse;
  p.lse_stride_n = t.lse_stride_n;
  p.lse_stride_h = t.lse_stride_h;
  p.k = t.k;
  p.v = t.v;
  p.k_stride_page = t.k_stride_page;
  p.k_stride_token = t.k_stride_token;
  p.k_stride_head = t.k_stride_head;
  p.v_stride_page = t.v_stride_page;
  p.v_stride_token = t.v_stride_token;
  p.v_stride_head = t.v_stride_head;
  if (config_.paged) {
    KVATTN_CHECK(t.num_pages <= INT32_MAX, "the paged cache has ", t.num_pages,
                 " pages, more than the prefill kernels' int32 page ids address");
    // A bad id is replaced by page 0 (and its rows poisoned), so a page must exist when any
    // request has KV tokens.
    KVATTN_CHECK(t.num_pages > 0 || !has_kv_tokens_, "the paged cache has no pages but the plan has KV tokens");
    p.num_pages = int32_t(t.num_pages);
  }
  void* args[] = {&p};
  if (grid_ == 0) return;  // nothing to compute
  check(cudaLaunchKernel(reinterpret_cast<const void*>(kernel_), dim3(unsigned(grid_), unsigned(head_chunks_)),
                         dim3(unsigned(config_.threads())), args, size_t(smem_bytes_), stream),
        "launching the prefill kernel");
  if (merge_grid_ > 0)
    check(cudaLaunchKernel(reinterpret_cast<const void*>(merge_kernel_), dim3(unsigned(merge_grid_), unsigned(merge_grid_y_)),
                           dim3(kPrefillMergeThreads), args, 0, stream),
          "launching the prefill merge kernel");
}

void PrefillRunner::check_errors(cudaStream_t stream) const {
  KVATTN_CHECK(kernel_ != nullptr, "BatchPrefill.check_errors() was called before plan()");
  DeviceGuard guard(device_);
  check_page_error_record(base_.error, stream, "prefill");
}

}  // namespace kvattn::cuda
