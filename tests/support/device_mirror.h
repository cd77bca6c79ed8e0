// A device copy of a HostTensor (guards and padding included, so strides and poison carry over):
// the GPU test cases run the kernels on mirrors and copy the outputs back for the host-side checks.
#pragma once

#if KVATTN_WITH_CUDA

#include <cstdint>

#include "kvattn/tensor.h"
#include "support/host_tensor.h"

namespace kvattn_test {

// Whether the GPU cases can run here; `reason` says why not.
bool gpu_available(std::string* reason = nullptr);

class DeviceMirror {
 public:
  explicit DeviceMirror(const HostTensor& t);
  ~DeviceMirror();
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;

  kvattn::TensorView view() const;  // the HostTensor's view, on cuda:0
  void copy_back(HostTensor& t) const;  // every byte, so writes into padding show up too
  void upload() const;                   // the HostTensor's bytes again (e.g. re-poisoned outputs)

 private:
  const HostTensor* host_;
  uint8_t* device_ = nullptr;
  size_t bytes_ = 0;
};

// A device byte buffer for workspaces.
class DeviceBytes {
 public:
  explicit DeviceBytes(int64_t n);
  ~DeviceBytes();
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  kvattn::TensorView view() const;

 private:
  void* ptr_ = nullptr;
  int64_t n_ = 0;
};

void device_synchronize();

}  // namespace kvattn_test

#endif
