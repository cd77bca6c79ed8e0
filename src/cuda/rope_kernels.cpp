#include "cuda/rope_kernels.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>

#include "cuda/runtime.h"
#include "kvattn/error.h"

namespace kvattn::cuda {
namespace {

const char* pairs_name(kernels::RopePairs p) {
  return p == kernels::RopePairs::interleaved ? "interleaved" : "half";
}
const char* cos_sin_name(kernels::RopeCosSin s) {
  return s == kernels::RopeCosSin::table ? "table" : "computed";
}

void check_config(const RopeKernelConfig& c) {
  KVATTN_CHECK(c.dtype == DType::f32 || c.dtype == DType::f16 || c.dtype == DType::bf16,
               "RoPE on the GPU supports f32, f16 and bf16, not ", dtype_name(c.dtype));
  KVATTN_CHECK(c.vector_bytes == 16 || c.vector_bytes == 0, "RoPE kernel access width ", c.vector_bytes,
               " (16 or 0: scalar)");
}

// The loaded kernel of a config on the current device, looked up once per device and kept
// (KernelCache::kernel hashes the whole spec, a few microseconds, on every call).
cudaKernel_t rope_kernel(const RopeKernelConfig& c) {
  const int device = current_device();
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, int, int>, cudaKernel_t> kernels;
  const auto key = std::tuple{device, int(c.dtype), int(c.pairs), int(c.cos_sin), c.vector_bytes};
  {
    std::lock_guard lock(mutex);
    if (auto it = kernels.find(key); it != kernels.end()) return it->second;
  }
  cudaKernel_t k = KernelCache::global().kernel(rope_spec(c, device_info(device).arch));
  std::lock_guard lock(mutex);
  kernels[key] = k;
  return k;
}

}  // namespace

std::string RopeKernelConfig::name() const {
  return std::string("rope_") + std::string(dtype_name(dtype)) + "_" + pairs_name(pairs) + "_" + cos_sin_name(cos_sin) + "_" +
         (vector_bytes == 16 ? "vec16" : "scalar");
}

KernelSpec rope_spec(const RopeKernelConfig& c, const std::string& arch) {
  check_config(c);
  KernelSpec spec;
  spec.name = c.name();
  spec.entry = entry_symbol(spec.name);
  spec.arch = arch;
  std::string config = "struct KernelConfig {\n";
  auto member = [&config](const char* type, const char* name, const std::string& value) {
    config.append("  static constexpr ").append(type).append(" ").append(name).append(" = ").append(value).append(";\n");
  };
  member("int", "dtype", std::to_string(int(c.dtype)));  // kernels::DTypeCode numbering
  member("kvattn::kernels::RopePairs", "pairs",
         std::string("kvattn::kernels::RopePairs::") +
             (c.pairs == kernels::RopePairs::interleaved ? "interleaved" : "rotate_half"));
  member("kvattn::kernels::RopeCosSin", "cos_sin", std::string("kvattn::kernels::RopeCosSin::") + cos_sin_name(c.cos_sin));
  member("int", "vector_bytes", std::to_string(c.vector_bytes));
  config += "};\n";
  // At most 64 registers, so that 4 CTAs (1024 threads) fit on an SM and keep enough loads in flight.
  spec.source = "#include \"kernels/rope/rope.cuh\"\n" + config +
                "extern \"C\" __global__ void __launch_bounds__(kvattn::kernels::kRopeThreads, 4) " + spec.entry +
                "(const __grid_constant__ kvattn::kernels::RopeParams p) {\n"
                "  kvattn::kernels::rope_apply<KernelConfig>(p);\n}\n";
  return spec;
}

bool rope_vectorizable(kernels::RopePairs pairs, int head_dim, int rotary_dim, int elems_per_vector) {
  const int V = elems_per_vector;
  if (V < 2 || head_dim % V != 0) return false;
  // Rotate-half: a vector of the low half and its partner rotary_dim / 2 further; interleaved: a
  // vector of whole pairs. Either way the copied tail starts on a vector.
  return pairs == kernels::RopePairs::rotate_half ? (rotary_dim / 2) % V == 0 : rotary_dim % V == 0;
}

int64_t rope_items_per_head(const kernels::RopeParams& p, const RopeKernelConfig& c) {
  const int V = c.vector_bytes == 16 ? 16 / int(dtype_size(c.dtype)) : 1;
  const int rd = p.rotary_dim, half = rd / 2;
  const int64_t rot = c.vector_bytes == 16 ? (c.pairs == kernels::RopePairs::interleaved ? rd / V : half / V) : half;
  return rot + (p.copy_rest ? (p.head_dim - rd) / V : 0);
}

RopeLaunch choose_rope_launch(int64_t num_rows, int64_t items_per_row, int rotary_dim, int sm_count) {
  RopeLaunch l;
  if (num_rows <= 0 || items_per_row <= 0) return l;
  constexpr int64_t kItemsPerCta = 4 * kernels::kRopeThreads, kMaxRowsPerCta = 64, kSmemBudget = 48 * 1024;
  int64_t t = std::clamp<int64_t>((kItemsPerCta + items_per_row - 1) / items_per_row, 1, kMaxRowsPerCta);
  // At least two CTAs per SM where the rows allow it (small batches: one row per CTA).
  const int64_t per_two_waves = (num_rows + 2 * int64_t(std::max(sm_count, 1)) - 1) / (2 * int64_t(std::max(sm_count, 1)));
  t = std::min(t, std::max<int64_t>(per_two_waves, 1));
  t = std::min(t, std::max<int64_t>(kSmemBudget / kernels::rope_smem_bytes(1, rotary_dim), 1));
  // The kernel's flat item index is 32-bit.
  t = std::min(t, std::max<int64_t>(int64_t(INT32_MAX) / items_per_row, 1));
  l.tokens_per_block = int(t);
  l.blocks = (num_rows + t - 1) / t;
  l.smem_bytes = kernels::rope_smem_bytes(int(t), rotary_dim);
  return l;
}

namespace {
std::atomic<int> g_bench_rows_per_cta{0}, g_last_rows_per_cta{0};
}  // namespace

void set_rope_rows_per_cta_for_benchmarks(int rows_per_cta) { g_bench_rows_per_cta = std::max(rows_per_cta, 0); }
int last_rope_rows_per_cta() { return g_last_rows_per_cta; }

void launch_rope(const kernels::RopeParams& p, const RopeKernelConfig& c, cudaStream_t stream) {
  const int forced_tokens_per_block = g_bench_rows_per_cta;
  check_config(c);
  const int64_t heads = int64_t(p.q.num_heads) + p.k.num_heads;
  const int64_t per_row = heads * rope_items_per_head(p, c);
  if (p.num_rows == 0 || per_row == 0) return;
  KVATTN_CHECK(p.rotary_dim >= 2 && p.rotary_dim <= kMaxGpuRotaryDim, "RoPE on the GPU: rotary_dim = ",
               p.rotary_dim, " is outside [2, ", kMaxGpuRotaryDim, "]");
  KVATTN_CHECK(per_row <= INT32_MAX, "RoPE on the GPU: ", heads, " heads of ", p.head_dim,
               " elements per row is too large for one launch");
  RopeLaunch l = choose_rope_launch(p.num_rows, per_row, p.rotary_dim, device_info(current_device()).sm_count);
  if (forced_tokens_per_block > 0) {
    KVATTN_CHECK(int64_t(forced_tokens_per_block) * per_row <= INT32_MAX &&
                     kernels::rope_smem_bytes(forced_tokens_per_block, p.rotary_dim) <= 48 * 1024,
                 "RoPE on the GPU: ", forced_tokens_per_block, " rows per CTA do not fit");
    l.tokens_per_block = forced_tokens_per_block;
    l.blocks = (p.num_rows + forced_tokens_per_block - 1) / forced_tokens_per_block;
    l.smem_bytes = kernels::rope_smem_bytes(forced_tokens_per_block, p.rotary_dim);
  }
  KVATTN_CHECK(l.blocks < (int64_t(1) << 31), "RoPE on the GPU: ", p.num_rows, " rows is too many for one launch");
  kernels::RopeParams args = p;
  args.tokens_per_block = l.tokens_per_block;
  g_last_rows_per_cta = l.tokens_per_block;
  void* argv[] = {&args};
  // A cudaKernel_t is accepted wherever the runtime takes a `const void* func`.
  check(cudaLaunchKernel(reinterpret_cast<const void*>(rope_kernel(c)), dim3(unsigned(l.blocks)),
                         dim3(kernels::kRopeThreads), argv, size_t(l.smem_bytes), stream),
        "launching the RoPE kernel");
}

}  // namespace kvattn::cuda
