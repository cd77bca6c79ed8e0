#include "cuda/runtime.h"

#include <memory>
#include <mutex>
#include <vector>

#include "kvattn/error.h"

namespace kvattn::cuda {
namespace {

struct Probe {
  int count = 0;
  std::string reason;
};

// cudaGetDeviceCount is the first runtime call: it loads libcuda.so.1 (dlopen) and reports
// cudaErrorInsufficientDriver / cudaErrorNoDevice when there is none. Probed once per process.
const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    cudaError_t err = cudaGetDeviceCount(&r.count);
    if (err != cudaSuccess) {
      r.count = 0;
      r.reason = std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
      cudaGetLastError();  // not sticky, but leave no pending error behind
    } else if (r.count == 0) {
      r.reason = "cudaGetDeviceCount found no device";
    }
    return r;
  }();
  return p;
}

int attribute(cudaDeviceAttr attr, int device, const char* what) {
  int value = 0;
  check(cudaDeviceGetAttribute(&value, attr, device), what);
  return value;
}

}  // namespace

bool cuda_available(std::string* reason) {
  const Probe& p = probe();
  if (p.count == 0 && reason) *reason = p.reason;
  return p.count > 0;
}

int device_count() { return probe().count; }

void require_cuda(const char* what) {
  std::string reason;
  if (!cuda_available(&reason)) detail::throw_error("no CUDA device: ", reason, " (needed for ", what, ")");
}

std::string arch_for(int cc_major, int cc_minor) {
  std::string arch = "sm_" + std::to_string(cc_major) + std::to_string(cc_minor);
  if (cc_major == 9 && cc_minor == 0) arch += "a";
  return arch;
}

void check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  cudaGetLastError();
  detail::throw_error("CUDA error while ", what, ": ", cudaGetErrorName(err), " (",
                      cudaGetErrorString(err), ")");
}

const DeviceInfo& device_info(int index) {
  require_cuda("device_info");
  int n = device_count();
  KVATTN_CHECK(index >= 0 && index < n, "cuda:", index, " does not exist (", n, " CUDA devices)");
  // One slot per device, filled on first use; the pointers stay valid for the process.
  static std::mutex mutex;
  static std::vector<std::unique_ptr<DeviceInfo>> cache(n);
  std::lock_guard lock(mutex);
  if (!cache[index]) {
    auto d = std::make_unique<DeviceInfo>();
    d->index = index;
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, index), "reading the device properties");
    d->name = prop.name;
    d->cc_major = prop.major;
    d->cc_minor = prop.minor;
    d->arch = arch_for(prop.major, prop.minor);
    d->sm_count = prop.multiProcessorCount;
    d->max_smem_per_block_optin =
        attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, index, "reading the opt-in shared memory");
    d->smem_per_sm = prop.sharedMemPerMultiprocessor;
    d->reserved_smem_per_block =
        attribute(cudaDevAttrReservedSharedMemoryPerBlock, index, "reading the reserved shared memory");
    d->l2_bytes = prop.l2CacheSize;
    d->global_mem_bytes = prop.totalGlobalMem;
    cache[index] = std::move(d);
  }
  return *cache[index];
}

DeviceLimits limits_of(const DeviceInfo& d) {
  return {d.sm_count, int64_t(d.max_smem_per_block_optin), int64_t(d.smem_per_sm), int64_t(d.reserved_smem_per_block),
          d.cc_major, d.cc_minor};
}

int current_device() {
  require_cuda("current_device");
  int d = 0;
  check(cudaGetDevice(&d), "cudaGetDevice");
  return d;
}

DeviceGuard::DeviceGuard(int index) {
  int cur = current_device();
  if (cur != index) {
    check(cudaSetDevice(index), "selecting the tensor's device");
    previous_ = cur;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);  // best effort: destructors do not throw
}

}  // namespace kvattn::cuda
