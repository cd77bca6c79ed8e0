#include "cuda/decode_runner.h"

#include <algorithm>
#include <cstddef>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <string>

#include "cuda/runtime.h"
#include "cuda/workspace_fit.h"
#include "core/overrides.h"
#include "kvattn/error.h"

namespace kvattn::cuda {

using kernels::DeviceMergeEntry;
using kernels::DeviceDecodeItem;

static_assert(sizeof(DeviceDecodeItem) == sizeof(WorkItem) &&
                  offsetof(DeviceDecodeItem, kv_head) == offsetof(WorkItem, kv_head) &&
                  offsetof(DeviceDecodeItem, active) == offsetof(WorkItem, active) &&
                  offsetof(DeviceDecodeItem, page_base) == offsetof(WorkItem, q_begin) &&
                  offsetof(DeviceDecodeItem, kv_len) == offsetof(WorkItem, q_end) &&
                  offsetof(DeviceDecodeItem, kv_begin) == offsetof(WorkItem, kv_begin) &&
                  offsetof(DeviceDecodeItem, worker) == offsetof(WorkItem, worker) &&
                  offsetof(DeviceDecodeItem, partial_slot) == offsetof(WorkItem, partial_slot),
              "decode items are the planner's, with the query range replaced by the page run");
static_assert(sizeof(DeviceMergeEntry) == sizeof(MergeEntry) &&
                  offsetof(DeviceMergeEntry, num_slots) == offsetof(MergeEntry, num_slots),
              "device merge entries mirror the planner's");

namespace {
constexpr int64_t kAlign = 256;
int64_t align_up(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Rewrites the first n staged items as the decode kernels read them (DeviceDecodeItem): each
// active item's query range, [request, request + 1) in decode, becomes its request's page run.
void attach_page_runs(WorkItem* items, int64_t n, std::span<const int32_t> kv_indptr,
                      std::span<const int32_t> kv_len) {
  for (int64_t i = 0; i < n; ++i) {
    WorkItem& w = items[i];
    if (!w.active) continue;
    w.q_begin = kv_indptr[size_t(w.request)];  // DeviceDecodeItem::page_base
    w.q_end = kv_len[size_t(w.request)];       // DeviceDecodeItem::kv_len
  }
}

// Byte offsets of the plan's sections in the workspace: the partial states (sized by the
// capacity) first, then the metadata, then the page ids, so that one copy moves metadata and page
// ids together and a graph-mode re-plan moves nothing that a captured launch points at.
struct WorkspaceLayout {
  int64_t partial_o = 0, partial_lse = 0;
  int64_t items = 0, worker_begin = 0, slice_slots = 0, merges = 0, slot_merge = 0, merge_counters = 0,
          error = 0, user_params = 0, indices = 0, end = 0;
  int64_t meta_begin() const { return items; }
};

}  // namespace

DeviceLimits decode_device_limits(int device) {
  require_cuda("BatchDecode.plan on a CUDA workspace");
  return limits_of(device_info(device));
}

void DecodeRunner::plan(const DecodeProblem& pr, void* workspace, int64_t workspace_bytes,
                        int device, cudaStream_t stream) {
  const detail::Overrides& ov = detail::active_overrides();
  PhaseTrace trace(ov.plan_trace);
  require_cuda("BatchDecode.plan on a CUDA workspace");
  DeviceGuard guard(device);
  const DeviceInfo& dev = device_info(device);
  const DeviceLimits limits = limits_of(dev);
  const int group = pr.num_qo_heads / pr.num_kv_heads;
  // Programmatic dependent launch (sm_90+): the merge kernel is scheduled while the decode
  // kernel's last CTAs run and waits in-kernel for it (griddepcontrol). Overrides::decode_pdl =
  // false turns it off, for comparisons.
  const bool early_merge = dev.cc_major >= 9 && ov.decode_pdl.value_or(true);
  // Overrides::decode_tma_boxes = false sends every tile of the TMA kernel down its cp.async path
  // (tests of that path, measurements).
  const bool tma_boxes = ov.decode_tma_boxes.value_or(true);
  // A captured run() replays the kernel it captured: graph mode never switches on the batch.
  const bool skewed = !pr.scheduler.cuda_graph && decode_batch_is_skewed(pr.kv_len);
  DecodeProblemKey key;
  key.q_dtype = pr.q_dtype;
  key.kv_dtype = pr.kv_dtype;
  key.o_dtype = pr.o_dtype;
  key.head_dim_qk = pr.head_dim_qk;
  key.head_dim_vo = pr.head_dim_vo;
  key.group_size = group;
  key.page_size = pr.page_size;
  key.features = pr.variant.features;
  key.skewed_batch = skewed;
  if (pr.custom) key.user_variant = user_code_.code_of(*pr.custom);
  DecodeKernelConfig cfg = choose_decode(key, limits, ov);
  // A captured run() replays its kernel: whatever else chose it (an override read at
  // this plan) must not choose another between graph-mode plans (the wrappers check the rest).
  KVATTN_CHECK(!pr.scheduler.cuda_graph || !graph_mode_ || !kernel_ || cfg == config_,
               "in CUDA-graph mode the decode kernel cannot change between plans (a captured run() replays ",
               config_.name(), "; this plan chose ", cfg.name(), ": a KVATTN_DECODE_* setting changed)");
  // The kernels of the previous plan serve again when nothing that specialises them changed.
  cudaKernel_t kernel = kernel_, merge = merge_kernel_;
  bool has_lse = has_lse_;
  int per_sm = per_sm_;
  const int smem = decode_smem_bytes(cfg);
  if (!kernel || device != device_ || !(cfg == config_)) {
    const KernelSpec spec = decode_spec(cfg, dev.arch);
    kernel = KernelCache::global().kernel(spec);
    // A user variant's use_softmax, as its compiled code has it (no lse without a softmax).
    has_lse = !cfg.user_variant || KernelCache::global().device_int(spec, kUserSoftmaxSymbol) != 0;
    merge = KernelCache::global().kernel(decode_merge_spec(cfg, dev.arch));
    KVATTN_CHECK(size_t(smem) <= dev.max_smem_per_block_optin, "decode kernel ", cfg.name(), " needs ",
                 smem, " bytes of shared memory; ", dev.name, " allows ", dev.max_smem_per_block_optin);
    check(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
          "raising the decode kernel's shared-memory limit");
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, reinterpret_cast<const void*>(kernel),
                                                        cfg.threads, smem),
          "querying the decode kernel's occupancy");
  }
  trace.mark("kernels");
  const int head_chunks = group / cfg.heads_per_cta;
  const bool fold_in_kernel = decode_folds_in_kernel(ov);
  SchedulerOptions opts = pr.scheduler;
  if (opts.num_workers <= 0)
    opts.num_workers = decode_default_workers(dev.sm_count, per_sm, cfg.split_ctas_per_sm, head_chunks,
                                               pr.num_kv_heads, cfg.persistent);
  opts.slice_zero_only = true;  // the kernels repeat slice 0 (kernels/decode/persistent.cuh)

