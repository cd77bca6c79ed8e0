// Shared pieces of the Python extension kvattn._kvattn: DLPack producers to kvattn::TensorView
// (no copies), dtype and stream arguments, outputs allocated in the input's framework, and the
// exceptions (kvattn.Error is a ValueError; kvattn.DTypeError is also a TypeError).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "kvattn/kvattn.h"

namespace kvattn::py {

namespace nb = nanobind;

// ---- exceptions -------------------------------------------------------------------------------
// Created by register_errors(); every kvattn::Error raised below the bindings becomes one of them.
PyObject* error_type();        // kvattn.Error(ValueError)
PyObject* dtype_error_type();  // kvattn.DTypeError(kvattn.Error, TypeError)
void register_errors(nb::module_& m);

// Raised from the bindings themselves (argument kinds the C++ API never sees).
[[noreturn]] void raise_value(const std::string& message);
[[noreturn]] void raise_dtype(const std::string& message);

// The Python type's name of obj, for messages.
inline std::string py_type_name(nb::handle obj) { return Py_TYPE(obj.ptr())->tp_name; }

// ---- tensors ----------------------------------------------------------------------------------
// Holds what a tensor argument needs alive for the duration of one call: the Python object (or
// the integer view of an ml_dtypes / fp8 array), nanobind's DLPack import, or the int32 copy of a
// Python list of indices.
struct Held {
  nb::object object;
  nb::ndarray<nb::ro> ro;
  nb::ndarray<> rw;
  std::vector<int32_t> list;
  TensorView view;
};

// kvattn.Variant: kvattn::Variant, and the Python owners of its user variant's tensors. Their views
// are in custom_values and the hooks read them at run(), so the Variant keeps them alive (and a
// wrapper keeps the Variant of its current plan).
struct PyVariant : Variant {
  struct Owned {
    std::string name;
    nb::object given;           // the object given in tensors= (Variant.custom_tensors)
    std::shared_ptr<Held> held; // its DLPack import: the memory the view points into
  };
  std::vector<Owned> owned;
};

// Any DLPack producer or buffer (numpy, torch, cupy, ...). None gives an undefined view when
// `optional`, a ValueError naming `name` otherwise. `writable`: an output (read-only arrays are
// refused). Arrays whose dtype DLPack cannot carry (numpy with ml_dtypes bfloat16/float8, torch
// float8 on older versions) are viewed as same-sized integers and tagged with the real dtype.
const TensorView& tensor_arg(const char* name, nb::handle obj, Held& held, bool writable = false,
                             bool optional = false);
// An int32 index array: a tensor as above, or a Python list/tuple of ints (copied to the host).
const TensorView& index_arg(const char* name, nb::handle obj, Held& held, bool optional = false);

// dtype arguments: kvattn.DType, "bf16"/"bfloat16"/..., numpy and torch dtypes, ml_dtypes types.
DType dtype_arg(const char* name, nb::handle obj);
std::optional<DType> optional_dtype_arg(const char* name, nb::handle obj);
KVLayout layout_arg(nb::handle obj);

// A new tensor in the framework of `like` (numpy in -> numpy out; torch -> torch on like's device;
// any array-API namespace; numpy for another producer of host memory), through
// kvattn._frameworks.empty. `like_name` names `like` in its error (a producer on a device whose
// framework is unknown).
nb::object empty_like_framework(const char* like_name, nb::handle like,
                                std::initializer_list<int64_t> shape, DType dtype);

// The cudaStream_t for a call on `device`: `stream` as given (an int, or an object with
// .cuda_stream (torch) or .ptr (cupy)), or, when None, the current stream of the framework that
// produced `like` (torch.cuda.current_stream(device)). Null for the CPU.
void* stream_arg(nb::handle stream, nb::handle like, const TensorView& view);

// The paged cache of run() and append: a (k, v) pair, a 5-D [pages, 2, ...] tensor, or k and v as
// two arguments. `writable`: append writes it (a read-only array is refused).
PagedKVCache paged_cache_arg(nb::handle kv, nb::handle v, KVLayout layout, Held& hk, Held& hv,
                             bool writable = false);

// plan()'s and append's page table: a kvattn.PageTable or an (indptr, indices, last_page_len)
// sequence; the arrays are named kv_indptr, kv_indices and kv_last_page_len in errors, after
// `prefix` (CascadeAttention's "level 1: ").
PageTable page_table_arg(nb::handle obj, Held (&h)[3], const std::string& prefix = {});

// Runs `f` without the GIL (the tensors' owners are held by the caller's frame).
template <class F>
void without_gil(F&& f) {
  nb::gil_scoped_release release;
  f();
}

// ---- registration of the binding groups --------------------------------------------------------
void bind_types(nb::module_& m);      // DType, KVLayout, Variant, RopeConfig, scheduler, Plan
void bind_attention(nb::module_& m);  // BatchDecode, BatchPrefill, BlockSparseAttention,
                                      // CascadeAttention
void bind_ops(nb::module_& m);        // merge_state(s), append_paged_kv_cache, apply_rope

}  // namespace kvattn::py
