#include "support/device_mirror.h"

#if KVATTN_WITH_CUDA

#include <cuda_runtime_api.h>

#include "cuda/runtime.h"

namespace kvattn_test {

bool gpu_available(std::string* reason) { return kvattn::cuda::cuda_available(reason); }

DeviceMirror::DeviceMirror(const HostTensor& t) : host_(&t), bytes_(t.raw_bytes().size()) {
  kvattn::cuda::check(cudaMalloc(reinterpret_cast<void**>(&device_), bytes_ ? bytes_ : 1), "cudaMalloc");
  kvattn::cuda::check(cudaMemcpy(device_, t.raw_bytes().data(), bytes_, cudaMemcpyHostToDevice),
                      "copying a test tensor to the device");
}

DeviceMirror::~DeviceMirror() { cudaFree(device_); }

void DeviceMirror::upload() const {
  kvattn::cuda::check(cudaMemcpy(device_, host_->raw_bytes().data(), bytes_, cudaMemcpyHostToDevice),
                      "copying a test tensor to the device");
}

kvattn::TensorView DeviceMirror::view() const {
  kvattn::TensorView h = host_->view();
  return kvattn::TensorView(device_ + host_->view_byte_offset(), h.dtype(), h.ndim(), h.shape(),
                            h.strides(), kvattn::Device::cuda(0));
}

void DeviceMirror::copy_back(HostTensor& t) const {
  kvattn::cuda::check(cudaMemcpy(t.raw_bytes().data(), device_, bytes_, cudaMemcpyDeviceToHost),
                      "copying a test tensor back from the device");
}

DeviceBytes::DeviceBytes(int64_t n) : n_(n) {
  kvattn::cuda::check(cudaMalloc(&ptr_, size_t(n)), "cudaMalloc (workspace)");
}
DeviceBytes::~DeviceBytes() { cudaFree(ptr_); }
kvattn::TensorView DeviceBytes::view() const {
  return kvattn::TensorView(ptr_, kvattn::DType::u8, {n_}, kvattn::Device::cuda(0));
}

void device_synchronize() { kvattn::cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

}  // namespace kvattn_test

#endif
