// An owning host buffer with a strided kvattn::TensorView onto it, for test inputs and outputs.
// Optional padding makes the view non-contiguous (a padded head or row stride) and puts guard
// elements before, between and after the logical elements; poison() fills every byte with 0xff
// (a NaN in every float dtype) so that unwritten outputs, reads of padding and writes outside the
// view are all detectable.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kvattn/tensor.h"

namespace kvattn_test {

class HostTensor {
 public:
  static constexpr uint8_t kPoisonByte = 0xff;

  HostTensor() = default;
  // Contiguous when pad is empty; otherwise pad[d] extra elements after each index of dim d
  // (d < ndim - 1; the last dim stays contiguous), plus a few guard elements at both ends.
  HostTensor(kvattn::DType dtype, std::vector<int64_t> shape, std::vector<int64_t> pad = {},
             int64_t guard = -1);  // guard elements before the view; -1: 5 when padded
  // Same shape with every non-last dim padded by 1..3 elements (a strided view).
  static HostTensor strided(kvattn::DType dtype, std::vector<int64_t> shape);
  // Padded too, but every stride and the start stay multiples of 16 bytes (what 16-byte vector
  // loads and copies of rows need).
  static HostTensor strided_aligned(kvattn::DType dtype, std::vector<int64_t> shape);

  kvattn::TensorView view() const;
  kvattn::DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t numel() const;
  uint8_t* base() { return bytes_.data() + offset_ * esize(); }
  const uint8_t* base() const { return bytes_.data() + offset_ * esize(); }

  // Element offset (in elements, from base()) of a logical index.
  int64_t offset(std::initializer_list<int64_t> idx) const;
  void set(std::initializer_list<int64_t> idx, double x);      // encoded to dtype
  double get(std::initializer_list<int64_t> idx) const;       // decoded by the tests' decoder
  void set_at(int64_t off, double x);
  double get_at(int64_t off) const;
  bool is_poison_at(int64_t off) const;

  void poison();                 // every byte, padding included, to 0xff
  // The whole buffer (guards and padding included) and where the view starts in it, in bytes: what
  // a device copy of the tensor mirrors.
  const std::vector<uint8_t>& raw_bytes() const { return bytes_; }
  std::vector<uint8_t>& raw_bytes() { return bytes_; }
  int64_t view_byte_offset() const { return offset_ * int64_t(esize()); }
  std::vector<uint8_t> snapshot() const { return bytes_; }
  bool same_bytes(const std::vector<uint8_t>& snap) const { return bytes_ == snap; }
  // How many bytes outside the logical elements are no longer poison (a write outside the view);
  // `first` receives where the first one is.
  int64_t count_dirty_padding(std::string* first = nullptr) const;
  // Visits every logical element: f(offset, index vector).
  template <class F>
  void for_each(F&& f) const {
    const int nd = int(shape_.size());
    std::vector<int64_t> idx(size_t(nd), 0);
    for (int64_t lin = 0, n = numel(); lin < n; ++lin) {
      int64_t rem = lin, off = 0;
      for (int d = nd - 1; d >= 0; --d) {
        idx[size_t(d)] = rem % shape_[size_t(d)];
        rem /= shape_[size_t(d)];
        off += idx[size_t(d)] * strides_[size_t(d)];
      }
      f(off, idx);
    }
  }

 private:
  size_t esize() const;
  kvattn::DType dtype_ = kvattn::DType::f32;
  std::vector<int64_t> shape_, strides_;
  int64_t offset_ = 0;  // guard elements before the view
  std::vector<uint8_t> bytes_;
};

std::string index_str(const std::vector<int64_t>& idx);

}  // namespace kvattn_test
