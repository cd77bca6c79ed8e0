#include "common.h"

#include <nanobind/stl/string.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string_view>

namespace kvattn::py {

namespace {
PyObject* g_error = nullptr;
PyObject* g_dtype_error = nullptr;

// kvattn's messages name dtype problems by the word: "q has dtype f16 but the plan was made for
// q_dtype = bf16", "kv_dtype e4m3 is not supported ...", "unknown dtype 'f64'".
bool is_dtype_message(const char* message) { return std::strstr(message, "dtype") != nullptr; }


// str(x) (PyObject_Str: nb::str(accessor) would only re-type the object).
std::string str_of(nb::handle x) {
  nb::object s = nb::steal(PyObject_Str(x.ptr()));
  if (!s.is_valid()) throw nb::python_error();
  return nb::cast<std::string>(s);
}

// kvattn._frameworks, imported on first use (import kvattn stays cheap and stubgen can import the
// extension on its own).
nb::handle frameworks() {
  static PyObject* module = nb::module_::import_("kvattn._frameworks").release().ptr();
  return module;
}

// torch._C._to_dlpack when obj is a torch.Tensor (exactly; subclasses take __dlpack__), else null.
// Looked up once torch is imported (sys.modules), never importing it.
PyObject* torch_to_dlpack(nb::handle obj) {
  static PyTypeObject* tensor_type = nullptr;
  static PyObject* exporter = nullptr;
  if (!tensor_type) {
    if (std::strncmp(Py_TYPE(obj.ptr())->tp_name, "Tensor", 6) != 0) return nullptr;
    PyObject* modules = PyImport_GetModuleDict();
    PyObject* torch = PyDict_GetItemString(modules, "torch");
    if (!torch) return nullptr;
    PyObject* tensor = PyObject_GetAttrString(torch, "Tensor");
    PyObject* c = PyObject_GetAttrString(torch, "_C");
    PyObject* fn = c ? PyObject_GetAttrString(c, "_to_dlpack") : nullptr;
    Py_XDECREF(c);
    if (!tensor || !fn || !PyType_Check(tensor)) {
      Py_XDECREF(tensor);
      Py_XDECREF(fn);
      PyErr_Clear();
      return nullptr;
    }
    tensor_type = reinterpret_cast<PyTypeObject*>(tensor);  // kept for the process's lifetime
    exporter = fn;
  }
  return Py_TYPE(obj.ptr()) == tensor_type ? exporter : nullptr;
}

// "float64" for an object with a dtype attribute, else "code C, bits B".
std::string source_dtype(nb::handle obj, const nb::dlpack::dtype& dt) {
  if (nb::hasattr(obj, "dtype")) {
    try {
      return str_of(obj.attr("dtype"));
    } catch (...) {
    }
  }
  return "DLPack code " + std::to_string(int(dt.code)) + ", bits " + std::to_string(int(dt.bits)) +
         ", lanes " + std::to_string(int(dt.lanes));
}

std::optional<DType> dtype_of(const nb::dlpack::dtype& dt) {
  using C = nb::dlpack::dtype_code;
  if (dt.lanes != 1) return std::nullopt;
  const auto code = C(dt.code);
  if (code == C::Float && dt.bits == 32) return DType::f32;
  if (code == C::Float && dt.bits == 16) return DType::f16;
  if (code == C::Bfloat && dt.bits == 16) return DType::bf16;
  if (code == C::Float8_E4M3FN && dt.bits == 8) return DType::e4m3;
  if (code == C::Float8_E5M2 && dt.bits == 8) return DType::e5m2;
  if (code == C::Int && dt.bits == 32) return DType::i32;
  if (code == C::UInt && dt.bits == 8) return DType::u8;
  return std::nullopt;
}

// For arrays whose dtype neither DLPack nor the buffer protocol carries (numpy arrays of ml_dtypes'
// bfloat16 / float8_e4m3fn / float8_e5m2; torch float8 on versions without DLPack fp8): an
// integer view of the same bytes, and the real dtype.
std::optional<DType> integer_view(nb::handle obj, nb::object& view) {
  if (!nb::hasattr(obj, "dtype") || !nb::hasattr(obj, "view")) return std::nullopt;
  std::string name;
  try {
    name = str_of(obj.attr("dtype"));
  } catch (...) {
    return std::nullopt;
  }
  const bool torch = name.rfind("torch.", 0) == 0;
  if (torch) name = name.substr(6);
  DType dtype;
  if (name == "bfloat16") dtype = DType::bf16;
  else if (name == "float8_e4m3fn") dtype = DType::e4m3;
  else if (name == "float8_e5m2") dtype = DType::e5m2;
  else return std::nullopt;
  const bool two_bytes = dtype == DType::bf16;
  try {
    if (torch) {
      nb::module_ t = nb::module_::import_("torch");
      view = obj.attr("view")(t.attr(two_bytes ? "int16" : "uint8"));
    } else {
      view = obj.attr("view")(two_bytes ? "uint16" : "uint8");
    }
  } catch (nb::python_error&) {
    return std::nullopt;
  }
  return dtype;
}

template <class Array>
TensorView view_of(const char* name, const Array& a, nb::handle obj, std::optional<DType> tag) {
  if (a.ndim() == 0)
    raise_value(std::string(name) + " is a 0-d tensor (a scalar); kvattn takes tensors of 1 to " +
                std::to_string(TensorView::kMaxDims) + " dimensions");
  if (a.ndim() > size_t(TensorView::kMaxDims))
    raise_value(std::string(name) + " has " + std::to_string(a.ndim()) +
                " dimensions; kvattn takes 1 to " + std::to_string(TensorView::kMaxDims));
  DType dtype;
  if (tag) {
    dtype = *tag;
  } else if (auto d = dtype_of(a.dtype())) {
    dtype = *d;
  } else {
    raise_dtype(std::string(name) + " has dtype " + source_dtype(obj, a.dtype()) +
                ", which kvattn does not take (f32, f16, bf16, e4m3, e5m2; int32 for indices, "
                "uint8 for masks)");
  }
  Device device;
  switch (a.device_type()) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value: device = Device::cpu(); break;
    case nb::device::cuda::value:
    case nb::device::cuda_managed::value: device = Device::cuda(a.device_id()); break;
    default:
      raise_value(std::string(name) + " is on DLPack device type " + std::to_string(a.device_type()) +
                  ", which kvattn does not take (cpu or cuda)");
  }
  // An empty tensor's strides mean nothing, and producers export anything for them (numpy: all 0):
  // give it row-major strides so that stride rules (a contiguous head dim) hold.
  // (Empty: a size of 0 along some dim. Not a.size() == 0: nanobind multiplies the sizes without an
  // overflow check, and 2^32 x 2^32 elements wrap to 0; TensorView rejects such a view itself.)
  int64_t strides[TensorView::kMaxDims];
  const int64_t* stride_ptr = a.stride_ptr();
  bool empty = false;
  for (size_t d = 0; d < a.ndim(); ++d) empty |= a.shape_ptr()[d] == 0;
  if (empty) {
    int64_t step = 1;
    for (int d = int(a.ndim()) - 1; d >= 0; --d) {
      strides[d] = step;
      if (__builtin_mul_overflow(step, std::max<int64_t>(1, a.shape_ptr()[d]), &step))
        step = INT64_MAX;  // an empty view's strides are never walked
    }
    stride_ptr = strides;
  }
  try {
    return TensorView(static_cast<const void*>(a.data()), dtype, int(a.ndim()), a.shape_ptr(),
                      stride_ptr, device);
  } catch (const Error& e) {  // the view's own checks (negative strides, ...): say which argument
    raise_value(std::string(name) + ": " + e.what());
  }
}
}  // namespace

