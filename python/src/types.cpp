// DType, KVLayout, the variant (Variant, RopeConfig, Llama31Scaling, kvattn.variants), the
// scheduler options, and the plan inspection types (Plan, WorkItem, MergeEntry, Planner).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
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

// Two views of the same memory, read the same way.
bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data() != b.data() || a.dtype() != b.dtype() || a.ndim() != b.ndim() || !(a.device() == b.device()))
    return false;
  for (int d = 0; d < a.ndim(); ++d)
    if (a.size(d) != b.size(d) || a.stride(d) != b.stride(d)) return false;
  return true;
}

template <class T>
const T* value_of(const std::vector<std::pair<std::string, T>>& values, const std::string& name) {
  for (const auto& [n, v] : values)
    if (n == name) return &v;
  return nullptr;
}

template <class T>
bool same_values(const std::vector<std::pair<std::string, T>>& a,
                 const std::vector<std::pair<std::string, T>>& b, bool (*eq)(const T&, const T&)) {
  if (a.size() != b.size()) return false;
  for (const auto& [n, v] : a) {
    const T* w = value_of(b, n);
    if (!w || !eq(v, *w)) return false;
  }
  return true;
}

// The same user variant (name, source, declarations in order) with the same values; tensors are
// the same when they are views of the same memory.
bool same_custom(const Variant& a, const Variant& b) {
  if (!a.custom || !b.custom) return !a.custom && !b.custom;
  const CustomVariant &x = *a.custom, &y = *b.custom;
  if (x.name != y.name || x.source != y.source || x.f32_params != y.f32_params ||
      x.i32_params != y.i32_params || x.tensor_params.size() != y.tensor_params.size())
    return false;
  for (size_t i = 0; i < x.tensor_params.size(); ++i) {
    const auto &s = x.tensor_params[i], &t = y.tensor_params[i];
    if (s.name != t.name || s.dtype != t.dtype || s.ndim != t.ndim) return false;
  }
  const CustomValues &u = a.custom_values, &w = b.custom_values;
  return same_values<float>(u.f32, w.f32, [](const float& p, const float& q) { return p == q; }) &&
         same_values<int32_t>(u.i32, w.i32, [](const int32_t& p, const int32_t& q) { return p == q; }) &&
         same_values<TensorView>(u.tensors, w.tensors, [](const TensorView& p, const TensorView& q) {
           return same_view(p, q);
         });
}

template <class T>
void set_value(std::vector<std::pair<std::string, T>>& values, const std::string& name, T value) {
  for (auto& [n, v] : values)
    if (n == name) {
      v = value;
      return;
    }
  values.emplace_back(name, value);
}

std::string dict_key(const std::string& where, const char* dict, nb::handle key) {
  if (!nb::isinstance<nb::str>(key)) {
    PyErr_Format(PyExc_TypeError, "%s: the keys of %s= are parameter names (str), got %s", where.c_str(),
                 dict, py_type_name(key).c_str());
    throw nb::python_error();
  }
  return nb::cast<std::string>(key);
}

// One value of scalars=: an int (i32), a float (f32), or a (dtype, value) pair with dtype f32 or
// i32 ("f32", kvattn.DType.i32, numpy.float32, ...). `declared`: the kind of a parameter the user
// variant already declares (with_custom_values), which an int value may also fill when it is f32.
struct Scalar {
  DType dtype = DType::f32;
  float f32 = 0.0f;
  int32_t i32 = 0;
};

