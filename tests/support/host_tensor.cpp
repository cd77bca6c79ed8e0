#include "support/host_tensor.h"

#include <cstring>

#include "support/dtype_codec.h"

namespace kvattn_test {

HostTensor::HostTensor(kvattn::DType dtype, std::vector<int64_t> shape, std::vector<int64_t> pad,
                       int64_t guard)
    : dtype_(dtype), shape_(std::move(shape)) {
  const size_t n = shape_.size();
  pad.resize(n, 0);
  pad[n - 1] = 0;
  bool padded = false;
  for (int64_t p : pad) padded |= p != 0;
  strides_.assign(n, 1);
  for (int d = int(n) - 2; d >= 0; --d)
    strides_[size_t(d)] = strides_[size_t(d) + 1] * shape_[size_t(d) + 1] + pad[size_t(d)];
  offset_ = guard >= 0 ? guard : padded ? 5 : 0;
  int64_t extent = 1;  // one past the last element
  for (size_t d = 0; d < n; ++d) extent += (shape_[d] - 1) * strides_[d];
  if (numel() == 0) extent = 0;
  int64_t total = offset_ + extent + (padded ? 7 : 0);
  bytes_.assign(size_t(total) * esize() + 1, 0);  // +1: never a zero-sized buffer
}

HostTensor HostTensor::strided(kvattn::DType dtype, std::vector<int64_t> shape) {
  std::vector<int64_t> pad(shape.size(), 0);
  for (size_t d = 0; d + 1 < shape.size(); ++d) pad[d] = 1 + int64_t(d % 3);
  return HostTensor(dtype, std::move(shape), std::move(pad));
}

HostTensor HostTensor::strided_aligned(kvattn::DType dtype, std::vector<int64_t> shape) {
  const int64_t a = 16 / int64_t(kvattn::dtype_size(dtype));
  std::vector<int64_t> pad(shape.size(), 0);
  for (size_t d = 0; d + 1 < shape.size(); ++d) pad[d] = a * (1 + int64_t(d % 3));
  return HostTensor(dtype, std::move(shape), std::move(pad), a);
}

size_t HostTensor::esize() const { return kvattn::dtype_size(dtype_); }

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape_) n *= s;
  return n;
}

kvattn::TensorView HostTensor::view() const {
  return kvattn::TensorView(base(), dtype_, int(shape_.size()), shape_.data(), strides_.data());
}

int64_t HostTensor::offset(std::initializer_list<int64_t> idx) const {
  int64_t off = 0;
  size_t d = 0;
  for (int64_t i : idx) off += i * strides_[d++];
  return off;
}

void HostTensor::set(std::initializer_list<int64_t> idx, double x) { set_at(offset(idx), x); }
double HostTensor::get(std::initializer_list<int64_t> idx) const { return get_at(offset(idx)); }
void HostTensor::set_at(int64_t off, double x) {
  if (dtype_ == kvattn::DType::i32) {
    int32_t v = int32_t(x);
    std::memcpy(base() + off * 4, &v, 4);
  } else if (dtype_ == kvattn::DType::u8) {
    base()[off] = uint8_t(x);
  } else {
    encode(base(), dtype_, off, x);
  }
}
double HostTensor::get_at(int64_t off) const {
  if (dtype_ == kvattn::DType::i32) {
    int32_t v;
    std::memcpy(&v, base() + off * 4, 4);
    return v;
  }
  if (dtype_ == kvattn::DType::u8) return base()[off];
  return decode(base(), dtype_, off);
}
bool HostTensor::is_poison_at(int64_t off) const {
  for (size_t b = 0; b < esize(); ++b)
    if (base()[size_t(off) * esize() + b] != kPoisonByte) return false;
  return true;
}

void HostTensor::poison() { std::memset(bytes_.data(), kPoisonByte, bytes_.size()); }

int64_t HostTensor::count_dirty_padding(std::string* first) const {
  std::vector<char> logical(bytes_.size(), 0);
  for_each([&](int64_t off, const std::vector<int64_t>&) {
    for (size_t b = 0; b < esize(); ++b) logical[size_t(offset_ + off) * esize() + b] = 1;
  });
  int64_t dirty = 0;
  for (size_t i = 0; i < bytes_.size(); ++i) {
    if (logical[i] || bytes_[i] == kPoisonByte) continue;
    if (dirty++ == 0 && first) *first = "byte " + std::to_string(i) + " of the buffer";
  }
  return dirty;
}

std::string index_str(const std::vector<int64_t>& idx) {
  std::string s = "[";
  for (size_t i = 0; i < idx.size(); ++i) s += (i ? ", " : "") + std::to_string(idx[i]);
  return s + "]";
}

}  // namespace kvattn_test
