#include "core/custom_params.h"

#include <cstring>
#include <sstream>

#include "kvattn/error.h"

namespace kvattn::detail {

namespace {

const char* element_type(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::i32: return "int32_t";
    default: return "uint8_t";
  }
}

int64_t tensor_bytes(int ndim) { return 8 + 16 * int64_t(ndim); }

// Finds `name` in `list` exactly once; the index or -1.
template <class T>
const T* find_value(const std::vector<std::pair<std::string, T>>& list, const std::string& name,
                    const std::string& variant) {
  const T* found = nullptr;
  for (const auto& [n, value] : list)
    if (n == name) {
      KVATTN_CHECK(found == nullptr, "custom variant ", variant, ": parameter ", name, " is given twice");
      found = &value;
    }
  return found;
}

}  // namespace

std::string custom_params_source(const CustomVariant& v) {
  std::ostringstream os, asserts;
  os << "struct Params {\n";
  int64_t offset = 0;
  for (const auto& p : v.f32_params) {
    os << "  alignas(8) float " << p << ";\n";
    asserts << "static_assert(offsetof(Params, " << p << ") == " << offset << ");\n";
    offset += 8;
  }
  for (const auto& p : v.i32_params) {
    os << "  alignas(8) int32_t " << p << ";\n";
    asserts << "static_assert(offsetof(Params, " << p << ") == " << offset << ");\n";
    offset += 8;
  }
  for (const auto& t : v.tensor_params) {
    os << "  ::kvattn::user::Tensor<" << element_type(t.dtype) << ", " << t.ndim << "> " << t.name << ";\n";
    asserts << "static_assert(offsetof(Params, " << t.name << ") == " << offset << ");\n";
    offset += tensor_bytes(t.ndim);
  }
  if (offset == 0) os << "  alignas(8) int32_t unused_;\n";
  // NVRTC has no offsetof: device code checks the size, the host compile every offset too.
  os << "};\n#if !defined(__CUDACC_RTC__)\n" << asserts.str() << "#endif\nstatic_assert(sizeof(Params) == " << (offset == 0 ? 8 : offset) << ");\n";
  return os.str();
}

std::string custom_variant_namespace(const CustomVariant& v, const std::string& resume_file) {
  std::ostringstream os;
  os << "namespace kvattn_user {\nusing ::kvattn::user::Tensor;\nnamespace fast = ::kvattn::user::fast;\n" << custom_params_source(v) << "#line 1 \""
     << v.name << ".variant\"\n" << v.source << "\n#line 1 \"" << resume_file << "\"\n}  // namespace kvattn_user\n";
  return os.str();
}

std::vector<uint64_t> pack_custom_params(const CustomVariant& v, const CustomValues& values, Device device) {
  const std::string& name = v.name;
  auto declared = [&](const std::string& param) {
    for (const auto& p : v.f32_params) if (p == param) return true;
    for (const auto& p : v.i32_params) if (p == param) return true;
    for (const auto& t : v.tensor_params) if (t.name == param) return true;
    return false;
  };
  for (const auto& [n, value] : values.f32)
    KVATTN_CHECK(declared(n), "custom variant ", name, ": a value was given for ", n, ", which is not a declared parameter");
  for (const auto& [n, value] : values.i32)
    KVATTN_CHECK(declared(n), "custom variant ", name, ": a value was given for ", n, ", which is not a declared parameter");
  for (const auto& [n, value] : values.tensors)
    KVATTN_CHECK(declared(n), "custom variant ", name, ": a value was given for ", n, ", which is not a declared parameter");

  std::vector<uint64_t> words;
  for (const auto& p : v.f32_params) {
    const float* value = find_value(values.f32, p, name);
    KVATTN_CHECK(value != nullptr, "custom variant ", name, ": f32 parameter ", p, " has no value (CustomValues::f32)");
    uint64_t w = 0;
    std::memcpy(&w, value, sizeof(float));
    words.push_back(w);
  }
  for (const auto& p : v.i32_params) {
    const int32_t* value = find_value(values.i32, p, name);
    KVATTN_CHECK(value != nullptr, "custom variant ", name, ": i32 parameter ", p, " has no value (CustomValues::i32)");
    uint64_t w = 0;
    std::memcpy(&w, value, sizeof(int32_t));
    words.push_back(w);
  }
  for (const auto& decl : v.tensor_params) {
    const TensorView* t = find_value(values.tensors, decl.name, name);
    KVATTN_CHECK(t != nullptr, "custom variant ", name, ": tensor parameter ", decl.name,
                 " has no value (CustomValues::tensors)");
    KVATTN_CHECK(t->dtype() == decl.dtype, "custom variant ", name, ": tensor parameter ", decl.name, " has dtype ",
                 dtype_name(t->dtype()), " but was declared ", dtype_name(decl.dtype));
    KVATTN_CHECK(t->ndim() == decl.ndim, "custom variant ", name, ": tensor parameter ", decl.name, " has ",
                 t->ndim(), " dimensions but was declared with ", decl.ndim, " (", t->describe(), ")");
    KVATTN_CHECK(t->device() == device, "custom variant ", name, ": tensor parameter ", decl.name, " is on ",
                 t->device().str(), " but the plan computes on ", device.str());
    KVATTN_CHECK(t->numel() == 0 || t->data() != nullptr, "custom variant ", name, ": tensor parameter ",
                 decl.name, " has a null data pointer");
    words.push_back(uint64_t(reinterpret_cast<uintptr_t>(t->data())));
    for (int d = 0; d < decl.ndim; ++d) words.push_back(uint64_t(t->size(d)));
    for (int d = 0; d < decl.ndim; ++d) words.push_back(uint64_t(t->stride(d)));
  }
  if (words.empty()) words.push_back(0);
  return words;
}

}  // namespace kvattn::detail
