// The CUDA runtime layer: device discovery, error checks, device selection. Runtime API only
// (cudart_static loads the driver lazily), so on a machine without a driver the library still
// loads and every call here reports "no CUDA device: <reason>" instead of failing to start.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "cuda/device_limits.h"

namespace kvattn::cuda {

// What the kernels' dispatch needs, read once per device.
struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  std::string arch;  // NVRTC target of this device: "sm_90a" on Hopper, else "sm_<major><minor>"
  int sm_count = 0;
  size_t max_smem_per_block_optin = 0;  // bytes a kernel may use after cudaFuncSetAttribute
  size_t smem_per_sm = 0;
  size_t reserved_smem_per_block = 0;  // the runtime's share of each block's shared memory
  size_t l2_bytes = 0;
  size_t global_mem_bytes = 0;
};

// The device's limits as the kernel choices take them (cuda/device_limits.h).
DeviceLimits limits_of(const DeviceInfo& device);

// Whether at least one CUDA device can be used. Never throws; the first call probes the driver
// (cudaGetDeviceCount) and caches the answer. When false, `reason` receives why.
bool cuda_available(std::string* reason = nullptr);
int device_count();  // 0 when cuda_available() is false

// Throws kvattn::Error "no CUDA device: <reason>" when cuda_available() is false.
void require_cuda(const char* what);

// Cached after the first call per device; throws for an index out of range or without a device.
const DeviceInfo& device_info(int index);
int current_device();  // cudaGetDevice, checked

// The NVRTC arch string for a compute capability: 9.0 -> "sm_90a" (wgmma/TMA need the
// arch-specific target), 8.0 -> "sm_80", 8.9 -> "sm_89", 12.0 -> "sm_120".
std::string arch_for(int cc_major, int cc_minor);

// Throws kvattn::Error "CUDA error while <what>: <name> (<description>)" unless err == cudaSuccess.
// Clears the runtime's per-thread last error so a later check does not report it again.
void check(cudaError_t err, const char* what);

// Makes `index` the current device for a scope, restoring the previous one (the caller's).
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace kvattn::cuda

#define KVATTN_CUDA_CHECK(expr) ::kvattn::cuda::check((expr), #expr)