  PlannerInputs in;
  qo_indptr_.resize(pr.kv_len.size() + 1);
  for (size_t i = 0; i < qo_indptr_.size(); ++i) qo_indptr_[i] = int32_t(i);
  in.qo_indptr = qo_indptr_;
  in.kv_len = pr.kv_len;
  in.num_qo_heads = pr.num_qo_heads;
  in.num_kv_heads = pr.num_kv_heads;
  in.head_dim_qk = pr.head_dim_qk;
  in.head_dim_vo = pr.head_dim_vo;
  in.tile = TileShape{1, cfg.tile_tokens};
  in.window_left = (pr.variant.features & kernels::kSlidingWindow) ? pr.variant.window_left : -1;

  // Lay out the workspace (cuda/workspace_fit.h: the unsplit plan when the split one does not
  // fit). The plan holds slice 0 only, and only slice 0 is staged (kernels/decode/persistent.cuh
  // repeats it for the other slices on the device): 1/8 of the items at 32/8 heads on 264
  // workers. Graph mode pads it to a fixed length, so that the captured grid fits every re-plan.
  auto lay_out = [&](const Plan& plan) {
    const int64_t rows = plan.partial_slot_rows();
    const int64_t merge_cap = std::max<int64_t>(1, plan.merge_capacity());
    const int slice_workers = plan.slice_workers();
    const int64_t slice_cap = plan.item_capacity();
    WorkspaceLayout L;
    L.partial_o = 0;
    L.partial_lse = align_up(plan.slot_capacity() * rows * pr.head_dim_vo * 4);
    L.items = align_up(L.partial_lse + plan.slot_capacity() * rows * 4);
    L.worker_begin = L.items + slice_cap * int64_t(sizeof(WorkItem));
    L.slice_slots = L.worker_begin + (slice_workers + 1) * 4;
    L.merges = L.slice_slots + 4;
    L.slot_merge = L.merges + merge_cap * int64_t(sizeof(MergeEntry));
    L.merge_counters = L.slot_merge + plan.slot_capacity() * 4;
    L.error = L.merge_counters + merge_cap * head_chunks * 4;
    L.user_params = align_up(L.error + kPageErrorWords * 4);
    L.indices = L.user_params + int64_t(pr.custom_params.size_bytes());
    const int64_t nnz = pr.device_kv_indices ? 0 : int64_t(pr.kv_indices.size());
    L.end = L.indices + nnz * 4;
    return L;
  };
  const auto [planned, L] = plan_within_workspace(planners_[live_ ^ 1], in, opts, workspace_bytes, lay_out);
  trace.mark("planner");
  const Plan& plan = *planned;
  const int64_t merge_cap = std::max<int64_t>(1, plan.merge_capacity());
  const int slices = plan.num_slices(), slice_workers = plan.slice_workers();
  const int64_t slice_cap = plan.item_capacity();
  const int64_t nnz = pr.device_kv_indices ? 0 : int64_t(pr.kv_indices.size());

