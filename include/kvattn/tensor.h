// A non-owning view of a strided tensor: pointer, dtype, device, shape, strides (in elements).
// Every tensor crosses kvattn's API this way; DLPack conversion lets torch, numpy, cupy and jax
// arrays pass without copies.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "kvattn/dtype.h"

namespace kvattn {

enum class DeviceKind : uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;

  static constexpr Device cpu() { return {DeviceKind::cpu, 0}; }
  static constexpr Device cuda(int i = 0) { return {DeviceKind::cuda, i}; }
  bool is_cpu() const { return kind == DeviceKind::cpu; }
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu" or "cuda:N"
};

class TensorView {
 public:
  static constexpr int kMaxDims = 6;

  TensorView() = default;
  // Every constructor checks the view (kvattn::Error otherwise): sizes >= 0, strides >= 0, and the
  // element count and every element's byte offset within int64 and the address space. A stride
  // of 0 (broadcast) is allowed for inputs; outputs are checked for self-overlap where they are
  // used.
  // Contiguous (row-major) view.
  TensorView(const void* data, DType dtype, std::initializer_list<int64_t> shape,
             Device device = Device::cpu());
  // Explicit strides, in elements.
  TensorView(const void* data, DType dtype, std::initializer_list<int64_t> shape,
             std::initializer_list<int64_t> strides, Device device = Device::cpu());
  TensorView(const void* data, DType dtype, int ndim, const int64_t* shape, const int64_t* strides,
             Device device = Device::cpu());

  // A default-constructed view is "not given" (optional arguments such as lse).
  bool defined() const { return ndim_ > 0; }
  void* data() const { return data_; }
  template <class T>
  T* data_as() const { return static_cast<T*>(data_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int ndim() const { return ndim_; }
  int64_t size(int dim) const { return shape_[wrap(dim)]; }
  int64_t stride(int dim) const { return strides_[wrap(dim)]; }
  const int64_t* shape() const { return shape_.data(); }
  const int64_t* strides() const { return strides_.data(); }
  int64_t numel() const;
  bool is_contiguous() const;
  // Bytes from data() to the end of the last element (0 for an empty view): the view's elements
  // all lie in [data(), data() + extent_bytes()).
  int64_t extent_bytes() const;
  // The view of index `i` along dimension 0 (one fewer dimension).
  TensorView select(int64_t i) const;
  // "bf16[4, 32, 128] on cpu" (strides shown when not contiguous).
  std::string describe() const;

 private:
  int wrap(int dim) const { return dim < 0 ? dim + ndim_ : dim; }
  void fill_contiguous_strides();
  void check_extent() const;
  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  Device device_{};
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> shape_{};
  std::array<int64_t, kMaxDims> strides_{};
};

}  // namespace kvattn