Scalar scalar_arg(const std::string& where, const std::string& name, nb::handle value,
                  std::optional<DType> declared) {
  const std::string what = where + ": scalar parameter " + name;
  std::optional<DType> kind;
  nb::handle x = value;
  if (PyTuple_Check(value.ptr())) {
    if (PyTuple_GET_SIZE(value.ptr()) != 2)
      raise_value(what + ": a tuple must be (dtype, value) with dtype f32 or i32, got " +
                  std::to_string(PyTuple_GET_SIZE(value.ptr())) + " items");
    kind = dtype_arg(what.c_str(), PyTuple_GET_ITEM(value.ptr(), 0));
    if (*kind != DType::f32 && *kind != DType::i32)
      raise_dtype(what + " has dtype " + std::string(dtype_name(*kind)) + " (f32 or i32 are supported)");
    x = PyTuple_GET_ITEM(value.ptr(), 1);
  }
  if (PyBool_Check(x.ptr())) {
    PyErr_Format(PyExc_TypeError, "%s is a bool; give an int (i32) or a float (f32)", what.c_str());
    throw nb::python_error();
  }
  const bool integral = PyIndex_Check(x.ptr());
  if (!integral && !PyFloat_Check(x.ptr()) && !nb::hasattr(x, "__float__")) {
    PyErr_Format(PyExc_TypeError, "%s: expected an int, a float or a (dtype, value) pair, got %s",
                 what.c_str(), py_type_name(x).c_str());
    throw nb::python_error();
  }
  if (!kind) kind = declared ? *declared : (integral ? DType::i32 : DType::f32);
  if (declared && *kind != *declared)
    raise_dtype(what + " is declared " + std::string(dtype_name(*declared)) + " but a value of dtype " +
                std::string(dtype_name(*kind)) + " was given");
  Scalar s;
  s.dtype = *kind;
  if (*kind == DType::i32) {
    if (!integral)
      raise_dtype(what + " has dtype i32 but the value " + nb::cast<std::string>(nb::repr(x)) +
                  " is not an int");
    nb::object index = nb::steal(PyNumber_Index(x.ptr()));
    if (!index.is_valid()) throw nb::python_error();
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    if (v == -1 && PyErr_Occurred()) throw nb::python_error();
    if (overflow || v < INT32_MIN || v > INT32_MAX)
      raise_value(what + " = " + nb::cast<std::string>(nb::repr(index)) + " does not fit in int32");
    s.i32 = int32_t(v);
  } else {
    const double v = PyFloat_AsDouble(x.ptr());
    if (v == -1.0 && PyErr_Occurred()) throw nb::python_error();
    s.f32 = float(v);
  }
  return s;
}

// One value of tensors=: any DLPack producer, kept alive by the Variant.
PyVariant::Owned tensor_param_arg(const std::string& where, const std::string& name, nb::handle obj) {
  const std::string what = where + ": tensor parameter " + name;
  PyVariant::Owned o{name, nb::borrow(obj), std::make_shared<Held>()};
  try {
    tensor_arg(what.c_str(), obj, *o.held);
  } catch (nb::python_error& e) {
    if (!e.matches(dtype_error_type())) throw;
    std::string dt = "?";
    if (nb::hasattr(obj, "dtype")) {
      nb::object text = nb::steal(PyObject_Str(obj.attr("dtype").ptr()));
      if (text.is_valid()) dt = nb::cast<std::string>(text);
      PyErr_Clear();
    }
    raise_dtype(what + " has dtype " + dt + " (f32, i32 or u8 are supported)");
  }
  return o;
}

// base with the user variant `source` and its parameters, declared from the values given.
PyVariant with_custom_variant(const PyVariant& base, std::string source, std::string name,
                              const std::optional<nb::dict>& scalars, const std::optional<nb::dict>& tensors) {
  CustomVariant decl;
  decl.name = std::move(name);
  decl.source = std::move(source);
  const std::string where = "custom variant " + decl.name;
  CustomValues values;
  std::vector<PyVariant::Owned> owned;
  if (scalars)
    for (auto [k, v] : *scalars) {
      const std::string key = dict_key(where, "scalars", k);
      const Scalar s = scalar_arg(where, key, v, std::nullopt);
      if (s.dtype == DType::f32) {
        decl.f32_params.push_back(key);
        values.f32.emplace_back(key, s.f32);
      } else {
        decl.i32_params.push_back(key);
        values.i32.emplace_back(key, s.i32);
      }
    }
  if (tensors)
    for (auto [k, v] : *tensors) {
      const std::string key = dict_key(where, "tensors", k);
      PyVariant::Owned o = tensor_param_arg(where, key, v);
      const TensorView& t = o.held->view;
      decl.tensor_params.push_back({key, t.dtype(), t.ndim()});
      values.tensors.emplace_back(key, t);
      owned.push_back(std::move(o));
    }
  decl.validate();  // names, a name in both dicts, the tensors' dtypes and ranks
  PyVariant r = base;
  static_cast<Variant&>(r) = base.with_custom(std::move(decl), std::move(values));
  r.owned = std::move(owned);
  return r;
}

