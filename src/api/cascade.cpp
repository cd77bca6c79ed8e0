// CascadeAttention (kvattn/cascade.h): each level is a BatchPrefill over the level's groups, the
// last writing out and lse, every earlier one writing a scratch state that merge_state_in_place
// folds in. A level's groups are rewritten so that BatchPrefill's rule (rows <= kv_len) holds:
// a group with more rows than keys is cut into chunks over the same pages, and a group without
// pages attends to stand-in pages whose rows the merge mask leaves out.
#include "kvattn/cascade.h"

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/attention_backend.h"
#include "core/shared_prefix.h"
#include "core/validate.h"
#include "kvattn/ops.h"

namespace kvattn {

namespace detail {

struct CascadeLevelState {
  // A level of one row per group (each request's own KV at decode, or a level nobody shares) runs
  // on BatchDecode and its kernels; any other on BatchPrefill.
  bool one_row_per_group = false;
  BatchPrefill prefill;
  BatchDecode decode;
  TensorView workspace_share;  // the part of the workspace the level's wrapper was created with

  void run(const TensorView& q, const PagedKVCache& kv, const TensorView& out, const TensorView& lse,
           void* stream) const {
    if (one_row_per_group)
      decode.run(q, kv, out, lse, stream);
    else
      prefill.run(q, kv, out, lse, stream);
  }
  void check_errors(void* stream) const {
    if (one_row_per_group)
      decode.check_errors(stream);
    else
      prefill.check_errors(stream);
  }
  const Plan* schedule() const { return one_row_per_group ? decode.schedule() : prefill.schedule(); }
  std::vector<int32_t> qo_indptr, kv_indptr, kv_indices, last_page_len;  // the rewritten level
  bool rewritten = false;
  bool masked = false;              // some rows take nothing from this level
  std::vector<uint8_t> merge_mask;  // [rows]: 1 where the row takes this level
  TensorView device_mask;           // a GPU plan: merge_mask staged in the workspace
  int64_t max_page_index = -1;      // host ids: the largest referenced (checked before any launch)
};

struct CascadeState {
  std::vector<CascadeLevelState> levels;
  int64_t rows = 0;
  int num_qo_heads = 0, head_dim_vo = 0;
  DType o_dtype = DType::bf16;
  bool gpu = false;
  Device device;
  // A GPU plan's scratch in the workspace: one level's state, its lse, and the lse run() keeps
  // when the caller asks for none.
  char* scratch_o = nullptr;
  float* scratch_lse = nullptr;
  float* own_lse = nullptr;
};

}  // namespace detail

namespace {

using detail::CascadeLevelState;
using detail::CascadeState;

constexpr int64_t kAlign = 256;
int64_t align_up(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Variants whose meaning depends on where a key sits in the row's whole sequence are wrong
// level by level; so are masks given as bits of that sequence and weights without an lse.
void check_cascade_variant(const Variant& v) {
  const char* what = detail::cascade_unsupported_feature(v);
  KVATTN_CHECK(what == nullptr, "CascadeAttention does not support ", what, " (variant ", v.describe(),
               "): ",
               v.sigmoid ? "it has no lse to merge the levels with"
                         : "a level does not know where its keys sit in a row's whole sequence",
               "; use BatchPrefill or BatchDecode over the concatenated page lists");
}

TensorView host_i32(const std::vector<int32_t>& v) {
  return TensorView(v.data(), DType::i32, {int64_t(v.size())});
}

// Level `l`'s groups as BatchPrefill requests (see the file comment); `last`: the requests' own KV,
// passed on unchanged (BatchPrefill then checks rows <= kv_len itself).
void plan_level_tables(CascadeLevelState& level, const CascadeLevel& in, int l, bool last, int page_size,
                       int64_t& rows, bool for_gpu) {
  const auto table = validate::page_table(in.page_table, page_size, -1, for_gpu);
  const int64_t groups = table.batch_size;
  KVATTN_CHECK(in.qo_indptr.defined() && in.qo_indptr.ndim() == 1 && in.qo_indptr.size(0) == groups + 1,
               "qo_indptr has ", in.qo_indptr.defined() ? in.qo_indptr.describe() : std::string("nothing"),
               " but the level's page table has ", groups, " page lists; it needs ", groups + 1, " elements");
  const auto qo = validate::indptr("qo_indptr", in.qo_indptr, groups + 1);
  KVATTN_CHECK(rows < 0 || qo.back() == rows, "qo_indptr[", groups, "] = ", qo.back(), " but level 0 covers ",
               rows, " query rows; every level covers the same rows");
  rows = qo.back();
  level.masked = false;
  level.max_page_index = -1;
  // Checked here for every level before any level's wrapper is re-planned, so that a rejected
  // plan() leaves the previous one in place: negative page ids (what the level's own wrapper would
  // reject), and a last-level group with more rows than keys (BatchPrefill takes it, but here its
  // first queries would sit inside the shared prefix, which the earlier levels show whole). Device
  // ids: the kernels check them where they read them.
  if (!table.device_indices)
    level.max_page_index = validate::page_id_range(table.indices.first(size_t(table.indptr.back()))).max;
  for (int64_t g = 0; g < groups && last; ++g)
    validate::qo_len_within_kv_len(g, qo[g], qo[g + 1], validate::paged_kv_len(table, page_size, g));
  level.one_row_per_group = groups == rows;
  for (int64_t g = 0; g < groups && level.one_row_per_group; ++g) level.one_row_per_group = qo[g + 1] - qo[g] == 1;
  // BatchDecode takes a request without keys (its row's state is o = 0, lse = -inf, which the
  // merge skips), so such a level is never rewritten.
  bool rewrite = false;
  for (int64_t g = 0; g < groups && !last && !level.one_row_per_group; ++g) {
    const int64_t n = qo[g + 1] - qo[g];
    rewrite |= n > validate::paged_kv_len(table, page_size, g);
  }
  level.rewritten = rewrite;
  level.merge_mask.assign(size_t(rows), 1);
  if (!rewrite) {
    level.qo_indptr.assign(qo.begin(), qo.end());
    return;
  }
  KVATTN_CHECK(!table.device_indices, "level ", l, "'s kv_indices is on ", table.indices_device.str(),
               ", but the level has a group with more query rows than keys, which CascadeAttention cuts "
               "into chunks over the same pages: pass a host (cpu) kv_indices for this level");
  level.qo_indptr.assign(1, 0);
  level.kv_indptr.assign(1, 0);
  level.kv_indices.clear();
  level.last_page_len.clear();
  auto emit = [&](int64_t n, std::span<const int32_t> pages, int32_t last_len) {
    level.qo_indptr.push_back(level.qo_indptr.back() + int32_t(n));
    level.kv_indices.insert(level.kv_indices.end(), pages.begin(), pages.end());
    level.kv_indptr.push_back(int32_t(level.kv_indices.size()));
    level.last_page_len.push_back(last_len);
  };
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t n = qo[g + 1] - qo[g], kv = validate::paged_kv_len(table, page_size, g);
    const auto pages = table.indices.subspan(size_t(table.indptr[g]), size_t(table.indptr[g + 1] - table.indptr[g]));
    if (n <= kv) {
      emit(n, pages, table.last_page_len[g]);
    } else if (kv == 0) {  // stand-in pages (page 0), left out by the merge mask
      const std::vector<int32_t> stand_in(size_t((n + page_size - 1) / page_size), 0);
      emit(n, stand_in, page_size);
      std::fill_n(level.merge_mask.begin() + qo[g], n, uint8_t(0));
      level.masked = true;
      level.max_page_index = std::max<int64_t>(level.max_page_index, 0);
    } else {
      for (int64_t begin = 0; begin < n; begin += kv) emit(std::min(kv, n - begin), pages, table.last_page_len[g]);
    }
  }
  KVATTN_CHECK(level.kv_indices.size() <= size_t(INT32_MAX), "level ", l,
               ": cutting its groups into chunks of at most kv_len rows repeats their pages ",
               level.kv_indices.size(), " times, more than int32 indices hold");
}

}  // namespace

CascadeAttention::CascadeAttention(TensorView workspace, KVLayout kv_layout)
    : workspace_(workspace), kv_layout_(kv_layout) {}
CascadeAttention::~CascadeAttention() = default;
CascadeAttention::CascadeAttention(CascadeAttention&&) noexcept = default;
CascadeAttention& CascadeAttention::operator=(CascadeAttention&&) noexcept = default;

void CascadeAttention::plan(const CascadePlan& params, void* stream) {
  KVATTN_CHECK(!params.levels.empty(), "CascadePlan.levels is empty; a cascade has at least one level");
  KVATTN_CHECK(params.levels.size() <= 64, "CascadePlan.levels has ", params.levels.size(),
               " levels, more than the 64 supported");
  const auto shape = detail::resolve_shape(params);
  check_cascade_variant(shape.variant);
  const bool gpu = workspace_.defined() && !workspace_.device().is_cpu();
  if (gpu) validate::gpu_workspace(workspace_);
  const int L = int(params.levels.size());

  auto state = std::make_unique<CascadeState>();
  state->levels.resize(size_t(L));
  state->num_qo_heads = shape.num_qo_heads;
  state->head_dim_vo = shape.head_dim_vo;
  state->o_dtype = shape.o_dtype;
  state->gpu = gpu;
  state->device = gpu ? workspace_.device() : Device::cpu();
  int64_t rows = -1;
  for (int l = 0; l < L; ++l) {
    try {
      plan_level_tables(state->levels[size_t(l)], params.levels[size_t(l)], l, l == L - 1, params.page_size, rows,
                        gpu);
    } catch (const Error& e) {
      throw Error("level " + std::to_string(l) + ": " + e.what());
    }
  }
  state->rows = rows;

  // The workspace: scratch (graph mode: sized for the capacity, so that it never moves), the merge
  // masks, then an equal share per level.
  std::vector<TensorView> shares(static_cast<size_t>(L));
  if (gpu) {
    const int64_t cap = params.scheduler.cuda_graph ? std::max(params.scheduler.cuda_graph->max_tokens, rows) : rows;
    const int64_t state_rows = cap * shape.num_qo_heads;
    char* base = workspace_.data_as<char>();
    int64_t off = 0;
    auto take = [&](int64_t bytes) { char* p = base + off; off += align_up(bytes); return p; };
    if (L > 1) {
      state->scratch_o = take(state_rows * shape.head_dim_vo * int64_t(dtype_size(shape.o_dtype)));
      state->scratch_lse = reinterpret_cast<float*>(take(state_rows * 4));
      state->own_lse = reinterpret_cast<float*>(take(state_rows * 4));
      for (int l = 0; l + 1 < L; ++l) {
        auto& level = state->levels[size_t(l)];
        char* mask = take(cap);
        if (!level.masked) continue;
        level.device_mask = TensorView(mask, DType::u8, {rows}, state->device);
        detail::copy_host_to_gpu(level.device_mask, level.merge_mask.data(), stream);
      }
    }
    const int64_t total = workspace_.numel() * int64_t(dtype_size(workspace_.dtype()));
    const int64_t share = (total - off) / L / kAlign * kAlign;
    KVATTN_CHECK(share > 0, "the workspace is too small: CascadeAttention's scratch for ", cap,
                 " query rows needs ", off, " bytes and the levels' plans more; the workspace has ", total);
    for (int l = 0; l < L; ++l)
      shares[size_t(l)] = TensorView(base + off + int64_t(l) * share, DType::u8, {share}, state->device);
  }

  // A level keeps its BatchPrefill across plans while its workspace share stays put (in graph
  // mode it always does), so that a captured run() stays valid and the graph-mode re-plan rules
  // hold per level.
  const bool reuse = state_ && state_->levels.size() == size_t(L);
  bool replanned_old = false;
  for (int l = 0; l < L; ++l) {
    auto& level = state->levels[size_t(l)];
    const CascadeLevel& in = params.levels[size_t(l)];
    level.workspace_share = shares[size_t(l)];
    auto* old = reuse ? &state_->levels[size_t(l)] : nullptr;
    const bool same_wrapper = old && old->one_row_per_group == level.one_row_per_group &&
                              old->workspace_share.data() == level.workspace_share.data() &&
                              old->workspace_share.numel() == level.workspace_share.numel();
    try {
      if (level.one_row_per_group) {
        BatchDecodePlan p;
        static_cast<AttentionShape&>(p) = params;
        p.variant.causal = false;  // a decode row sees every key of its level either way
        p.shared_prefix = SharedPrefix::never;
        p.page_size = params.page_size;
        p.page_table = in.page_table;
        if (!same_wrapper) old = nullptr, level.decode = BatchDecode(shares[size_t(l)], kv_layout_);
        (old ? old->decode : level.decode).plan(p, stream);
        if (old) level.decode = std::move(old->decode);
      } else {
        BatchPrefillPlan p;
        static_cast<AttentionShape&>(p) = params;
        p.variant.causal = params.variant.causal && l == L - 1;
        p.page_size = params.page_size;
        p.qo_indptr = host_i32(level.qo_indptr);
        p.page_table = level.rewritten ? PageTable{host_i32(level.kv_indptr), host_i32(level.kv_indices),
                                                   host_i32(level.last_page_len)}
                                       : in.page_table;
        if (!same_wrapper) old = nullptr, level.prefill = BatchPrefill(shares[size_t(l)], kv_layout_);
        (old ? old->prefill : level.prefill).plan(p, stream);
        if (old) level.prefill = std::move(old->prefill);
      }
      replanned_old |= old != nullptr;
    } catch (const Error& e) {
      // A level already moved to the new plan leaves the old cascade inconsistent: drop it.
      if (replanned_old) state_.reset();
      throw Error("level " + std::to_string(l) + ": " + e.what());
    }
  }
  state_ = std::move(state);  // only a fully valid plan replaces the previous one
}

void CascadeAttention::run(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
                           const TensorView& lse, void* stream) const {
  KVATTN_CHECK(state_ != nullptr, "CascadeAttention.run() was called before plan()");
  const CascadeState& s = *state_;
  validate::defined("q", q);
  KVATTN_CHECK(q.device() == s.device, "q is on ", q.device().str(), " but CascadeAttention was planned for ",
               s.device.str(), "; a plan runs where it was made for");
  // Everything that could fail in a later level is checked before the first level writes out.
  validate::defined("paged k", kv.k);
  for (size_t l = 0; l < s.levels.size(); ++l)
    KVATTN_CHECK(s.levels[l].max_page_index < kv.num_pages(), "level ", l, ": kv_indices refers to page ",
                 s.levels[l].max_page_index, ", out of range [0, ", kv.num_pages(), ")");
  // The aliasing rules of kvattn/attention.h against the whole workspace, as the flat wrappers
  // apply them (the levels check only their shares of it, and a CPU plan's levels have none).
  if (workspace_.defined()) {
    validate::no_overlap("out", out, "the workspace", workspace_);
    if (lse.defined()) validate::no_overlap("lse", lse, "the workspace", workspace_);
  }
  if (s.gpu) {
    validate::no_overlap("the workspace", workspace_, "q", q);
    validate::no_overlap("the workspace", workspace_, "paged k", kv.k);
    if (kv.v.defined()) validate::no_overlap("the workspace", workspace_, "paged v", kv.v);
  }
  const int64_t state_rows = s.rows * s.num_qo_heads;
  std::vector<float> host_lse, host_scratch_lse;
  std::vector<uint8_t> host_scratch_o;
  TensorView main_lse = lse, scratch_o, scratch_lse;
  if (s.levels.size() > 1) {
    const int64_t o_bytes = state_rows * s.head_dim_vo * int64_t(dtype_size(s.o_dtype));
    void* so = s.scratch_o;
    void* sl = s.scratch_lse;
    void* own = s.own_lse;
    if (!s.gpu) {
      host_scratch_o.resize(size_t(o_bytes));
      host_scratch_lse.resize(size_t(state_rows));
      so = host_scratch_o.data(), sl = host_scratch_lse.data();
      if (!lse.defined()) host_lse.resize(size_t(state_rows)), own = host_lse.data();
    }
    scratch_o = TensorView(so, s.o_dtype, {s.rows, s.num_qo_heads, s.head_dim_vo}, s.device);
    scratch_lse = TensorView(sl, DType::f32, {s.rows, s.num_qo_heads}, s.device);
    if (!lse.defined()) main_lse = TensorView(own, DType::f32, {s.rows, s.num_qo_heads}, s.device);
  }
  s.levels.back().run(q, kv, out, main_lse, stream);
  for (size_t l = 0; l + 1 < s.levels.size(); ++l) {
    const auto& level = s.levels[l];
    level.run(q, kv, scratch_o, scratch_lse, stream);
    TensorView mask;
    if (level.masked)
      mask = s.gpu ? level.device_mask : TensorView(level.merge_mask.data(), DType::u8, {s.rows});
    merge_state_in_place(out, main_lse, scratch_o, scratch_lse, mask, stream);
  }
}

void CascadeAttention::check_errors(void* stream) const {
  KVATTN_CHECK(state_ != nullptr, "CascadeAttention.check_errors() was called before plan()");
  for (size_t l = 0; l < state_->levels.size(); ++l) {
    try {
      state_->levels[l].check_errors(stream);
    } catch (const Error& e) {
      throw Error("level " + std::to_string(l) + ": " + e.what());
    }
  }
}

int CascadeAttention::num_levels() const { return state_ ? int(state_->levels.size()) : 0; }

const Plan* CascadeAttention::schedule(int level) const {
  if (!state_) return nullptr;
  KVATTN_CHECK(level >= 0 && level < num_levels(), "level = ", level, " is out of range [0, ", num_levels(), ")");
  return state_->levels[size_t(level)].schedule();
}

}  // namespace kvattn
