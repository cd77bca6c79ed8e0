#include "cuda/append_kernels.h"

#include <mutex>
#include <vector>

#include "cuda/runtime.h"
#include "kvattn/error.h"

namespace kvattn::cuda {

KernelSpec append_paged_spec(const std::string& arch) {
  KernelSpec spec;
  spec.name = "append_paged_kv";
  spec.entry = "kvattn_append_paged_kv";
  spec.arch = arch;
  spec.source = "#include \"kernels/append/append_paged.cuh\"\n"
                "extern \"C\" __global__ void __launch_bounds__(kvattn::kernels::kAppendThreads)\n" +
                spec.entry + "(const kvattn::kernels::AppendParams p) {\n" +
                "  kvattn::kernels::append_paged(p);\n}\n";
  return spec;
}

int copy_width(std::initializer_list<int64_t> values) {
  int w = 16;
  for (int64_t v : values)
    while (w > 1 && v % w != 0) w /= 2;
  return w;
}

void launch_append_paged(const kernels::AppendParams& p, cudaStream_t stream) {
  if (p.num_rows == 0) return;
  KVATTN_CHECK(p.num_rows < (int64_t(1) << 31), "append_paged_kv_cache: ", p.num_rows,
               " rows is too many for one launch (at most 2^31 - 1)");
  const int device = current_device();
  // The loaded kernel per device, looked up once (KernelCache::kernel hashes the spec each call).
  static std::mutex mutex;
  static std::vector<cudaKernel_t> loaded;
  cudaKernel_t k = nullptr;
  {
    std::lock_guard lock(mutex);
    if (size_t(device) < loaded.size()) k = loaded[size_t(device)];
  }
  if (!k) {
    k = KernelCache::global().kernel(append_paged_spec(device_info(device).arch));
    std::lock_guard lock(mutex);
    if (loaded.size() <= size_t(device)) loaded.resize(size_t(device) + 1, nullptr);
    loaded[size_t(device)] = k;
  }
  kernels::AppendParams args = p;
  void* argv[] = {&args};
  check(cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3(unsigned(p.num_rows), 2),
                         dim3(kernels::kAppendThreads), argv, 0, stream),
        "launching append_paged_kv");
}

}  // namespace kvattn::cuda