PyObject* error_type() { return g_error; }
PyObject* dtype_error_type() { return g_dtype_error; }

void register_errors(nb::module_& m) {
  g_error = PyErr_NewExceptionWithDoc(
      "kvattn.Error",
      "A bad argument to kvattn (the C++ kvattn::Error): the message names the argument and the "
      "value. A ValueError.",
      PyExc_ValueError, nullptr);
  PyObject* bases = PyTuple_Pack(2, g_error, PyExc_TypeError);
  g_dtype_error = PyErr_NewExceptionWithDoc(
      "kvattn.DTypeError",
      "A kvattn.Error about a dtype (an unsupported dtype, or one that does not match the plan): "
      "both a ValueError and a TypeError.",
      bases, nullptr);
  Py_DECREF(bases);
  m.attr("Error") = nb::handle(g_error);
  m.attr("DTypeError") = nb::handle(g_dtype_error);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(is_dtype_message(e.what()) ? g_dtype_error : g_error, e.what());
    }
  });
}

void raise_value(const std::string& message) {
  PyErr_SetString(g_error, message.c_str());
  throw nb::python_error();
}

void raise_dtype(const std::string& message) {
  PyErr_SetString(g_dtype_error, message.c_str());
  throw nb::python_error();
}

const TensorView& tensor_arg(const char* name, nb::handle obj, Held& held, bool writable,
                             bool optional) {
  if (obj.is_none()) {
    if (!optional) raise_value(std::string(name) + " is required (got None)");
    held.view = {};
    return held.view;
  }
  auto import = [&](nb::handle src) {
    return writable ? nb::try_cast(src, held.rw, false) : nb::try_cast(src, held.ro, false);
  };
  std::optional<DType> tag;
  nb::handle src = obj;
  // torch tensors: their C-level exporter (torch.utils.dlpack.to_dlpack) rather than the Python
  // method Tensor.__dlpack__ that nanobind would call (a few microseconds of Python per tensor).
  if (PyObject* exporter = torch_to_dlpack(obj)) {
    PyObject* capsule = PyObject_CallOneArg(exporter, obj.ptr());
    if (capsule) {
      held.object = nb::steal(capsule);
      if (import(held.object)) {
        held.view = writable ? view_of(name, held.rw, obj, tag) : view_of(name, held.ro, obj, tag);
        return held.view;
      }
    }
    PyErr_Clear();  // e.g. fp8 on a torch without DLPack fp8: the general path below
  }
  if (!import(src)) {
    tag = integer_view(obj, held.object);
    if (tag) src = held.object;
    if (!tag || !import(src)) {
      nb::ndarray<nb::ro> probe;
      if (writable && nb::try_cast(src, probe, false))
        raise_value(std::string(name) + " is read-only; an output must be writable");
      if (!tag && nb::hasattr(obj, "dtype") &&
          (nb::hasattr(obj, "__dlpack__") || PyObject_CheckBuffer(obj.ptr()))) {
        std::string dt = str_of(obj.attr("dtype"));
        raise_dtype(std::string(name) + " has dtype " + dt +
                    ", which kvattn does not take (f32, f16, bf16, e4m3, e5m2; int32 for indices, "
                    "uint8 for masks)");
      }
      PyErr_Format(PyExc_TypeError,
                   "%s: expected a tensor (an object with __dlpack__ or the buffer protocol: numpy, "
                   "torch, cupy, ...), got %s",
                   name, py_type_name(obj).c_str());
      throw nb::python_error();
    }
  }
  held.view = writable ? view_of(name, held.rw, src, tag) : view_of(name, held.ro, src, tag);
  return held.view;
}

