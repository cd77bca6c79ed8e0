// kvattn.BatchDecode, kvattn.BatchPrefill, kvattn.BlockSparseAttention, kvattn.CascadeAttention:
// the C++ wrappers with plan() taking the plan struct's fields as keyword arguments and run()
// allocating the outputs in the input's framework when out= / lse= are not given.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <chrono>
#include <vector>

#include "common.h"

namespace kvattn::py {

namespace {

// kvattn.PageTable(indptr, indices, last_page_len): the C++ PageTable with Python owners.
struct PyPageTable {
  nb::object indptr, indices, last_page_len;
};

// kvattn.CascadeLevel(qo_indptr, page_table): the C++ CascadeLevel with Python owners.
struct PyCascadeLevel {
  nb::object qo_indptr, page_table;
};

// kvattn.BSRMatrix(indptr, indices, M, N, R=1, C=1).
struct PyBSRMatrix {
  nb::object indptr, indices;
  int64_t M = 0, N = 0, R = 1, C = 1;
};


BSRMatrix bsr_arg(nb::handle obj, Held (&h)[2]) {
  BSRMatrix b;
  nb::handle parts[2];
  if (nb::isinstance<PyBSRMatrix>(obj)) {
    auto& m = nb::cast<PyBSRMatrix&>(obj);
    parts[0] = m.indptr;
    parts[1] = m.indices;
    b.M = m.M, b.N = m.N, b.R = m.R, b.C = m.C;
  } else if ((PyTuple_Check(obj.ptr()) || PyList_Check(obj.ptr())) && nb::len(obj) == 6) {
    parts[0] = PySequence_Fast_GET_ITEM(obj.ptr(), 0);
    parts[1] = PySequence_Fast_GET_ITEM(obj.ptr(), 1);
    int64_t* dims[4] = {&b.M, &b.N, &b.R, &b.C};
    for (int i = 0; i < 4; ++i) *dims[i] = nb::cast<int64_t>(nb::handle(PySequence_Fast_GET_ITEM(obj.ptr(), i + 2)));
  } else {
    PyErr_Format(PyExc_TypeError,
                 "bsr: expected kvattn.BSRMatrix(indptr, indices, M, N, R, C) or a tuple of those "
                 "six, got %s",
                 py_type_name(obj).c_str());
    throw nb::python_error();
  }
  b.indptr = index_arg("bsr indptr", parts[0], h[0]);
  b.indices = index_arg("bsr indices", parts[1], h[1]);
  return b;
}

// What run() needs from the last successful plan() to allocate outputs.
struct Planned {
  bool valid = false;
  bool paged = false;  // BatchPrefill: page table (else ragged KV)
  int num_qo_heads = 0;
  int head_dim_vo = 0;
  DType o_dtype = DType::bf16;
};

void fill_shape(AttentionShape& s, int num_qo_heads, int num_kv_heads, int head_dim_qk, int head_dim_vo,
                nb::handle q_dtype, nb::handle kv_dtype, nb::handle o_dtype,
                const PyVariant* variant, const std::optional<SchedulerOptions>& scheduler) {
  s.num_qo_heads = num_qo_heads;
  s.num_kv_heads = num_kv_heads;
  s.head_dim_qk = head_dim_qk;
  s.head_dim_vo = head_dim_vo;
  s.q_dtype = dtype_arg("q_dtype", q_dtype);
  s.kv_dtype = optional_dtype_arg("kv_dtype", kv_dtype);
  s.o_dtype = optional_dtype_arg("o_dtype", o_dtype);
  if (variant) s.variant = *variant;  // the C++ part; the owners stay with the Python object
  if (scheduler) s.scheduler = *scheduler;
}

Planned planned_from(const AttentionShape& s, bool paged = false) {
  return {true, paged, s.num_qo_heads, s.head_dim_vo ? s.head_dim_vo : s.head_dim_qk,
          s.o_dtype.value_or(s.q_dtype)};
}

// The state every wrapper keeps beside the C++ object: the workspace's owner and the arrays of the
// current plan (a device-resident kv_indices is read by the kernels at run time).
struct Base {
  Held workspace;
  nb::object workspace_obj;
  nb::object plan_inputs;
  // The kvattn.Variant of the current plan: it owns the tensors a user variant's hooks read at run().
  nb::object plan_variant;
  Planned planned;
  // Nanoseconds spent in the last C++ plan()/run() call itself (the binding's own cost is the rest;
  // python/benchmarks/decode_overhead.py).
  int64_t last_native_ns = 0;

  template <class F>
  void timed(F&& f) {
    nb::gil_scoped_release release;
    const auto t0 = std::chrono::steady_clock::now();
    f();
    last_native_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now() - t0).count();
  }