  // Stage metadata and page ids in pinned memory, then one copy (cuda/plan_staging.h).
  const int64_t copy_bytes = L.end - L.meta_begin();
  char* host = staging_.acquire(copy_bytes) - L.meta_begin();  // host + offset mirrors the workspace
  trace.mark("wait+alloc");
  auto* items = reinterpret_cast<WorkItem*>(host + L.items);
  auto* wb = reinterpret_cast<int32_t*>(host + L.worker_begin);
  int64_t pos = 0;
  if (cfg.persistent) {  // the planner's order: each worker's list, longest first
    const auto slice0 = plan.slice_items();
    pos = int64_t(slice0.size());
    std::memcpy(items, slice0.data(), slice0.size_bytes());
    std::memcpy(wb, plan.worker_begin().data(), size_t(slice_workers + 1) * 4);
    for (int64_t i = pos; i < slice_cap; ++i) items[i] = WorkItem{};  // inactive padding
  } else {  // one CTA per item
    pos = stage_items_round_robin(plan, slice_workers, slice_cap, items, active_);
    for (int w = 0; w <= slice_workers; ++w) wb[w] = 0;
  }
  wb[slice_workers] = int32_t(pos);
  attach_page_runs(items, pos, pr.kv_indptr, pr.kv_len);
  *reinterpret_cast<int32_t*>(host + L.slice_slots) = int32_t(plan.slice_slots());
  auto* merges = reinterpret_cast<MergeEntry*>(host + L.merges);
  stage_merges(plan, merges, merge_cap);
  for (int64_t i = 0; i < plan.num_merges(); ++i)  // DeviceMergeEntry: decode's q_begin is the query's position
    merges[i].q_begin = pr.kv_len[size_t(merges[i].request)] - 1;
  // Only the in-kernel fold reads these (else they travel as garbage); graph mode fills them
  // always, since a graph captured with the fold keeps reading them after a re-plan without it.
  if (fold_in_kernel || opts.cuda_graph) {
    auto* slot_merge = reinterpret_cast<int32_t*>(host + L.slot_merge);
    std::memset(slot_merge, 0, size_t(plan.slot_capacity()) * 4);
    for (int64_t i = 0; i < plan.num_merges(); ++i) {
      const MergeEntry& m = plan.merges()[size_t(i)];
      for (int32_t s = m.slot_begin; s < m.slot_begin + m.num_slots; ++s) slot_merge[s] = int32_t(i);
    }
    std::memset(host + L.merge_counters, 0, size_t(merge_cap * head_chunks) * 4);
  }
  std::memset(host + L.error, 0, kPageErrorWords * 4);
  if (!pr.custom_params.empty()) std::memcpy(host + L.user_params, pr.custom_params.data(), pr.custom_params.size_bytes());
  if (nnz > 0) std::memcpy(host + L.indices, pr.kv_indices.data(), size_t(nnz) * 4);
  char* ws = static_cast<char*>(workspace);
  trace.mark("stage");
  staging_.copy(ws + L.meta_begin(), copy_bytes, stream);
  trace.mark("copy");
  staging_.release(stream);
  trace.mark("release");