const TensorView& index_arg(const char* name, nb::handle obj, Held& held, bool optional) {
  if (PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr())) {
    nb::sequence seq = nb::borrow<nb::sequence>(obj);
    const size_t n = nb::len(seq);
    held.list.resize(n);
    for (size_t i = 0; i < n; ++i) {
      int64_t x = 0;
      if (!nb::try_cast(seq[i], x, false))
        raise_dtype(std::string(name) + "[" + std::to_string(i) + "] is a " + py_type_name(seq[i]) +
                    ", not an int");
      if (x < INT32_MIN || x > INT32_MAX)
        raise_value(std::string(name) + "[" + std::to_string(i) + "] = " + std::to_string(x) +
                    " does not fit in int32");
      held.list[i] = int32_t(x);
    }
    const int64_t shape[1] = {int64_t(n)};
    const int64_t strides[1] = {1};
    held.view = TensorView(held.list.data(), DType::i32, 1, shape, strides, Device::cpu());
    return held.view;
  }
  return tensor_arg(name, obj, held, false, optional);
}

DType dtype_arg(const char* name, nb::handle obj) {
  if (nb::isinstance<DType>(obj)) return nb::cast<DType>(obj);
  std::string text;
  if (nb::isinstance<nb::str>(obj)) {
    text = nb::cast<std::string>(obj);
  } else if (PyType_Check(obj.ptr()) && nb::hasattr(obj, "__name__")) {  // np.float16, ml_dtypes.bfloat16
    text = nb::cast<std::string>(obj.attr("__name__"));
  } else {  // numpy dtype objects ("float16"), torch dtypes ("torch.float16")
    text = str_of(obj);
    if (text.rfind("torch.", 0) == 0) text = text.substr(6);
  }
  try {
    return parse_dtype(text);
  } catch (const Error& e) {
    raise_dtype(std::string(name) + ": " + e.what());
  }
}

