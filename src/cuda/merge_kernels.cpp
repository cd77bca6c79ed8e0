#include "cuda/merge_kernels.h"

#include <map>
#include <mutex>
#include <tuple>

#include "cuda/runtime.h"
#include "kvattn/error.h"

namespace kvattn::cuda {
namespace {

// The kernels' DTypeCode (kernels/common/ptx.cuh) is numbered as kvattn::DType.
std::string dtype_code(DType t) {
  KVATTN_CHECK(t == DType::f32 || t == DType::f16 || t == DType::bf16,
               "merging states on the GPU supports f32, f16 and bf16, not ", dtype_name(t));
  return std::to_string(int(t));
}

KernelSpec merge_spec(const char* kind, const char* params, DType in, DType out, const std::string& arch) {
  std::string name = std::string(kind) + "_" + std::string(dtype_name(in));
  if (out != in) name += "_to_" + std::string(dtype_name(out));
  KernelSpec spec;
  spec.name = name;
  spec.entry = "kvattn_" + name;
  spec.arch = arch;
  spec.source = "#include \"kernels/merge/merge_states.cuh\"\n"
                "extern \"C\" __global__ void __launch_bounds__(kvattn::kernels::kMergeThreads)\n" +
                spec.entry + "(const kvattn::kernels::" + params + " p) {\n" +
                "  kvattn::kernels::" + kind + "<" + dtype_code(in) + ", " + dtype_code(out) + ">(p);\n}\n";
  return spec;
}

// The loaded kernel of (kind, in, out) on the current device, looked up once per device and kept
// (KernelCache::kernel hashes the whole spec, a few microseconds, on every call).
cudaKernel_t merge_kernel(int kind, DType in, DType out) {
  const int device = current_device();
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, int>, cudaKernel_t> kernels;
  const auto key = std::tuple{device, kind, int(in), int(out)};
  {
    std::lock_guard lock(mutex);
    if (auto it = kernels.find(key); it != kernels.end()) return it->second;
  }
  const std::string& arch = device_info(device).arch;
  cudaKernel_t k = KernelCache::global().kernel(kind == 0 ? merge_states_spec(in, out, arch)
                                                          : merge_pair_spec(in, out, arch));
  std::lock_guard lock(mutex);
  kernels[key] = k;
  return k;
}

void launch(cudaKernel_t k, int64_t pairs, void* params, cudaStream_t stream, const char* what) {
  const int64_t blocks = (pairs + kernels::kMergeWarpsPerBlock - 1) / kernels::kMergeWarpsPerBlock;
  KVATTN_CHECK(blocks < (int64_t(1) << 31), what, ": ", pairs, " (row, head) pairs is too many");
  void* args[] = {params};
  // A cudaKernel_t is accepted wherever the runtime takes a `const void* func`.
  check(cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3(unsigned(blocks)),
                         dim3(kernels::kMergeThreads), args, 0, stream),
        what);
}

}  // namespace

KernelSpec merge_states_spec(DType in, DType out, const std::string& arch) {
  return merge_spec("merge_states", "MergeStatesParams", in, out, arch);
}

KernelSpec merge_pair_spec(DType in, DType out, const std::string& arch) {
  return merge_spec("merge_pair", "MergePairParams", in, out, arch);
}

void launch_merge_states(const kernels::MergeStatesParams& p, DType in, DType out, cudaStream_t stream) {
  const int64_t pairs = p.num_rows * p.num_heads;
  if (pairs == 0) return;
  kernels::MergeStatesParams args = p;
  launch(merge_kernel(0, in, out), pairs, &args, stream, "launching merge_states");
}

void launch_merge_pair(const kernels::MergePairParams& p, DType in, DType out, cudaStream_t stream) {
  const int64_t pairs = p.num_rows * p.num_heads;
  if (pairs == 0) return;
  kernels::MergePairParams args = p;
  launch(merge_kernel(1, in, out), pairs, &args, stream, "launching merge_state");
}

}  // namespace kvattn::cuda