  kernels::DecodeParams b{};
  b.kv_indices = pr.device_kv_indices ? pr.device_kv_indices : reinterpret_cast<const int32_t*>(ws + L.indices);
  b.error = reinterpret_cast<int32_t*>(ws + L.error);
  b.page_size = pr.page_size;
  b.items = reinterpret_cast<const DeviceDecodeItem*>(ws + L.items);
  b.worker_begin = reinterpret_cast<const int32_t*>(ws + L.worker_begin);
  b.slice_slots = reinterpret_cast<const int32_t*>(ws + L.slice_slots);
  b.slices = slices;
  b.slice_heads = plan.slice_heads();
  b.slice_workers = slice_workers;
  b.merges = reinterpret_cast<const DeviceMergeEntry*>(ws + L.merges);
  b.partial_o = reinterpret_cast<float*>(ws + L.partial_o);
  b.partial_lse = reinterpret_cast<float*>(ws + L.partial_lse);
  if (fold_in_kernel) {
    b.slot_merge = reinterpret_cast<const int32_t*>(ws + L.slot_merge);
    b.merge_counters = reinterpret_cast<int32_t*>(ws + L.merge_counters);
  }
  b.num_qo_heads = pr.num_qo_heads;
  b.num_kv_heads = pr.num_kv_heads;
  b.variant = pr.variant;
  b.variant.user_params = pr.custom ? ws + L.user_params : nullptr;
  // The merge kernel's shape (common/merge_rows.cuh): warps per head from the most slots an entry
  // has; a captured launch keeps its shape, so graph mode takes a fixed middle value.
  // About 4 slots per warp: one round of loads in flight (1 x 4096 +2%, 1 x 32k + 63 x 512 +1% on
  // the H200 against 8 per warp; 2026-11-30 at cd6e2d7, docs/perf/HISTORY.md).
  b.merge_row_warps = opts.cuda_graph ? 4 : kernels::merge_row_warps_for(plan.max_merge_slots(), 4);
  const int heads_per_merge_cta = kernels::kMergeRowWarps / b.merge_row_warps;

  config_ = cfg;
  graph_mode_ = bool(opts.cuda_graph);
  kernel_ = kernel;
  merge_kernel_ = merge;
  has_lse_ = has_lse;
  smem_bytes_ = smem;
  per_sm_ = per_sm;
  device_ = device;
  head_chunks_ = head_chunks;
  grid_ = cfg.persistent ? plan.num_workers() : slice_cap * slices;
  merge_grid_ = fold_in_kernel ? 0 : opts.cuda_graph ? plan.merge_capacity() : plan.num_merges();
  merge_grid_y_ = (group + heads_per_merge_cta - 1) / heads_per_merge_cta;
  workspace_used_ = L.end;
  early_merge_launch_ = early_merge;
  if (maps_.capacity() < kMapSlots) maps_.reserve(kMapSlots);  // run() then never allocates
  tma_boxes_ = tma_boxes;
  trace_ = ov.plan_trace;
  // Only a merge launched with PDL may start early: a caller's own kernel launched next with the
  // attribute must not (it would not wait for this grid).
  b.merge_follows = early_merge && merge_grid_ > 0 ? 1 : 0;
  base_ = b;
  live_ ^= 1;
}

