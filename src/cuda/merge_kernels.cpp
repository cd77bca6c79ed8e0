#include "cuda/merge_kernels.h"

#include "cuda/runtime.h"
#include "kvattn/error.h"

namespace kvattn::cuda {
namespace {

// The kernels' DTypeCode (kernels/common/ptx.cuh) is numbered as kvattn::DType.
std::string dtype_code(DType t) {
  KVATTN_CHECK(t == DType::f32 || t == DType::f16 || t == DType::bf16,
               "merge_states on the GPU supports f32, f16 and bf16, not ", dtype_name(t));
  return std::to_string(int(t));
}

}  // namespace

KernelSpec merge_states_spec(DType in, DType out, const std::string& arch) {
  std::string name = "merge_states_" + std::string(dtype_name(in));
  if (out != in) name += "_to_" + std::string(dtype_name(out));
  KernelSpec spec;
  spec.name = name;
  spec.entry = "kvattn_" + name;
  spec.arch = arch;
  spec.source = "#include \"kernels/merge/merge_states.cuh\"\n"
                "extern \"C\" __global__ void __launch_bounds__(kvattn::kernels::kMergeThreads)\n" +
                spec.entry + "(const kvattn::kernels::MergeStatesParams p) {\n" +
                "  kvattn::kernels::merge_states<" + dtype_code(in) + ", " + dtype_code(out) + ">(p);\n}\n";
  return spec;
}

void launch_merge_states(const kernels::MergeStatesParams& p, DType in, DType out, cudaStream_t stream) {
  int64_t pairs = p.num_rows * p.num_heads;
  if (pairs == 0 || p.head_dim == 0) return;
  const DeviceInfo& dev = device_info(current_device());
  cudaKernel_t k = KernelCache::global().kernel(merge_states_spec(in, out, dev.arch));
  int64_t blocks = (pairs + kernels::kMergeWarpsPerBlock - 1) / kernels::kMergeWarpsPerBlock;
  KVATTN_CHECK(blocks < (int64_t(1) << 31), "merge_states: ", pairs, " (row, head) pairs is too many");
  void* args[] = {const_cast<kernels::MergeStatesParams*>(&p)};
  // A cudaKernel_t is accepted wherever the runtime takes a `const void* func`.
  check(cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3(unsigned(blocks)),
                         dim3(kernels::kMergeThreads), args, 0, stream),
        "launching merge_states");
}

}  // namespace kvattn::cuda
