// DType, KVLayout, the variant (Variant, RopeConfig, Llama31Scaling, kvattn.variants), the
// scheduler options, and the plan inspection types (Plan, WorkItem, MergeEntry, Planner).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <sstream>

#include "common.h"

namespace kvattn::py {

namespace {

std::string repr_float(float x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

bool same_llama31(const std::optional<Llama31Scaling>& a, const std::optional<Llama31Scaling>& b) {
  if (a.has_value() != b.has_value()) return false;
  if (!a) return true;
  return a->factor == b->factor && a->low_freq_factor == b->low_freq_factor &&
         a->high_freq_factor == b->high_freq_factor &&
         a->original_max_position == b->original_max_position;
}

bool same_rope(const std::optional<RopeConfig>& a, const std::optional<RopeConfig>& b) {
  if (a.has_value() != b.has_value()) return false;
  if (!a) return true;
  return a->rope_scale == b->rope_scale && a->rope_theta == b->rope_theta &&
         a->interleave == b->interleave && same_llama31(a->llama31, b->llama31);
}

bool same_variant(const Variant& a, const Variant& b) {
  return a.causal == b.causal && a.window_left == b.window_left &&
         a.logits_soft_cap == b.logits_soft_cap && a.alibi == b.alibi &&
         a.custom_mask == b.custom_mask && a.sigmoid == b.sigmoid &&
         a.sigmoid_bias == b.sigmoid_bias && same_rope(a.rope, b.rope) && a.sm_scale == b.sm_scale &&
         a.q_scale == b.q_scale && a.k_scale == b.k_scale && a.v_scale == b.v_scale;
}

// A host int32 array of one dimension, contiguous (the planner's spans).
std::span<const int32_t> host_i32_span(const char* name, const TensorView& t) {
  KVATTN_CHECK(t.ndim() == 1, name, " must be 1-D, got ", t.describe());
  KVATTN_CHECK(t.dtype() == DType::i32, name, " has dtype ", dtype_name(t.dtype()),
               " but i32 is expected");
  KVATTN_CHECK(t.device().is_cpu(), name, " must be on the host (cpu), got ", t.describe());
  KVATTN_CHECK(t.size(0) <= 1 || t.stride(0) == 1, name, " must be contiguous, got ", t.describe());
  // A DLPack producer may export a null pointer with elements (the C++ API's spans cannot).
  KVATTN_CHECK(t.size(0) == 0 || t.data() != nullptr, name, " has a null data pointer");
  return {t.data_as<const int32_t>(), size_t(t.size(0))};
}

}  // namespace

void bind_types(nb::module_& m) {
  nb::enum_<DType>(m, "DType", "Element types that cross kvattn's API (kvattn/dtype.h).")
      .value("f32", DType::f32)
      .value("f16", DType::f16)
      .value("bf16", DType::bf16)
      .value("e4m3", DType::e4m3, "fp8 e4m3fn (no infinities, max 448)")
      .value("e5m2", DType::e5m2, "fp8 e5m2 (IEEE-like, max 57344)")
      .value("i32", DType::i32)
      .value("u8", DType::u8);
  m.def(
      "dtype_size", [](nb::handle d) { return dtype_size(dtype_arg("dtype", d)); }, nb::arg("dtype"),
      "Bytes per element of a dtype (kvattn.DType, 'bf16', numpy or torch dtype).");

  nb::enum_<KVLayout>(m, "KVLayout", "Layout of a paged KV cache's 4-D tensors.")
      .value("NHD", KVLayout::NHD, "[pages, page_size, heads, dim]")
      .value("HND", KVLayout::HND, "[pages, heads, page_size, dim]");

  // ---- variants ---------------------------------------------------------------------------------
  nb::class_<Llama31Scaling>(m, "Llama31Scaling",
                             "Llama 3.1 frequency scaling of RoPE (SEMANTICS.md).")
      .def(
          "__init__",
          [](Llama31Scaling* s, float factor, float low, float high, float original) {
            new (s) Llama31Scaling{factor, low, high, original};
          },
          nb::kw_only(), nb::arg("factor") = 8.0f, nb::arg("low_freq_factor") = 1.0f,
          nb::arg("high_freq_factor") = 4.0f, nb::arg("original_max_position") = 8192.0f)
      .def_rw("factor", &Llama31Scaling::factor)
      .def_rw("low_freq_factor", &Llama31Scaling::low_freq_factor)
      .def_rw("high_freq_factor", &Llama31Scaling::high_freq_factor)
      .def_rw("original_max_position", &Llama31Scaling::original_max_position)
      .def("__eq__", [](const Llama31Scaling& a, const Llama31Scaling& b) {
        return same_llama31(a, b);
      })
      .def("__repr__", [](const Llama31Scaling& s) {
        return "Llama31Scaling(factor=" + repr_float(s.factor) +
               ", low_freq_factor=" + repr_float(s.low_freq_factor) +
               ", high_freq_factor=" + repr_float(s.high_freq_factor) +
               ", original_max_position=" + repr_float(s.original_max_position) + ")";
      });

  nb::class_<RopeConfig>(m, "RopeConfig",
                         "Rotary position embedding parameters (fused into attention by "
                         "Variant.with_rope, or given to apply_rope).")
      .def(
          "__init__",
          [](RopeConfig* r, float scale, float theta, bool interleave,
             std::optional<Llama31Scaling> llama31) {
            new (r) RopeConfig{scale, theta, interleave, llama31};
          },
          nb::kw_only(), nb::arg("rope_scale") = 1.0f, nb::arg("rope_theta") = 1.0e4f,
          nb::arg("interleave") = false, nb::arg("llama31") = nb::none())
      .def_rw("rope_scale", &RopeConfig::rope_scale)
      .def_rw("rope_theta", &RopeConfig::rope_theta)
      .def_rw("interleave", &RopeConfig::interleave,
              "Pair (x[2t], x[2t+1]) instead of rotate-half (x[t], x[t + d/2]).")
      .def_prop_rw(
          "llama31", [](const RopeConfig& r) { return r.llama31; },
          [](RopeConfig& r, std::optional<Llama31Scaling> l) { r.llama31 = l; },
          "Llama 3.1 frequency scaling, or None (plain llama frequencies). Returns a copy.")
      .def("__eq__", [](const RopeConfig& a, const RopeConfig& b) { return same_rope(a, b); })
      .def("__repr__", [](const RopeConfig& r) {
        return "RopeConfig(rope_scale=" + repr_float(r.rope_scale) +
               ", rope_theta=" + repr_float(r.rope_theta) +
               ", interleave=" + (r.interleave ? "True" : "False") +
               (r.llama31 ? ", llama31=Llama31Scaling(...)" : "") + ")";
      });

  nb::class_<Variant>(
      m, "Variant",
      "An attention variant: which built-in masks and logit transforms are on, and their "
      "parameters (kvattn/variant.h). Compose fluently: "
      "kvattn.variants.causal().with_soft_cap(30).with_window(4096). The with_* methods return a "
      "new Variant.")
      .def(
          "__init__",
          [](Variant* v, bool causal, int window_left, float logits_soft_cap, bool alibi,
             bool custom_mask, bool sigmoid, float sigmoid_bias, std::optional<RopeConfig> rope,
             std::optional<float> sm_scale, float q_scale, float k_scale, float v_scale) {
            new (v) Variant{};
            v->causal = causal;
            v->window_left = window_left;
            v->logits_soft_cap = logits_soft_cap;
            v->alibi = alibi;
            v->custom_mask = custom_mask;
            v->sigmoid = sigmoid;
            v->sigmoid_bias = sigmoid_bias;
            v->rope = rope;
            v->sm_scale = sm_scale;
            v->q_scale = q_scale;
            v->k_scale = k_scale;
            v->v_scale = v_scale;
          },
          nb::kw_only(), nb::arg("causal") = false, nb::arg("window_left") = -1,
          nb::arg("logits_soft_cap") = 0.0f, nb::arg("alibi") = false,
          nb::arg("custom_mask") = false, nb::arg("sigmoid") = false,
          nb::arg("sigmoid_bias") = 0.0f, nb::arg("rope") = nb::none(),
          nb::arg("sm_scale") = nb::none(), nb::arg("q_scale") = 1.0f, nb::arg("k_scale") = 1.0f,
          nb::arg("v_scale") = 1.0f)
      .def_rw("causal", &Variant::causal, "j <= p(i), aligned bottom-right.")
      .def_rw("window_left", &Variant::window_left, "Sliding window j >= p(i) - window_left; -1 off.")
      .def_rw("logits_soft_cap", &Variant::logits_soft_cap, "s <- cap * tanh(s / cap); 0 off.")
      .def_rw("alibi", &Variant::alibi, "s <- s + m_h * (j - p(i)) with the standard slopes.")
      .def_rw("custom_mask", &Variant::custom_mask,
              "A packed bit mask given to BatchPrefill.plan(custom_mask=, mask_indptr=).")
      .def_rw("sigmoid", &Variant::sigmoid, "No softmax: o = sum sigmoid(s + sigmoid_bias) v; no lse.")
      .def_rw("sigmoid_bias", &Variant::sigmoid_bias)
      .def_prop_rw(
          "rope", [](const Variant& v) { return v.rope; },
          [](Variant& v, std::optional<RopeConfig> r) { v.rope = r; },
          "Fused RoPE on q (position p(i)) and k (position j), or None. Returns a copy.")
      .def_prop_rw(
          "sm_scale", [](const Variant& v) { return v.sm_scale; },
          [](Variant& v, std::optional<float> s) { v.sm_scale = s; },
          "Logit scale; None: 1 / sqrt(head_dim_qk).")
      .def_rw("q_scale", &Variant::q_scale)
      .def_rw("k_scale", &Variant::k_scale)
      .def_rw("v_scale", &Variant::v_scale)
      .def("with_causal", &Variant::with_causal, nb::arg("on") = true)
      .def("with_window", &Variant::with_window, nb::arg("window_left"))
      .def("with_soft_cap", &Variant::with_soft_cap, nb::arg("cap"))
      .def("with_alibi", &Variant::with_alibi, nb::arg("on") = true)
      .def("with_custom_mask", &Variant::with_custom_mask, nb::arg("on") = true)
      .def("with_rope", &Variant::with_rope, nb::arg("rope") = RopeConfig{})
      .def("with_sm_scale", &Variant::with_sm_scale, nb::arg("sm_scale"))
      .def("with_scales", &Variant::with_scales, nb::arg("q_scale"), nb::arg("k_scale"),
           nb::arg("v_scale"), "fp8 dequantisation scales.")
      .def("with_sigmoid", &Variant::with_sigmoid, nb::arg("bias") = 0.0f)
      .def("describe", &Variant::describe, "'causal+window(4096)+soft_cap(30)'; 'plain' when nothing is on.")
      .def("validate", &Variant::validate,
           "Raises kvattn.Error naming the bad field (negative window other than -1, cap < 0, ...).")
      .def("__eq__", [](const Variant& a, const Variant& b) { return same_variant(a, b); })
      .def("__copy__", [](const Variant& v) { return v; })
      .def("__repr__", [](const Variant& v) { return "Variant(" + v.describe() + ")"; });

  // kvattn.variants (the inline constructors of kvattn::variants) is python/kvattn/variants.py.

  m.def("alibi_slope", &alibi_slope, nb::arg("head"), nb::arg("num_heads"),
        "ALiBi slope of `head` among `num_heads` (SEMANTICS.md).");

  // ---- scheduler options ----------------------------------------------------------------------------
  nb::class_<CostModel>(m, "CostModel", "Cost coefficients of the planner, in KV-token equivalents.")
      .def(
          "__init__",
          [](CostModel* c, int64_t item, int64_t row, int64_t kv, int64_t partial) {
            new (c) CostModel{item, row, kv, partial};
          },
          nb::kw_only(), nb::arg("per_item") = 64, nb::arg("per_query_row") = 1,
          nb::arg("per_kv_token") = 1, nb::arg("per_partial_row") = 4)
      .def_rw("per_item", &CostModel::per_item)
      .def_rw("per_query_row", &CostModel::per_query_row)
      .def_rw("per_kv_token", &CostModel::per_kv_token)
      .def_rw("per_partial_row", &CostModel::per_partial_row);

  nb::class_<TileShape>(m, "TileShape", "The kernel's tile: query tokens per item and the KV step.")
      .def(
          "__init__", [](TileShape* t, int q, int kv) { new (t) TileShape{q, kv}; }, nb::kw_only(),
          nb::arg("query_tokens") = 16, nb::arg("kv_tokens") = 64)
      .def_rw("query_tokens", &TileShape::query_tokens)
      .def_rw("kv_tokens", &TileShape::kv_tokens);

  nb::class_<GraphCapacity>(m, "GraphCapacity",
                            "CUDA-graph mode: fixed capacities of the work list and merge table.")
      .def(
          "__init__",
          [](GraphCapacity* g, int32_t batch, int64_t tokens, int32_t split) {
            new (g) GraphCapacity{batch, tokens, split};
          },
          nb::kw_only(), nb::arg("max_batch") = 0, nb::arg("max_tokens") = 0,
          nb::arg("max_split_items") = -1)
      .def_rw("max_batch", &GraphCapacity::max_batch)
      .def_rw("max_tokens", &GraphCapacity::max_tokens)
      .def_rw("max_split_items", &GraphCapacity::max_split_items);

  nb::class_<SchedulerOptions>(m, "SchedulerOptions",
                               "How plan() splits and assigns the work (kvattn/plan.h).")
      .def(
          "__init__",
          [](SchedulerOptions* o, int workers, int split, bool disable, std::optional<GraphCapacity> graph,
             std::optional<CostModel> cost, bool slice_zero_only) {
            new (o) SchedulerOptions{};
            o->num_workers = workers;
            o->fixed_split_size = split;
            o->disable_split_kv = disable;
            o->cuda_graph = graph;
            if (cost) o->cost = *cost;
            o->slice_zero_only = slice_zero_only;
          },
          nb::kw_only(), nb::arg("num_workers") = 0, nb::arg("fixed_split_size") = 0,
          nb::arg("disable_split_kv") = false, nb::arg("cuda_graph") = nb::none(),
          nb::arg("cost") = nb::none(), nb::arg("slice_zero_only") = false)
      .def_rw("num_workers", &SchedulerOptions::num_workers,
              "0: the backend's default (CPU: its threads; GPU: SMs x resident CTAs).")
      .def_rw("fixed_split_size", &SchedulerOptions::fixed_split_size,
              "> 0: KV chunks of exactly this many tokens (batch-invariant).")
      .def_rw("disable_split_kv", &SchedulerOptions::disable_split_kv)
      .def_prop_rw(
          "cuda_graph", [](const SchedulerOptions& o) { return o.cuda_graph; },
          [](SchedulerOptions& o, std::optional<GraphCapacity> g) { o.cuda_graph = g; },
          "GraphCapacity, or None (eager). Returns a copy.")
      .def_rw("cost", &SchedulerOptions::cost)
      .def_rw("slice_zero_only", &SchedulerOptions::slice_zero_only);

  // ---- plans --------------------------------------------------------------------------------------
  nb::class_<WorkItem>(m, "WorkItem",
                       "Query rows [q_begin, q_end) of `request` (the query heads of kv_head) "
                       "against KV tokens [kv_begin, kv_end); partial_slot >= 0: a split row's "
                       "partial state.")
      .def_ro("request", &WorkItem::request)
      .def_ro("kv_head", &WorkItem::kv_head)
      .def_ro("active", &WorkItem::active)
      .def_ro("q_begin", &WorkItem::q_begin)
      .def_ro("q_end", &WorkItem::q_end)
      .def_ro("kv_begin", &WorkItem::kv_begin)
      .def_ro("kv_end", &WorkItem::kv_end)
      .def_ro("worker", &WorkItem::worker)
      .def_ro("partial_slot", &WorkItem::partial_slot)
      .def_prop_ro("q_rows", &WorkItem::q_rows)
      .def_prop_ro("kv_tokens", &WorkItem::kv_tokens)
      .def("__repr__", [](const WorkItem& w) {
        std::ostringstream os;
        os << "WorkItem(request=" << w.request << ", kv_head=" << w.kv_head << ", q=[" << w.q_begin
           << ", " << w.q_end << "), kv=[" << w.kv_begin << ", " << w.kv_end << "), worker=" << w.worker
           << ", partial_slot=" << w.partial_slot << (w.active ? "" : ", inactive") << ")";
        return os.str();
      });

  nb::class_<MergeEntry>(m, "MergeEntry",
                         "Partial slots [slot_begin, slot_begin + num_slots) fold into query rows "
                         "[q_begin, q_end) of `request`, heads of kv_head.")
      .def_ro("request", &MergeEntry::request)
      .def_ro("kv_head", &MergeEntry::kv_head)
      .def_ro("q_begin", &MergeEntry::q_begin)
      .def_ro("q_end", &MergeEntry::q_end)
      .def_ro("slot_begin", &MergeEntry::slot_begin)
      .def_ro("num_slots", &MergeEntry::num_slots)
      .def("__repr__", [](const MergeEntry& e) {
        std::ostringstream os;
        os << "MergeEntry(request=" << e.request << ", kv_head=" << e.kv_head << ", q=[" << e.q_begin
           << ", " << e.q_end << "), slots=[" << e.slot_begin << ", " << e.slot_begin + e.num_slots
           << "))";
        return os.str();
      });

  nb::class_<Plan>(m, "Plan",
                   "A schedule (kvattn/plan.h): work items grouped by worker, the merge table of "
                   "split rows, cost statistics. A snapshot: later plan() calls do not change it.")
      .def_prop_ro("items", [](const Plan& p) { return std::vector<WorkItem>(p.items().begin(), p.items().end()); },
                   "Active items grouped by worker, each worker's list in execution order.")
      .def_prop_ro("all_items", [](const Plan& p) {
        return std::vector<WorkItem>(p.all_items().begin(), p.all_items().end());
      }, "items followed by inactive padding (graph mode).")
      .def("worker_items", [](const Plan& p, int w) {
        auto s = p.worker_items(w);
        return std::vector<WorkItem>(s.begin(), s.end());
      }, nb::arg("worker"))
      .def_prop_ro("merges", [](const Plan& p) { return std::vector<MergeEntry>(p.merges().begin(), p.merges().end()); })
      .def_prop_ro("worker_begin", [](const Plan& p) {
        return std::vector<int32_t>(p.worker_begin().begin(), p.worker_begin().end());
      })
      .def_prop_ro("worker_costs", [](const Plan& p) {
        return std::vector<int64_t>(p.worker_costs().begin(), p.worker_costs().end());
      })
      .def_prop_ro("num_workers", &Plan::num_workers)
      .def_prop_ro("num_items", &Plan::num_items)
      .def_prop_ro("num_merges", &Plan::num_merges)
      .def_prop_ro("num_partial_slots", &Plan::num_partial_slots)
      .def_prop_ro("item_capacity", &Plan::item_capacity)
      .def_prop_ro("merge_capacity", &Plan::merge_capacity)
      .def_prop_ro("slot_capacity", &Plan::slot_capacity)
      .def_prop_ro("graph_mode", &Plan::graph_mode)
      .def_prop_ro("split_size", &Plan::split_size, "KV tokens per chunk of the chosen split (0: nothing split).")
      .def_prop_ro("batch_size", &Plan::batch_size)
      .def_prop_ro("num_kv_heads", &Plan::num_kv_heads)
      .def_prop_ro("group_size", &Plan::group_size)
      .def_prop_ro("head_dim_vo", &Plan::head_dim_vo)
      .def_prop_ro("query_tile", &Plan::query_tile)
      .def_prop_ro("partial_slot_rows", &Plan::partial_slot_rows)
      .def_prop_ro("partial_state_floats", &Plan::partial_state_floats)
      .def_prop_ro("split_rows", &Plan::split_rows)
      .def_prop_ro("max_merge_slots", &Plan::max_merge_slots)
      .def_prop_ro("total_cost", &Plan::total_cost)
      .def_prop_ro("max_worker_cost", &Plan::max_worker_cost)
      .def_prop_ro("largest_item_cost", &Plan::largest_item_cost)
      .def_prop_ro("mean_worker_cost", &Plan::mean_worker_cost)
      .def_prop_ro("max_over_mean", &Plan::max_over_mean,
                   "The most loaded worker's cost over the mean (1.0 is perfect balance).")
      .def("item_cost", &Plan::item_cost, nb::arg("item"))
      .def_prop_ro("num_slices", &Plan::num_slices)
      .def_prop_ro("slice_heads", &Plan::slice_heads)
      .def_prop_ro("slice_workers", &Plan::slice_workers)
      .def_prop_ro("slice_slots", &Plan::slice_slots)
      .def_prop_ro("slice_items", [](const Plan& p) {
        return std::vector<WorkItem>(p.slice_items().begin(), p.slice_items().end());
      })
      .def_prop_ro("slice_zero_only", &Plan::slice_zero_only)
      .def("__repr__", [](const Plan& p) {
        std::ostringstream os;
        os << "Plan(batch_size=" << p.batch_size() << ", num_items=" << p.num_items()
           << ", num_workers=" << p.num_workers() << ", num_merges=" << p.num_merges()
           << ", split_size=" << p.split_size() << ", max_over_mean=" << p.max_over_mean()
           << (p.graph_mode() ? ", graph_mode" : "") << ")";
        return os.str();
      });

  auto plan_fn = [](Planner& planner, nb::handle qo_indptr, nb::handle kv_len, int num_qo_heads,
                    int num_kv_heads, int head_dim_qk, int head_dim_vo, std::optional<TileShape> tile,
                    bool causal, int window_left, std::optional<SchedulerOptions> options) {
    Held hq, hk;
    PlannerInputs in;
    in.qo_indptr = host_i32_span("qo_indptr", index_arg("qo_indptr", qo_indptr, hq));
    in.kv_len = host_i32_span("kv_len", index_arg("kv_len", kv_len, hk));
    in.num_qo_heads = num_qo_heads;
    in.num_kv_heads = num_kv_heads;
    in.head_dim_qk = head_dim_qk;
    in.head_dim_vo = head_dim_vo;
    if (tile) in.tile = *tile;
    in.causal = causal;
    in.window_left = window_left;
    return Plan(planner.plan(in, options.value_or(SchedulerOptions{})));
  };
  const char* plan_doc =
      "Builds a schedule from per-request lengths (kvattn/plan.h): qo_indptr [B+1] and kv_len [B] "
      "(int32 arrays on the host, or lists of ints). Returns a Plan snapshot.";
  nb::class_<Planner>(m, "Planner",
                      "Builds plans, reusing its buffers (in graph mode every plan() rewrites the same "
                      "work list).")
      .def(nb::init<>())
      .def("plan", plan_fn, nb::kw_only(), nb::arg("qo_indptr"), nb::arg("kv_len"),
           nb::arg("num_qo_heads"), nb::arg("num_kv_heads"), nb::arg("head_dim_qk"),
           nb::arg("head_dim_vo") = 0, nb::arg("tile") = nb::none(), nb::arg("causal") = false,
           nb::arg("window_left") = -1, nb::arg("options") = nb::none(), plan_doc)
      .def("current", [](const Planner& p) { return Plan(p.current()); });
  m.def(
      "make_plan",
      [plan_fn](nb::handle qo_indptr, nb::handle kv_len, int num_qo_heads, int num_kv_heads,
                int head_dim_qk, int head_dim_vo, std::optional<TileShape> tile, bool causal,
                int window_left, std::optional<SchedulerOptions> options) {
        Planner planner;
        return plan_fn(planner, qo_indptr, kv_len, num_qo_heads, num_kv_heads, head_dim_qk,
                       head_dim_vo, tile, causal, window_left, options);
      },
      nb::kw_only(), nb::arg("qo_indptr"), nb::arg("kv_len"), nb::arg("num_qo_heads"),
      nb::arg("num_kv_heads"), nb::arg("head_dim_qk"), nb::arg("head_dim_vo") = 0,
      nb::arg("tile") = nb::none(), nb::arg("causal") = false, nb::arg("window_left") = -1,
      nb::arg("options") = nb::none(), plan_doc);

  m.attr("MAX_KV_LEN") = kMaxKVLen;
  m.attr("MAX_TOTAL_TOKENS") = kMaxTotalTokens;
}

}  // namespace kvattn::py