// v with new values for some of its user variant's parameters (the declaration is kept).
PyVariant with_custom_values(const PyVariant& v, const std::optional<nb::dict>& scalars,
                             const std::optional<nb::dict>& tensors) {
  if (!v.custom)
    raise_value("Variant.with_custom_values: the variant " + v.describe() +
                " has no user variant (give one with Variant.custom or with_custom)");
  const CustomVariant& d = *v.custom;
  const std::string where = "custom variant " + d.name;
  auto has = [](const std::vector<std::string>& names, const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  auto is_tensor = [&](const std::string& n) {
    for (const auto& t : d.tensor_params)
      if (t.name == n) return true;
    return false;
  };
  PyVariant r = v;
  if (scalars)
    for (auto [k, val] : *scalars) {
      const std::string key = dict_key(where, "scalars", k);
      std::optional<DType> declared;
      if (has(d.f32_params, key)) declared = DType::f32;
      else if (has(d.i32_params, key)) declared = DType::i32;
      else if (is_tensor(key)) raise_value(where + ": " + key + " is a tensor parameter; give it in tensors=");
      else raise_value(where + ": a value was given for " + key + ", which is not a declared parameter");
      const Scalar s = scalar_arg(where, key, val, declared);
      if (s.dtype == DType::f32) set_value(r.custom_values.f32, key, s.f32);
      else set_value(r.custom_values.i32, key, s.i32);
    }
  if (tensors)
    for (auto [k, val] : *tensors) {
      const std::string key = dict_key(where, "tensors", k);
      if (!is_tensor(key)) {
        if (has(d.f32_params, key) || has(d.i32_params, key))
          raise_value(where + ": " + key + " is a scalar parameter; give it in scalars=");
        raise_value(where + ": a value was given for " + key + ", which is not a declared parameter");
      }
      // Its dtype and rank are checked against the declaration at plan(), as in C++.
      PyVariant::Owned o = tensor_param_arg(where, key, val);
      set_value(r.custom_values.tensors, key, o.held->view);
      auto it = std::find_if(r.owned.begin(), r.owned.end(), [&](const auto& x) { return x.name == key; });
      if (it != r.owned.end()) *it = std::move(o);
      else r.owned.push_back(std::move(o));
    }
  return r;
}

// A with_* method of kvattn::Variant on PyVariant: the result keeps the owners.
template <class... A>
auto fluent(Variant (Variant::*method)(A...) const) {
  return [method](const PyVariant& self, A... args) {
    PyVariant r = self;
    static_cast<Variant&>(r) = (self.*method)(args...);
    return r;
  };
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
      }, nb::is_operator())
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
      .def("__eq__", [](const RopeConfig& a, const RopeConfig& b) { return same_rope(a, b); },
           nb::is_operator())
      .def("__repr__", [](const RopeConfig& r) {
        return "RopeConfig(rope_scale=" + repr_float(r.rope_scale) +
               ", rope_theta=" + repr_float(r.rope_theta) +
               ", interleave=" + (r.interleave ? "True" : "False") +
               (r.llama31 ? ", llama31=Llama31Scaling(...)" : "") + ")";
      });

  nb::class_<CustomVariant>(
      m, "CustomVariant",
      "The user variant a Variant carries (kvattn::CustomVariant; docs/VARIANTS.md): its name, "
      "source and parameter declarations. Read from Variant.custom_variant; made by Variant.custom "
      "and Variant.with_custom.")
      .def_ro("name", &CustomVariant::name, "Names the source in compiler errors (<name>.variant:LINE).")
      .def_ro("source", &CustomVariant::source, "C++ that defines struct Variant with the hooks.")
      .def_ro("f32_params", &CustomVariant::f32_params, "float scalars, Params::<name>, in order.")
      .def_ro("i32_params", &CustomVariant::i32_params, "int32_t scalars, in order.")
      .def_prop_ro(
          "tensor_params",
          [](const CustomVariant& c) {
            nb::list out;
            for (const auto& t : c.tensor_params) out.append(nb::make_tuple(t.name, t.dtype, t.ndim));
            return out;
          },
          nb::sig("def tensor_params(self) -> list[tuple[str, DType, int]]"),
          "(name, dtype, ndim) of each tensor parameter, in order: "
          "kvattn::user::Tensor<T, ndim> Params::<name>.")
      .def("validate", &CustomVariant::validate,
           "Raises kvattn.Error naming the bad field (a name that is not an identifier, a repeat, ...).")
      .def("__eq__", [](const CustomVariant& a, const CustomVariant& b) {
        Variant x, y;
        x.custom = std::make_shared<const CustomVariant>(a);
        y.custom = std::make_shared<const CustomVariant>(b);
        return same_custom(x, y);
      }, nb::is_operator())
      .def("__repr__", [](const CustomVariant& c) {
        std::ostringstream os;
        os << "CustomVariant(name='" << c.name << "', f32_params=[";
        for (size_t i = 0; i < c.f32_params.size(); ++i) os << (i ? ", '" : "'") << c.f32_params[i] << "'";
        os << "], i32_params=[";
        for (size_t i = 0; i < c.i32_params.size(); ++i) os << (i ? ", '" : "'") << c.i32_params[i] << "'";
        os << "], tensor_params=[";
        for (size_t i = 0; i < c.tensor_params.size(); ++i)
          os << (i ? ", " : "") << "('" << c.tensor_params[i].name << "', "
             << dtype_name(c.tensor_params[i].dtype) << ", " << c.tensor_params[i].ndim << ")";
        os << "])";
        return os.str();
      });

  const char* custom_doc =
      "A user variant (docs/VARIANTS.md): `source` is C++ that defines struct Variant with any of "
      "the static hooks logits_transform, logits_mask, output_transform, sink_logit and the "
      "constant use_softmax = false, reading its parameters as p.<name>. The parameters are "
      "declared by the values given, in order:\n\n"
      "scalars: {name: value}; an int is an i32 parameter (int32_t), a float an f32 one (float); "
      "(\"f32\", x) / (\"i32\", x) pairs give the type explicitly (an int as a float: "
      "(\"f32\", 2)).\n"
      "tensors: {name: tensor}; any DLPack producer or buffer (numpy, torch, ...) of dtype "
      "float32, int32 or uint8 and 1 to 4 dimensions, declared with its dtype and ndim "
      "(kvattn::user::Tensor<T, ndim>: p.name(i, j), p.name.size(d)). Not copied: the hooks read "
      "it at run(), through its strides; the Variant keeps it alive (and a wrapper keeps the "
      "Variant of its current plan), so do not change it before the plan's last run().\n\n"
      "The source is compiled at the first plan() by the system's C++ compiler ($KVATTN_CXX, "
      "default c++) and cached under the JIT cache directory ($KVATTN_CACHE_DIR, ...); a source "
      "that does not compile raises kvattn.Error with the compiler's messages, the user's lines "
      "first as <name>.variant:LINE (NVRTC's <name>.variant(LINE) for the GPU kernels). Runs on the "
      "CPU backend and, with a CUDA workspace and its tensors on that GPU, on the GPU decode and "
      "prefill kernels (not GPU block-sparse). name: an identifier.";
  const std::string with_custom_doc =
      std::string("This variant with a user variant on top of its built-in switches (causal, "
                  "window, custom mask, soft-cap, ALiBi, RoPE, sigmoid, scales): the user mask is "
                  "ANDed with the built-in masks, the user transform follows soft-cap and ALiBi. "
                  "Replaces a user variant this one carried.\n\n") + custom_doc;

  nb::class_<PyVariant>(
      m, "Variant",
      "An attention variant: which built-in masks and logit transforms are on, and their "
      "parameters (kvattn/variant.h), and optionally a user variant (Variant.custom). Compose "
      "fluently: kvattn.variants.causal().with_soft_cap(30).with_window(4096). The with_* "
      "methods return a new Variant.")
      .def(
          "__init__",
          [](PyVariant* v, bool causal, int window_left, float logits_soft_cap, bool alibi,
             bool custom_mask, bool sigmoid, float sigmoid_bias, std::optional<RopeConfig> rope,
             std::optional<float> sm_scale, float q_scale, float k_scale, float v_scale) {
            new (v) PyVariant{};
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
          "rope", [](const PyVariant& v) { return v.rope; },
          [](PyVariant& v, std::optional<RopeConfig> r) { v.rope = r; },
          "Fused RoPE on q (position p(i)) and k (position j), or None. Returns a copy.")
      .def_prop_rw(
          "sm_scale", [](const PyVariant& v) { return v.sm_scale; },
          [](PyVariant& v, std::optional<float> s) { v.sm_scale = s; },
          "Logit scale; None: 1 / sqrt(head_dim_qk).")
      .def_rw("q_scale", &Variant::q_scale)
      .def_rw("k_scale", &Variant::k_scale)
      .def_rw("v_scale", &Variant::v_scale)
      .def("with_causal", fluent(&Variant::with_causal), nb::arg("on") = true)
      .def("with_window", fluent(&Variant::with_window), nb::arg("window_left"))
      .def("with_soft_cap", fluent(&Variant::with_soft_cap), nb::arg("cap"))
      .def("with_alibi", fluent(&Variant::with_alibi), nb::arg("on") = true)
      .def("with_custom_mask", fluent(&Variant::with_custom_mask), nb::arg("on") = true)
      .def("with_rope", fluent(&Variant::with_rope), nb::arg("rope") = RopeConfig{})
      .def("with_sm_scale", fluent(&Variant::with_sm_scale), nb::arg("sm_scale"))
      .def("with_scales", fluent(&Variant::with_scales), nb::arg("q_scale"), nb::arg("k_scale"),
           nb::arg("v_scale"), "fp8 dequantisation scales.")
      .def("with_sigmoid", fluent(&Variant::with_sigmoid), nb::arg("bias") = 0.0f)
      .def_static(
          "custom",
          [](std::string source, std::string name, std::optional<nb::dict> scalars,
             std::optional<nb::dict> tensors) {
            return with_custom_variant(PyVariant{}, std::move(source), std::move(name), scalars, tensors);
          },
          nb::arg("source"), nb::kw_only(), nb::arg("name") = "custom", nb::arg("scalars") = nb::none(),
          nb::arg("tensors") = nb::none(),
          nb::sig("def custom(source: str, *, name: str = 'custom', "
                  "scalars: dict[str, float | int | tuple[str | DType, float | int]] | None = None, "
                  "tensors: dict[str, object] | None = None) -> Variant"),
          (std::string("A Variant with no built-in switch on, carrying a user variant.\n\n") + custom_doc).c_str())
      .def(
          "with_custom",
          [](const PyVariant& self, std::string source, std::string name, std::optional<nb::dict> scalars,
             std::optional<nb::dict> tensors) {
            return with_custom_variant(self, std::move(source), std::move(name), scalars, tensors);
          },
          nb::arg("source"), nb::kw_only(), nb::arg("name") = "custom", nb::arg("scalars") = nb::none(),
          nb::arg("tensors") = nb::none(),
          nb::sig("def with_custom(self, source: str, *, name: str = 'custom', "
                  "scalars: dict[str, float | int | tuple[str | DType, float | int]] | None = None, "
                  "tensors: dict[str, object] | None = None) -> Variant"),
          with_custom_doc.c_str())
      .def("with_custom_values", &with_custom_values, nb::kw_only(), nb::arg("scalars") = nb::none(),
           nb::arg("tensors") = nb::none(),
           nb::sig("def with_custom_values(self, *, scalars: dict[str, float | int | tuple[str | DType, "
                   "float | int]] | None = None, tensors: dict[str, object] | None = None) -> Variant"),
           "This variant with new values for some parameters of its user variant (the others keep "
           "theirs; the declaration, and so the compiled code, stays): a name it does not declare "
           "raises kvattn.Error, an int fills an f32 parameter, and a tensor of another dtype or "
           "rank than declared is refused by plan() (\"tensor parameter doc_ids has dtype u8 but "
           "was declared i32\").")
      .def_prop_ro(
          "custom_variant",
          [](const PyVariant& v) -> std::optional<CustomVariant> {
            if (!v.custom) return std::nullopt;
            return *v.custom;
          },
          "The user variant (a kvattn.CustomVariant copy), or None.")
      .def_prop_ro(
          "custom_scalars",
          [](const PyVariant& v) {
            nb::dict out;
            if (!v.custom) return out;
            for (const auto& n : v.custom->f32_params)
              if (const float* x = value_of(v.custom_values.f32, n)) out[n.c_str()] = double(*x);
            for (const auto& n : v.custom->i32_params)
              if (const int32_t* x = value_of(v.custom_values.i32, n)) out[n.c_str()] = *x;
            return out;
          },
          nb::sig("def custom_scalars(self) -> dict[str, float | int]"),
          "The user variant's scalar values by name (f32 as float, i32 as int); {} without one.")
      .def_prop_ro(
          "custom_tensors",
          [](const PyVariant& v) {
            nb::dict out;
            if (!v.custom) return out;
            for (const auto& t : v.custom->tensor_params)
              for (const auto& o : v.owned)
                if (o.name == t.name) out[t.name.c_str()] = o.given;
            return out;
          },
          nb::sig("def custom_tensors(self) -> dict[str, object]"),
          "The tensors given for the user variant's parameters by name (the objects themselves); "
          "{} without one.")
      .def("describe", &Variant::describe,
           "'causal+window(4096)+soft_cap(30)'; 'plain' when nothing is on; a user variant adds "
           "'custom(<name>)'.")
      .def("validate", &Variant::validate,
           "Raises kvattn.Error naming the bad field (negative window other than -1, cap < 0, a user "
           "variant's bad declaration, ...).")
      .def("__eq__",
           [](const PyVariant& a, const PyVariant& b) { return same_variant(a, b) && same_custom(a, b); },
           nb::is_operator(),
           "Equal switches and parameters; user variants equal in name, source, declarations and "
           "values (tensors: views of the same memory, not equal contents).")
      .def("__copy__", [](const PyVariant& v) { return v; })
      .def("__repr__", [](const PyVariant& v) { return "Variant(" + v.describe() + ")"; });

  // kvattn.variants (the inline constructors of kvattn::variants) is python/kvattn/variants.py.

  // The sources of kvattn's own user variants (kvattn::variants::learned_sinks / streaming_sinks),
  // which kvattn.variants builds its sink variants from.
  nb::dict sources;
  for (const CustomVariant* v : {&variants::learned_sinks_variant(), &variants::streaming_sinks_variant()})
    sources[v->name.c_str()] = v->source;
  m.attr("_builtin_variant_sources") = sources;
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