  // run() before any successful plan(): said before the arguments are parsed (a paged or ragged
  // run() reads its K/V arguments by the plan's kind).
  void require_plan(const char* who) const {
    if (!planned.valid) raise_value(std::string(who) + ".run() was called before plan()");
  }

  TensorView init_workspace(nb::handle ws) {
    workspace_obj = nb::borrow(ws);
    return tensor_arg("workspace", ws, workspace, true, true);
  }
  void* plan_stream(nb::handle stream) { return stream_arg(stream, workspace_obj, workspace.view); }

  // Allocates what was not given, resolves the stream, runs `call(out, lse, stream)` without the
  // GIL, and returns out or (out, lse).
  template <class F>
  nb::object finish(const char* who, nb::handle q_obj, const TensorView& q, nb::handle out,
                    nb::handle lse, bool return_lse, nb::handle stream, F&& call) {
    require_plan(who);
    const int64_t rows = q.size(0);
    nb::object out_obj = nb::borrow(out), lse_obj = nb::borrow(lse);
    if (out_obj.is_none())
      out_obj = empty_like_framework("q", q_obj, {rows, planned.num_qo_heads, planned.head_dim_vo}, planned.o_dtype);
    const bool want_lse = return_lse || !lse_obj.is_none();
    if (want_lse && lse_obj.is_none())
      lse_obj = empty_like_framework("q", q_obj, {rows, planned.num_qo_heads}, DType::f32);
    Held ho, hl;
    const TensorView& o = tensor_arg("out", out_obj, ho, true);
    const TensorView& l = tensor_arg("lse", lse_obj, hl, true, true);
    void* s = stream_arg(stream, q_obj, q);
    timed([&] { call(o, l, s); });
    if (want_lse) return nb::make_tuple(out_obj, lse_obj);
    return out_obj;
  }
};

struct PyBatchDecode : Base {
  BatchDecode impl;
  PyBatchDecode(nb::handle ws, KVLayout layout) : impl(init_workspace(ws), layout), layout(layout) {}
  KVLayout layout;
};

struct PyBatchPrefill : Base {
  BatchPrefill impl;
  PyBatchPrefill(nb::handle ws, KVLayout layout) : impl(init_workspace(ws), layout), layout(layout) {}
  KVLayout layout;
};

struct PyBlockSparse : Base {
  BlockSparseAttention impl;
  explicit PyBlockSparse(nb::handle ws) : impl(init_workspace(ws)) {}
};

struct PyCascade : Base {
  CascadeAttention impl;
  PyCascade(nb::handle ws, KVLayout layout) : impl(init_workspace(ws), layout), layout(layout) {}
  KVLayout layout;
};

template <class W>
std::optional<Plan> schedule_of(const W& w) {
  const Plan* p = w.impl.schedule();
  if (!p) return std::nullopt;
  return *p;
}

#define KVATTN_RUN_RETURNS \
    "Returns out, or (out, lse) when return_lse is true or lse= is given. out ([rows, num_qo_heads, " \
    "head_dim_vo], o_dtype) and lse ([rows, num_qo_heads] float32, base 2) are allocated in q's "     \
    "framework and on q's device when not given. stream: CUDA only; None runs on the current stream " \
    "of q's framework (torch.cuda.current_stream()), an int is a cudaStream_t."

}  // namespace

PageTable page_table_arg(nb::handle obj, Held (&h)[3], const std::string& prefix) {
  nb::handle parts[3];
  if (nb::isinstance<PyPageTable>(obj)) {
    auto& t = nb::cast<PyPageTable&>(obj);
    parts[0] = t.indptr;
    parts[1] = t.indices;
    parts[2] = t.last_page_len;
  } else if ((PyTuple_Check(obj.ptr()) || PyList_Check(obj.ptr())) && nb::len(obj) == 3) {
    for (int i = 0; i < 3; ++i) parts[i] = PySequence_Fast_GET_ITEM(obj.ptr(), i);
  } else {
    PyErr_Format(PyExc_TypeError,
                 "%spage_table: expected kvattn.PageTable(indptr, indices, last_page_len) or a tuple "
                 "of those three arrays, got %s",
                 prefix.c_str(), py_type_name(obj).c_str());
    throw nb::python_error();
  }
  PageTable t;
  t.indptr = index_arg((prefix + "kv_indptr").c_str(), parts[0], h[0]);
  t.indices = index_arg((prefix + "kv_indices").c_str(), parts[1], h[1]);
  t.last_page_len = index_arg((prefix + "kv_last_page_len").c_str(), parts[2], h[2]);
  return t;
}