void DecodeRunner::run(const AttentionTensors& t, cudaStream_t stream) const {
  KVATTN_CHECK(kernel_ != nullptr, "BatchDecode.run() was called before plan()");
  DeviceGuard guard(device_);
  kernels::DecodeParams p = base_;
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
  KVATTN_CHECK(t.num_pages <= INT32_MAX, "the paged cache has ", t.num_pages,
               " pages, more than the decode kernels' int32 page ids address");
  p.num_pages = int32_t(t.num_pages);
  p.k_stride_page = t.k_stride_page;
  p.k_stride_token = t.k_stride_token;
  p.k_stride_head = t.k_stride_head;
  p.v_stride_page = t.v_stride_page;
  p.v_stride_token = t.v_stride_token;
  p.v_stride_head = t.v_stride_head;
  if (config_.tma) {
    const PagedCacheView k{t.k, config_.kv_dtype, config_.head_dim_qk, base_.page_size, base_.num_kv_heads,
                           t.num_pages, t.k_stride_page, t.k_stride_token, t.k_stride_head};
    const PagedCacheView v{t.v, config_.kv_dtype, config_.head_dim_vo, base_.page_size, base_.num_kv_heads,
                           t.num_pages, t.v_stride_page, t.v_stride_token, t.v_stride_head};
    std::lock_guard<std::mutex> lock(maps_mutex_);
    const TensorMaps& maps = tensor_maps(k, v);
    p.tma_ready = maps.ready && tma_boxes_ ? 1 : 0;
    p.tma_token_dim = maps.token_dim;
    p.k_map = maps.k_map;
    p.v_map = maps.v_map;
  }
  void* args[] = {&p};
  if (grid_ == 0) return;  // an empty batch
  check(cudaLaunchKernel(reinterpret_cast<const void*>(kernel_), dim3(unsigned(grid_), unsigned(head_chunks_)),
                         dim3(unsigned(config_.threads)), args, size_t(smem_bytes_), stream),
        "launching the decode kernel");
  if (merge_grid_ == 0) return;
  cudaLaunchConfig_t merge{};
  merge.gridDim = dim3(unsigned(merge_grid_), unsigned(merge_grid_y_));
  merge.blockDim = dim3(kDecodeMergeThreads);
  merge.stream = stream;
  cudaLaunchAttribute early{};
  early.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  early.val.programmaticStreamSerializationAllowed = 1;
  if (early_merge_launch_) {
    merge.attrs = &early;
    merge.numAttrs = 1;
  }
  check(cudaLaunchKernelExC(&merge, reinterpret_cast<const void*>(merge_kernel_), args),
        "launching the decode merge kernel");
}

const DecodeRunner::TensorMaps& DecodeRunner::tensor_maps(const PagedCacheView& k, const PagedCacheView& v) const {
  for (const TensorMaps& m : maps_)
    if (m.k == k && m.v == v) return m;
  TensorMaps fresh;
  fresh.k = k;
  fresh.v = v;
  int k_dim = 0, v_dim = 0;
  fresh.ready = encode_paged_cache_map(k, fresh.k_map, k_dim) && encode_paged_cache_map(v, fresh.v_map, v_dim) &&
                k_dim == v_dim;
  fresh.token_dim = k_dim;
  // Without maps every tile takes the kernel's cp.async path: right, but slower. Say so when asked.
  if (!fresh.ready && trace_)
    std::fprintf(stderr,
                 "[run]  no TMA tensor maps for this K/V cache (strides in elements: page %lld, token %lld, "
                 "head %lld; see cuda/tensor_map.h): every tile takes the cp.async path\n",
                 static_cast<long long>(k.stride_page), static_cast<long long>(k.stride_token),
                 static_cast<long long>(k.stride_head));
  if (maps_.size() < kMapSlots) {
    maps_.push_back(fresh);
    return maps_.back();
  }
  TensorMaps& slot = maps_[next_map_slot_];
  next_map_slot_ = (next_map_slot_ + 1) % kMapSlots;
  slot = fresh;
  return slot;
}

void DecodeRunner::check_errors(cudaStream_t stream) const {
  KVATTN_CHECK(kernel_ != nullptr, "BatchDecode.check_errors() was called before plan()");
  DeviceGuard guard(device_);
  check_page_error_record(base_.error, stream, "decode");
}

}  // namespace kvattn::cuda
