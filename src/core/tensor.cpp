#include "kvattn/tensor.h"

#include "kvattn/dlpack.h"

#include <sstream>

#include "kvattn/error.h"

namespace kvattn {

std::string Device::str() const {
  return kind == DeviceKind::cpu ? std::string("cpu") : "cuda:" + std::to_string(index);
}

DType parse_dtype(std::string_view n) {
  if (n == "f32" || n == "fp32" || n == "float32") return DType::f32;
  if (n == "f16" || n == "fp16" || n == "float16") return DType::f16;
  if (n == "bf16" || n == "bfloat16") return DType::bf16;
  if (n == "e4m3" || n == "fp8_e4m3" || n == "float8_e4m3fn") return DType::e4m3;
  if (n == "e5m2" || n == "fp8_e5m2" || n == "float8_e5m2") return DType::e5m2;
  if (n == "i32" || n == "int32") return DType::i32;
  if (n == "u8" || n == "uint8") return DType::u8;
  detail::throw_error("unknown dtype '", n, "' (expected f32, f16, bf16, e4m3, e5m2, i32 or u8)");
}

// Shapes must be >= 0 and strides >= 0, and every element's byte offset (and the element count)
// must fit in int64 and in the address space from `data` on: a view that passes can be walked
// with int64 arithmetic without overflow, so no later check reads outside it by wrapping around.
void TensorView::check_extent() const {
  for (int d = 0; d < ndim_; ++d) {
    KVATTN_CHECK(shape_[d] >= 0, "a tensor view has shape[", d, "] = ", shape_[d],
                 "; sizes must be >= 0 (", describe(), ")");
    KVATTN_CHECK(strides_[d] >= 0, "a tensor view has stride[", d, "] = ", strides_[d],
                 "; kvattn takes strides >= 0 (", describe(), "; pass a copy of a flipped array)");
  }
  int64_t n = 1;
  for (int d = 0; d < ndim_; ++d)
    KVATTN_CHECK(!__builtin_mul_overflow(n, shape_[d], &n), "a tensor view of ", describe(),
                 " has more elements than int64 can count");
  if (n == 0) return;
  const int64_t esz = int64_t(dtype_size(dtype_));
  int64_t last = 0;  // byte offset of the last element
  for (int d = 0; d < ndim_; ++d) {
    int64_t step = 0;
    KVATTN_CHECK(!__builtin_mul_overflow(shape_[d] - 1, strides_[d], &step) &&
                     !__builtin_mul_overflow(step, esz, &step) &&
                     !__builtin_add_overflow(last, step, &last),
                 "a tensor view of ", describe(), " spans more bytes than int64 can address");
  }
  KVATTN_CHECK(uint64_t(last) + uint64_t(esz) <= UINTPTR_MAX - reinterpret_cast<uintptr_t>(data_),
               "a tensor view of ", describe(), " at address ", data_,
               " runs past the end of the address space");
}

int64_t TensorView::extent_bytes() const {
  if (ndim_ == 0 || numel() == 0) return 0;
  int64_t last = 0;
  for (int d = 0; d < ndim_; ++d) last += (shape_[d] - 1) * strides_[d];
  return (last + 1) * int64_t(dtype_size(dtype_));
}

TensorView::TensorView(const void* data, DType dtype, std::initializer_list<int64_t> shape,
                       Device device)
    : data_(const_cast<void*>(data)), dtype_(dtype), device_(device), ndim_(int(shape.size())) {
  KVATTN_CHECK(ndim_ >= 1 && ndim_ <= kMaxDims, "a tensor view has 1 to ", kMaxDims,
               " dimensions, got ", ndim_);
  int d = 0;
  for (int64_t s : shape) shape_[d++] = s;
  fill_contiguous_strides();
  check_extent();
}

// Row-major strides; a product past int64 leaves the later strides at 0 and check_extent() (which
// counts the elements first) rejects the view.
void TensorView::fill_contiguous_strides() {
  int64_t stride = 1;
  for (int i = ndim_ - 1; i >= 0; --i) {
    strides_[i] = stride;
    if (stride != 0 && __builtin_mul_overflow(stride, shape_[i] < 0 ? 0 : shape_[i], &stride)) stride = 0;
  }
}

TensorView::TensorView(const void* data, DType dtype, std::initializer_list<int64_t> shape,
                       std::initializer_list<int64_t> strides, Device device)
    : TensorView(data, dtype, shape, device) {
  KVATTN_CHECK(strides.size() == shape.size(), "a tensor view needs one stride per dimension: ",
               shape.size(), " dimensions, ", strides.size(), " strides");
  int d = 0;
  for (int64_t s : strides) strides_[d++] = s;
  check_extent();
}

TensorView::TensorView(const void* data, DType dtype, int ndim, const int64_t* shape,
                       const int64_t* strides, Device device)
    : data_(const_cast<void*>(data)), dtype_(dtype), device_(device), ndim_(ndim) {
  KVATTN_CHECK(ndim >= 1 && ndim <= kMaxDims, "a tensor view has 1 to ", kMaxDims,
               " dimensions, got ", ndim);
  for (int i = 0; i < ndim; ++i) shape_[i] = shape[i];
  fill_contiguous_strides();
  if (strides)
    for (int i = 0; i < ndim; ++i) strides_[i] = strides[i];
  check_extent();
}

int64_t TensorView::numel() const {
  if (ndim_ == 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= shape_[i];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int i = ndim_ - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    // The product can pass int64 (an empty view's other sizes, or a view being rejected by
    // check_extent() and described): no stride can equal it, so only sizes of 1 may follow.
    if (__builtin_mul_overflow(expected, shape_[i], &expected)) {
      for (int j = i - 1; j >= 0; --j)
        if (shape_[j] != 1) return false;
      return true;
    }
  }
  return true;
}

TensorView TensorView::select(int64_t i) const {
  KVATTN_CHECK(ndim_ >= 2, "select() needs a view of at least 2 dimensions");
  KVATTN_CHECK(i >= 0 && i < shape_[0], "select(", i, ") is out of range [0, ", shape_[0], ")");
  auto p = static_cast<char*>(data_) + i * strides_[0] * int64_t(dtype_size(dtype_));
  return TensorView(p, dtype_, ndim_ - 1, shape_.data() + 1, strides_.data() + 1, device_);
}

std::string TensorView::describe() const {
  std::ostringstream os;
  os << dtype_name(dtype_) << "[";
  for (int i = 0; i < ndim_; ++i) os << (i ? ", " : "") << shape_[i];
  os << "]";
  if (!is_contiguous()) {
    os << " strides (";
    for (int i = 0; i < ndim_; ++i) os << (i ? ", " : "") << strides_[i];
    os << ")";
  }
  os << " on " << device_.str();
  return os.str();
}

// ---- DLPack ---------------------------------------------------------------------------------
// Type codes of DLPack 1.1 for fp8 (the Debian header is 0.6 and predates them).
namespace {
constexpr uint8_t kDLFloat8_e4m3fn = 10;
constexpr uint8_t kDLFloat8_e5m2 = 12;

DType dtype_from_dl(DLDataType t) {
  KVATTN_CHECK(t.lanes == 1, "DLPack tensors with ", t.lanes, " lanes are not supported");
  if (t.code == kDLFloat && t.bits == 32) return DType::f32;
  if (t.code == kDLFloat && t.bits == 16) return DType::f16;
  if (t.code == kDLBfloat && t.bits == 16) return DType::bf16;
  if (t.code == kDLFloat8_e4m3fn && t.bits == 8) return DType::e4m3;
  if (t.code == kDLFloat8_e5m2 && t.bits == 8) return DType::e5m2;
  if (t.code == kDLInt && t.bits == 32) return DType::i32;
  if (t.code == kDLUInt && t.bits == 8) return DType::u8;
  detail::throw_error("DLPack dtype (code ", int(t.code), ", bits ", int(t.bits),
                      ") is not supported by kvattn");
}

DLDataType dtype_to_dl(DType t) {
  switch (t) {
    case DType::f32: return {kDLFloat, 32, 1};
    case DType::f16: return {kDLFloat, 16, 1};
    case DType::bf16: return {kDLBfloat, 16, 1};
    case DType::e4m3: return {kDLFloat8_e4m3fn, 8, 1};
    case DType::e5m2: return {kDLFloat8_e5m2, 8, 1};
    case DType::i32: return {kDLInt, 32, 1};
    case DType::u8: return {kDLUInt, 8, 1};
  }
  return {kDLFloat, 32, 1};
}

struct DLPackHolder {
  DLManagedTensor managed;
  int64_t shape[TensorView::kMaxDims];
  int64_t strides[TensorView::kMaxDims];
};
}  // namespace

TensorView from_dlpack(const DLTensor& t) {
  Device dev;
  if (t.device.device_type == kDLCPU || t.device.device_type == kDLCUDAHost) {
    dev = Device::cpu();
  } else if (t.device.device_type == kDLCUDA || t.device.device_type == kDLCUDAManaged) {
    dev = Device::cuda(t.device.device_id);
  } else {
    detail::throw_error("DLPack device type ", int(t.device.device_type),
                        " is not supported (cpu or cuda)");
  }
  DType dtype = dtype_from_dl(t.dtype);
  KVATTN_CHECK(t.ndim >= 1 && t.ndim <= TensorView::kMaxDims, "DLPack tensor has ", t.ndim,
               " dimensions; kvattn takes 1 to ", TensorView::kMaxDims);
  auto data = static_cast<char*>(t.data) + t.byte_offset;
  return TensorView(data, dtype, t.ndim, t.shape, t.strides, dev);
}

DLManagedTensor* to_dlpack(const TensorView& v) {
  KVATTN_CHECK(v.defined(), "to_dlpack: the view is empty");
  auto* h = new DLPackHolder{};
  for (int i = 0; i < v.ndim(); ++i) {
    h->shape[i] = v.size(i);
    h->strides[i] = v.stride(i);
  }
  DLTensor& t = h->managed.dl_tensor;
  t.data = v.data();
  t.device = v.device().is_cpu() ? DLDevice{kDLCPU, 0} : DLDevice{kDLCUDA, v.device().index};
  t.ndim = v.ndim();
  t.dtype = dtype_to_dl(v.dtype());
  t.shape = h->shape;
  t.strides = h->strides;
  t.byte_offset = 0;
  h->managed.manager_ctx = h;
  h->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<DLPackHolder*>(self->manager_ctx);
  };
  return &h->managed;
}

}  // namespace kvattn