namespace {

// CascadeAttention.plan's levels: a sequence of kvattn.CascadeLevel or (qo_indptr, page_table)
// pairs; `held` has one entry per level (sized here, so that the views stay put). Errors name the
// level as the C++ ones do ("level 1: kv_indptr ...").
struct LevelHeld {
  Held qo_indptr;
  Held table[3];
};

std::vector<CascadeLevel> cascade_levels_arg(nb::handle obj, std::vector<LevelHeld>& held) {
  if (!PyTuple_Check(obj.ptr()) && !PyList_Check(obj.ptr())) {
    PyErr_Format(PyExc_TypeError,
                 "levels: expected a list of kvattn.CascadeLevel(qo_indptr, page_table) or "
                 "(qo_indptr, (kv_indptr, kv_indices, kv_last_page_len)) pairs, got %s",
                 py_type_name(obj).c_str());
    throw nb::python_error();
  }
  const size_t n = size_t(nb::len(obj));
  held.resize(n);
  std::vector<CascadeLevel> levels(n);
  for (size_t l = 0; l < n; ++l) {
    nb::handle item = PySequence_Fast_GET_ITEM(obj.ptr(), Py_ssize_t(l));
    const std::string prefix = "level " + std::to_string(l) + ": ";
    nb::handle qo, table;
    if (nb::isinstance<PyCascadeLevel>(item)) {
      auto& c = nb::cast<PyCascadeLevel&>(item);
      qo = c.qo_indptr;
      table = c.page_table;
    } else if ((PyTuple_Check(item.ptr()) || PyList_Check(item.ptr())) && nb::len(item) == 2) {
      qo = PySequence_Fast_GET_ITEM(item.ptr(), 0);
      table = PySequence_Fast_GET_ITEM(item.ptr(), 1);
    } else {
      PyErr_Format(PyExc_TypeError,
                   "levels[%zu]: expected kvattn.CascadeLevel(qo_indptr, page_table) or a "
                   "(qo_indptr, page_table) pair, got %s",
                   l, py_type_name(item).c_str());
      throw nb::python_error();
    }
    auto& h = held[l];
    levels[l].qo_indptr = index_arg((prefix + "qo_indptr").c_str(), qo, h.qo_indptr);
    levels[l].page_table = page_table_arg(table, h.table, prefix);
  }
  return levels;
}

}  // namespace