std::optional<DType> optional_dtype_arg(const char* name, nb::handle obj) {
  if (obj.is_none()) return std::nullopt;
  return dtype_arg(name, obj);
}

KVLayout layout_arg(nb::handle obj) {
  if (nb::isinstance<KVLayout>(obj)) return nb::cast<KVLayout>(obj);
  if (nb::isinstance<nb::str>(obj)) {
    std::string s = nb::cast<std::string>(obj);
    for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
    if (s == "NHD") return KVLayout::NHD;
    if (s == "HND") return KVLayout::HND;
    raise_value("kv_layout = '" + nb::cast<std::string>(obj) + "' is not a layout (NHD or HND)");
  }
  PyErr_Format(PyExc_TypeError, "kv_layout: expected 'NHD', 'HND' or kvattn.KVLayout, got %s",
               py_type_name(obj).c_str());
  throw nb::python_error();
}

nb::object empty_like_framework(const char* like_name, nb::handle like,
                                std::initializer_list<int64_t> shape, DType dtype) {
  nb::list dims;
  for (int64_t s : shape) dims.append(s);
  return frameworks().attr("empty")(like, nb::tuple(dims), std::string(dtype_name(dtype)),
                                    std::string(like_name));
}

void* stream_arg(nb::handle stream, nb::handle like, const TensorView& view) {
  if (!view.defined() || view.device().is_cpu()) return nullptr;
  nb::object s = nb::borrow(stream);
  if (s.is_none()) s = frameworks().attr("current_stream")(like);
  if (!PyLong_Check(s.ptr())) {
    if (nb::hasattr(s, "cuda_stream")) s = s.attr("cuda_stream");      // torch.cuda.Stream
    else if (nb::hasattr(s, "ptr")) s = s.attr("ptr");                 // cupy.cuda.Stream
  }
  if (!PyLong_Check(s.ptr())) {
    PyErr_Format(PyExc_TypeError,
                 "stream: expected None, an int (a cudaStream_t), a torch.cuda.Stream or a cupy "
                 "stream, got %s",
                 py_type_name(stream).c_str());
    throw nb::python_error();
  }
  void* p = PyLong_AsVoidPtr(s.ptr());
  if (PyErr_Occurred()) throw nb::python_error();
  return p;
}

PagedKVCache paged_cache_arg(nb::handle kv, nb::handle v, KVLayout layout, Held& hk, Held& hv,
                             bool writable) {
  if (!v.is_none())
    return PagedKVCache::split(tensor_arg("paged k", kv, hk, writable),
                               tensor_arg("paged v", v, hv, writable), layout);
  if (PyTuple_Check(kv.ptr()) || PyList_Check(kv.ptr())) {
    nb::sequence seq = nb::borrow<nb::sequence>(kv);
    if (nb::len(seq) != 2)
      raise_value("paged_kv_cache: a tuple must be (k_cache, v_cache), got " +
                  std::to_string(nb::len(seq)) + " items");
    // The sequence keeps its items alive for the call.
    nb::handle k = PySequence_Fast_GET_ITEM(kv.ptr(), 0), vv = PySequence_Fast_GET_ITEM(kv.ptr(), 1);
    return PagedKVCache::split(tensor_arg("paged k", k, hk, writable),
                               tensor_arg("paged v", vv, hv, writable), layout);
  }
  return PagedKVCache::combined(tensor_arg("paged kv", kv, hk, writable), layout);
}

}  // namespace kvattn::py