void bind_attention(nb::module_& m) {
  nb::class_<PyPageTable>(m, "PageTable",
                          "Which pages each request owns (SEMANTICS.md): indptr [B+1], indices [nnz], "
                          "last_page_len [B], int32 (numpy/torch arrays or lists). On the GPU, indices "
                          "may live on the workspace's device.")
      .def(
          "__init__",
          [](PyPageTable* t, nb::object indptr, nb::object indices, nb::object last) {
            new (t) PyPageTable{std::move(indptr), std::move(indices), std::move(last)};
          },
          nb::arg("indptr"), nb::arg("indices"), nb::arg("last_page_len"))
      .def_rw("indptr", &PyPageTable::indptr)
      .def_rw("indices", &PyPageTable::indices)
      .def_rw("last_page_len", &PyPageTable::last_page_len);

  nb::class_<PyBSRMatrix>(m, "BSRMatrix",
                          "A block-sparse M x N matrix of R x C blocks: block row r attends to column "
                          "blocks indices[indptr[r] .. indptr[r+1]) (int32 host arrays or lists).")
      .def(
          "__init__",
          [](PyBSRMatrix* b, nb::object indptr, nb::object indices, int64_t M, int64_t N, int64_t R,
             int64_t C) { new (b) PyBSRMatrix{std::move(indptr), std::move(indices), M, N, R, C}; },
          nb::arg("indptr"), nb::arg("indices"), nb::arg("M"), nb::arg("N"), nb::arg("R") = 1,
          nb::arg("C") = 1)
      .def_rw("indptr", &PyBSRMatrix::indptr)
      .def_rw("indices", &PyBSRMatrix::indices)
      .def_rw("M", &PyBSRMatrix::M)
      .def_rw("N", &PyBSRMatrix::N)
      .def_rw("R", &PyBSRMatrix::R)
      .def_rw("C", &PyBSRMatrix::C);

  // ---- BatchDecode ----------------------------------------------------------------------------------
  nb::class_<PyBatchDecode>(
      m, "BatchDecode",
      "Decode: one query token per request over the paged KV cache, with the plan/run split "
      "(kvattn/attention.h). q [B, num_qo_heads, head_dim_qk] -> out [B, num_qo_heads, head_dim_vo].\n\n"
      "workspace: a uint8 buffer on the GPU that runs the kernels (e.g. torch.empty(128 << 20, "
      "dtype=torch.uint8, device='cuda')); None (or a host buffer) for the CPU backend.")
      .def(
          "__init__",
          [](PyBatchDecode* self, nb::handle ws, nb::handle layout) {
            new (self) PyBatchDecode(ws, layout_arg(layout));
          },
          nb::arg("workspace") = nb::none(), nb::arg("kv_layout") = "NHD")
      .def(
          "plan",
          [](PyBatchDecode& self, nb::handle page_table, int page_size, int num_qo_heads,
             int num_kv_heads, int head_dim_qk, int head_dim_vo, nb::handle q_dtype,
             nb::handle kv_dtype, nb::handle o_dtype, const PyVariant* variant,
             std::optional<SchedulerOptions> scheduler, nb::handle custom_mask, nb::handle mask_indptr,
             nb::handle stream, const std::string& shared_prefix) {
            BatchDecodePlan p;
            if (shared_prefix == "automatic")
              p.shared_prefix = SharedPrefix::automatic;
            else if (shared_prefix == "always")
              p.shared_prefix = SharedPrefix::always;
            else if (shared_prefix == "never")
              p.shared_prefix = SharedPrefix::never;
            else
              raise_value("shared_prefix = '" + shared_prefix + "' is not one of 'automatic', 'always', 'never'");
            fill_shape(p, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, q_dtype, kv_dtype,
                       o_dtype, variant, scheduler);
            Held h[3], hm, hmi;
            p.page_table = page_table_arg(page_table, h);
            p.page_size = page_size;
            p.custom_mask = tensor_arg("custom_mask", custom_mask, hm, false, true);
            p.mask_indptr = index_arg("mask_indptr", mask_indptr, hmi, true);
            void* s = self.plan_stream(stream);
            self.timed([&] { self.impl.plan(p, s); });
            self.plan_inputs = nb::make_tuple(page_table, custom_mask, mask_indptr);
            self.plan_variant = variant ? nb::find(variant) : nb::object();
            self.planned = planned_from(p);
          },
          nb::kw_only(), nb::arg("page_table"), nb::arg("page_size"), nb::arg("num_qo_heads"),
          nb::arg("num_kv_heads"), nb::arg("head_dim_qk"), nb::arg("head_dim_vo") = 0,
          nb::arg("q_dtype") = "bf16", nb::arg("kv_dtype") = nb::none(),
          nb::arg("o_dtype") = nb::none(), nb::arg("variant") = nb::none(),
          nb::arg("scheduler") = nb::none(), nb::arg("custom_mask") = nb::none(),
          nb::arg("mask_indptr") = nb::none(), nb::arg("stream") = nb::none(),
          nb::arg("shared_prefix") = "automatic",
          "Plans a batch (the fields of kvattn::BatchDecodePlan). page_table: kvattn.PageTable or "
          "(indptr, indices, last_page_len); head_dim_vo 0: head_dim_qk; kv_dtype / o_dtype None: "
          "q_dtype; dtypes as kvattn.DType, 'bf16', numpy or torch dtypes; variant: kvattn.Variant "
          "(plain by default); scheduler: kvattn.SchedulerOptions; custom_mask (uint8, packed "
          "little-endian bits, kv_len bits of request b from byte mask_indptr[b]) with a variant that "
          "has custom_mask on (on a GPU the plan then runs on the prefill kernels). With a CUDA "
          "workspace the plan is staged on `stream` (None: the workspace framework's current stream). "
          "shared_prefix: 'automatic' runs requests whose page lists begin with the same page ids as a "
          "cascade when the cost model predicts a gain (kernel_family() then says 'cascade'), "
          "'always' whenever they exist, 'never' decodes flat (kvattn::SharedPrefix).")
      .def(
          "run",
          [](PyBatchDecode& self, nb::handle q, nb::handle kv, nb::handle v, nb::handle out,
             nb::handle lse, bool return_lse, nb::handle stream) {
            self.require_plan("BatchDecode");
            Held hq, hk, hv;
            const TensorView& qv = tensor_arg("q", q, hq);
            PagedKVCache cache = paged_cache_arg(kv, v, self.layout, hk, hv);
            return self.finish("BatchDecode", q, qv, out, lse, return_lse, stream,
                               [&](const TensorView& o, const TensorView& l, void* s) {
                                 self.impl.run(qv, cache, o, l, s);
                               });
          },
          nb::arg("q"), nb::arg("kv_cache"), nb::arg("v_cache") = nb::none(), nb::kw_only(),
          nb::arg("out") = nb::none(), nb::arg("lse") = nb::none(), nb::arg("return_lse") = false,
          nb::arg("stream") = nb::none(),
          "Decode attention over the paged cache: kv_cache is (k_cache, v_cache), a 5-D [pages, 2, "
          "...] tensor, or k_cache with v_cache given. " KVATTN_RUN_RETURNS)
      .def(
          "check_errors",
          [](PyBatchDecode& self, nb::handle stream) {
            void* s = self.plan_stream(stream);
            without_gil([&] { self.impl.check_errors(s); });
          },
          nb::arg("stream") = nb::none(),
          "Raises kvattn.Error naming the first out-of-range device-resident page id since the last "
          "plan() or check (waits for the stream).")
      .def("schedule", [](const PyBatchDecode& self) { return schedule_of(self); },
           "The Plan run() executes (a snapshot), or None before plan().")
      .def("kernel_family", [](const PyBatchDecode& self) { return std::string(self.impl.kernel_family()); },
           "'decode', 'prefill' (the GPU kernels the last plan chose), 'cpu', or '' before plan().")
      .def("kernel_name", [](const PyBatchDecode& self) { return self.impl.kernel_name(); },
           "The GPU kernel the last plan chose, by its JIT name; 'cpu', 'cascade', or '' before plan().")
      .def_prop_ro("_last_native_ns", [](const PyBatchDecode& self) { return self.last_native_ns; },
                   "Nanoseconds the last plan()/run() spent in the C++ call itself.")
      .def_prop_ro("kv_layout", [](const PyBatchDecode& self) { return self.layout; })
      .def_prop_ro("workspace", [](const PyBatchDecode& self) { return self.workspace_obj; });

  // ---- BatchPrefill -----------------------------------------------------------------------------------
  nb::class_<PyBatchPrefill>(
      m, "BatchPrefill",
      "Prefill and append (kvattn/attention.h): q [nnz_q, num_qo_heads, head_dim_qk] ragged by "
      "qo_indptr, KV either ragged (k, v by kv_indptr) or paged (page_table); qo_len <= kv_len per "
      "request, the causal mask aligned bottom-right.\n\nworkspace: as BatchDecode's.")
      .def(
          "__init__",
          [](PyBatchPrefill* self, nb::handle ws, nb::handle layout) {
            new (self) PyBatchPrefill(ws, layout_arg(layout));
          },
          nb::arg("workspace") = nb::none(), nb::arg("kv_layout") = "NHD")
      .def(
          "plan",
          [](PyBatchPrefill& self, nb::handle qo_indptr, nb::handle kv_indptr, nb::handle page_table,
             int page_size, nb::handle custom_mask, nb::handle mask_indptr, int num_qo_heads,
             int num_kv_heads, int head_dim_qk, int head_dim_vo, nb::handle q_dtype,
             nb::handle kv_dtype, nb::handle o_dtype, const PyVariant* variant,
             std::optional<SchedulerOptions> scheduler, nb::handle stream) {
            BatchPrefillPlan p;
            fill_shape(p, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, q_dtype, kv_dtype,
                       o_dtype, variant, scheduler);
            Held hq, hkv, hpt[3], hm, hmi;
            p.qo_indptr = index_arg("qo_indptr", qo_indptr, hq);
            const bool paged = !page_table.is_none();
            if (paged && !kv_indptr.is_none())
              raise_value("BatchPrefill.plan: give kv_indptr (ragged KV) or page_table (paged KV), not both");
            if (!paged && kv_indptr.is_none())
              raise_value("BatchPrefill.plan: kv_indptr (ragged KV) or page_table (paged KV) is required");
            if (paged) p.page_table = page_table_arg(page_table, hpt);
            else p.kv_indptr = index_arg("kv_indptr", kv_indptr, hkv);
            p.page_size = page_size;
            p.custom_mask = tensor_arg("custom_mask", custom_mask, hm, false, true);
            p.mask_indptr = index_arg("mask_indptr", mask_indptr, hmi, true);
            void* s = self.plan_stream(stream);
            self.timed([&] { self.impl.plan(p, s); });
            self.plan_inputs = nb::make_tuple(qo_indptr, kv_indptr, page_table, custom_mask, mask_indptr);
            self.plan_variant = variant ? nb::find(variant) : nb::object();
            self.planned = planned_from(p, paged);
          },
          nb::kw_only(), nb::arg("qo_indptr"), nb::arg("kv_indptr") = nb::none(),
          nb::arg("page_table") = nb::none(), nb::arg("page_size") = 0,
          nb::arg("custom_mask") = nb::none(), nb::arg("mask_indptr") = nb::none(),
          nb::arg("num_qo_heads"), nb::arg("num_kv_heads"), nb::arg("head_dim_qk"),
          nb::arg("head_dim_vo") = 0, nb::arg("q_dtype") = "bf16", nb::arg("kv_dtype") = nb::none(),
          nb::arg("o_dtype") = nb::none(), nb::arg("variant") = nb::none(),
          nb::arg("scheduler") = nb::none(), nb::arg("stream") = nb::none(),
          "Plans a batch (the fields of kvattn::BatchPrefillPlan): qo_indptr [B+1]; kv_indptr [B+1] "
          "for ragged KV or page_table + page_size for paged KV; custom_mask (uint8, packed "
          "little-endian bits, bit i * kv_len + j of request b from byte mask_indptr[b]) with a "
          "variant that has custom_mask on. Other arguments as BatchDecode.plan.")
      .def(
          "run",
          [](PyBatchPrefill& self, nb::handle q, nb::handle k, nb::handle v, nb::handle out,
             nb::handle lse, bool return_lse, nb::handle stream) {
            self.require_plan("BatchPrefill");
            Held hq, hk, hv;
            const TensorView& qv = tensor_arg("q", q, hq);
            if (self.planned.paged) {
              PagedKVCache cache = paged_cache_arg(k, v, self.layout, hk, hv);
              return self.finish("BatchPrefill", q, qv, out, lse, return_lse, stream,
                                 [&](const TensorView& o, const TensorView& l, void* s) {
                                   self.impl.run(qv, cache, o, l, s);
                                 });
            }
            const TensorView& kt = tensor_arg("k", k, hk);
            const TensorView& vt = tensor_arg("v", v, hv);
            return self.finish("BatchPrefill", q, qv, out, lse, return_lse, stream,
                               [&](const TensorView& o, const TensorView& l, void* s) {
                                 self.impl.run(qv, kt, vt, o, l, s);
                               });
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v") = nb::none(), nb::kw_only(),
          nb::arg("out") = nb::none(), nb::arg("lse") = nb::none(), nb::arg("return_lse") = false,
          nb::arg("stream") = nb::none(),
          "Prefill attention. Ragged plan: k [nnz_kv, num_kv_heads, head_dim_qk], v [nnz_kv, "
          "num_kv_heads, head_dim_vo]. Paged plan: k is the paged cache as in BatchDecode.run "
          "((k_cache, v_cache), 5-D, or k_cache with v = v_cache). " KVATTN_RUN_RETURNS)
      .def(
          "check_errors",
          [](PyBatchPrefill& self, nb::handle stream) {
            void* s = self.plan_stream(stream);
            without_gil([&] { self.impl.check_errors(s); });
          },
          nb::arg("stream") = nb::none(), "As BatchDecode.check_errors.")
      .def("schedule", [](const PyBatchPrefill& self) { return schedule_of(self); },
           "The Plan run() executes (a snapshot), or None before plan().")
      .def("kernel_name", [](const PyBatchPrefill& self) { return self.impl.kernel_name(); },
           "The GPU kernel the last plan chose, by its JIT name ('prefill_wgmma_...': the Hopper tier, "
           "'prefill_...': the mma.sync tier); 'cpu', or '' before plan().")
      .def_prop_ro("_last_native_ns", [](const PyBatchPrefill& self) { return self.last_native_ns; })
      .def_prop_ro("kv_layout", [](const PyBatchPrefill& self) { return self.layout; })
      .def_prop_ro("workspace", [](const PyBatchPrefill& self) { return self.workspace_obj; });

  // ---- BlockSparseAttention ----------------------------------------------------------------------------
  nb::class_<PyBlockSparse>(
      m, "BlockSparseAttention",
      "Block-sparse attention (kvattn/attention.h): q [M, num_qo_heads, head_dim_qk], k [N, "
      "num_kv_heads, head_dim_qk], v [N, num_kv_heads, head_dim_vo]; query row i sees key j iff "
      "block (i / R, j / C) is present. Key j is at position j, query i at i + N - M.")
      .def(
          "__init__", [](PyBlockSparse* self, nb::handle ws) { new (self) PyBlockSparse(ws); },
          nb::arg("workspace") = nb::none())
      .def(
          "plan",
          [](PyBlockSparse& self, nb::handle bsr, int num_qo_heads, int num_kv_heads, int head_dim_qk,
             int head_dim_vo, nb::handle q_dtype, nb::handle kv_dtype, nb::handle o_dtype,
             const PyVariant* variant, std::optional<SchedulerOptions> scheduler,
             nb::handle stream) {
            BlockSparsePlan p;
            fill_shape(p, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, q_dtype, kv_dtype,
                       o_dtype, variant, scheduler);
            Held h[2];
            p.bsr = bsr_arg(bsr, h);
            void* s = self.plan_stream(stream);
            self.timed([&] { self.impl.plan(p, s); });
            self.plan_inputs = nb::borrow(bsr);
            self.plan_variant = variant ? nb::find(variant) : nb::object();
            self.planned = planned_from(p);
          },
          nb::kw_only(), nb::arg("bsr"), nb::arg("num_qo_heads"), nb::arg("num_kv_heads"),
          nb::arg("head_dim_qk"), nb::arg("head_dim_vo") = 0, nb::arg("q_dtype") = "bf16",
          nb::arg("kv_dtype") = nb::none(), nb::arg("o_dtype") = nb::none(),
          nb::arg("variant") = nb::none(), nb::arg("scheduler") = nb::none(),
          nb::arg("stream") = nb::none(),
          "Plans (the fields of kvattn::BlockSparsePlan): bsr is a kvattn.BSRMatrix or (indptr, "
          "indices, M, N, R, C). Other arguments as BatchDecode.plan.")
      .def(
          "run",
          [](PyBlockSparse& self, nb::handle q, nb::handle k, nb::handle v, nb::handle out,
             nb::handle lse, bool return_lse, nb::handle stream) {
            self.require_plan("BlockSparseAttention");
            Held hq, hk, hv;
            const TensorView& qv = tensor_arg("q", q, hq);
            const TensorView& kt = tensor_arg("k", k, hk);
            const TensorView& vt = tensor_arg("v", v, hv);
            return self.finish("BlockSparseAttention", q, qv, out, lse, return_lse, stream,
                               [&](const TensorView& o, const TensorView& l, void* s) {
                                 self.impl.run(qv, kt, vt, o, l, s);
                               });
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::kw_only(), nb::arg("out") = nb::none(),
          nb::arg("lse") = nb::none(), nb::arg("return_lse") = false, nb::arg("stream") = nb::none(),
          KVATTN_RUN_RETURNS)
      .def("schedule", [](const PyBlockSparse& self) { return schedule_of(self); },
           "The Plan run() executes (a snapshot), or None before plan().")
      .def_prop_ro("_last_native_ns", [](const PyBlockSparse& self) { return self.last_native_ns; })
      .def_prop_ro("workspace", [](const PyBlockSparse& self) { return self.workspace_obj; });

  // ---- CascadeAttention --------------------------------------------------------------------------------
  nb::class_<PyCascadeLevel>(m, "CascadeLevel",
                             "One level of a cascade (kvattn/cascade.h): groups of consecutive query "
                             "rows, group g owning rows [qo_indptr[g], qo_indptr[g + 1]) and attending "
                             "to page list g of page_table (a kvattn.PageTable or (indptr, indices, "
                             "last_page_len)). int32 arrays or lists.")
      .def(
          "__init__",
          [](PyCascadeLevel* c, nb::object qo_indptr, nb::object page_table) {
            new (c) PyCascadeLevel{std::move(qo_indptr), std::move(page_table)};
          },
          nb::arg("qo_indptr"), nb::arg("page_table"))
      .def_rw("qo_indptr", &PyCascadeLevel::qo_indptr)
      .def_rw("page_table", &PyCascadeLevel::page_table);

  nb::class_<PyCascade>(
      m, "CascadeAttention",
      "Cascade attention (kvattn/cascade.h): the KV of a query row is the union of one page list "
      "per level of one paged cache, e.g. level 0 a prefix shared by many requests (read once for "
      "all of their queries), the last level each request's own pages. Each level is attended on "
      "its own (a BatchPrefill, or a BatchDecode when every group has one row) and the levels' "
      "states are merged, so the result is attention over each row's concatenated page lists, up "
      "to the rounding of one o_dtype state per level. q [rows, num_qo_heads, head_dim_qk] -> out "
      "[rows, num_qo_heads, head_dim_vo].\n\n"
      "An earlier level's group may have more rows than keys (it is cut into chunks over the same "
      "pages) or no pages at all (its rows take nothing from that level); the last level's groups "
      "need rows <= kv_len, as BatchPrefill's requests. Causal masks the last level only. "
      "Position-dependent variants (sliding window, ALiBi, fused RoPE), custom masks, sigmoid "
      "attention and user variants are plan() errors.\n\n"
      "workspace: as BatchDecode's (a CUDA uint8 buffer runs the levels on that device and holds "
      "the scratch state and every level's plan; None or a host buffer: the CPU backend).")
      .def(
          "__init__",
          [](PyCascade* self, nb::handle ws, nb::handle layout) {
            new (self) PyCascade(ws, layout_arg(layout));
          },
          nb::arg("workspace") = nb::none(), nb::arg("kv_layout") = "NHD")
      .def(
          "plan",
          [](PyCascade& self, nb::handle levels, int page_size, int num_qo_heads, int num_kv_heads,
             int head_dim_qk, int head_dim_vo, nb::handle q_dtype, nb::handle kv_dtype,
             nb::handle o_dtype, const PyVariant* variant, std::optional<SchedulerOptions> scheduler,
             nb::handle stream) {
            CascadePlan p;
            fill_shape(p, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, q_dtype, kv_dtype,
                       o_dtype, variant, scheduler);
            std::vector<LevelHeld> held;
            p.levels = cascade_levels_arg(levels, held);
            p.page_size = page_size;
            void* s = self.plan_stream(stream);
            self.timed([&] { self.impl.plan(p, s); });
            self.plan_inputs = nb::steal(PySequence_Tuple(levels.ptr()));  // a list or tuple
            self.plan_variant = variant ? nb::find(variant) : nb::object();
            self.planned = planned_from(p, true);
          },
          nb::kw_only(), nb::arg("levels"), nb::arg("page_size"), nb::arg("num_qo_heads"),
          nb::arg("num_kv_heads"), nb::arg("head_dim_qk"), nb::arg("head_dim_vo") = 0,
          nb::arg("q_dtype") = "bf16", nb::arg("kv_dtype") = nb::none(),
          nb::arg("o_dtype") = nb::none(), nb::arg("variant") = nb::none(),
          nb::arg("scheduler") = nb::none(), nb::arg("stream") = nb::none(),
          "Plans the cascade (the fields of kvattn::CascadePlan): levels, from the most shared "
          "(level 0) to each request's own KV (the last), is a list of kvattn.CascadeLevel or "
          "(qo_indptr, page_table) pairs, page_table a kvattn.PageTable or (kv_indptr, kv_indices, "
          "kv_last_page_len); every level covers the same rows (the same qo_indptr[-1]). Errors name "
          "the level ('level 1: kv_indptr ...'). Other arguments as BatchDecode.plan; the variant "
          "applies to every level, causal to the last only. With a CUDA workspace, a level's "
          "kv_indices may be on the device when each of its groups has 1 <= rows <= kv_len.")
      .def(
          "run",
          [](PyCascade& self, nb::handle q, nb::handle kv, nb::handle v, nb::handle out,
             nb::handle lse, bool return_lse, nb::handle stream) {
            self.require_plan("CascadeAttention");
            Held hq, hk, hv;
            const TensorView& qv = tensor_arg("q", q, hq);
            PagedKVCache cache = paged_cache_arg(kv, v, self.layout, hk, hv);
            return self.finish("CascadeAttention", q, qv, out, lse, return_lse, stream,
                               [&](const TensorView& o, const TensorView& l, void* s) {
                                 self.impl.run(qv, cache, o, l, s);
                               });
          },
          nb::arg("q"), nb::arg("paged_kv_cache"), nb::arg("v_cache") = nb::none(), nb::kw_only(),
          nb::arg("out") = nb::none(), nb::arg("lse") = nb::none(), nb::arg("return_lse") = false,
          nb::arg("stream") = nb::none(),
          "Cascade attention over the one paged cache every level indexes: paged_kv_cache is "
          "(k_cache, v_cache), a 5-D [pages, 2, ...] tensor, or k_cache with v_cache given (as "
          "BatchDecode.run). Every level's page ids are checked against the cache before anything "
          "is written. " KVATTN_RUN_RETURNS)
      .def(
          "check_errors",
          [](PyCascade& self, nb::handle stream) {
            void* s = self.plan_stream(stream);
            without_gil([&] { self.impl.check_errors(s); });
          },
          nb::arg("stream") = nb::none(),
          "As BatchDecode.check_errors, over every level (the message names the level).")
      .def(
          "schedule",
          [](const PyCascade& self, int level) -> std::optional<Plan> {
            const Plan* p = self.impl.schedule(level);
            if (!p) return std::nullopt;
            return *p;
          },
          nb::arg("level"),
          "Level `level`'s Plan (a snapshot), or None before plan(); kvattn.Error for a level out "
          "of range.")
      .def_prop_ro("num_levels", [](const PyCascade& self) { return self.impl.num_levels(); },
                   "The number of levels of the current plan (0 before plan()).")
      .def_prop_ro("_last_native_ns", [](const PyCascade& self) { return self.last_native_ns; })
      .def_prop_ro("kv_layout", [](const PyCascade& self) { return self.layout; })
      .def_prop_ro("workspace", [](const PyCascade& self) { return self.workspace_obj; });
}

}  // namespace kvattn::py
