#include "cuda/decode_kernels.h"
#include "core/env_knobs.h"

#include <algorithm>
#include <cstdlib>

#include "cuda/prefill_kernels.h"
#include "kernels/decode/smem_layout.cuh"
#include "kernels/variants/params.cuh"
#include "kvattn/error.h"

namespace kvattn::cuda {

using kernels::VariantFeature;

std::string DecodeKernelConfig::name() const {
  std::string n = tensor_cores ? "decode_mma_" : "decode_simt_";
  n += std::string(dtype_name(kv_dtype));
  if (q_dtype != kv_dtype) n += "_q" + std::string(dtype_name(q_dtype));
  if (o_dtype != q_dtype) n += "_o" + std::string(dtype_name(o_dtype));
  n += "_hd" + std::to_string(head_dim_qk);
  if (head_dim_vo != head_dim_qk) n += "x" + std::to_string(head_dim_vo);
  n += "_g" + std::to_string(heads_per_cta) + "_p" + std::to_string(page_size);
  n += "_f" + std::to_string(features);
  if (threads != 128) n += "_t" + std::to_string(threads);
  if (!tensor_cores && tile_tokens != 64) n += "_k" + std::to_string(tile_tokens);
  if (persistent) n += "_persistent";
  if (tensor_cores && transposed) n += "_t";
  if (tensor_cores && bulk) {
    const std::string kind = tma ? "_tma" : "_bulk";
    n += stages == 3 ? kind : kind + "_s" + std::to_string(stages);
  }
  return n;
}

DecodeKernelConfig choose_decode_config(DType q, DType kv, DType o, int dqk, int dvo, int group,
                                        int page_size, uint32_t features, bool bulk_copies, bool skewed_batch) {
  for (int d : {dqk, dvo})
    KVATTN_CHECK(d % 16 == 0 && d >= 16 && d <= 256, "head dim ", d,
                 " is not supported by the GPU decode kernels (a multiple of 16 up to 256)");
  KVATTN_CHECK(q == DType::f16 || q == DType::bf16 || q == DType::f32, "q_dtype ",
               dtype_name(q), " is not supported on the GPU");
  KVATTN_CHECK(!(features & kernels::kCustomMask), "custom masks are not supported by decode");
  DecodeKernelConfig c;
  c.q_dtype = q;
  c.kv_dtype = kv;
  c.o_dtype = o;
  c.head_dim_qk = dqk;
  c.head_dim_vo = dvo;
  // Decode queries sit at the last position, so the causal mask never hides a key: drop its bit.
  c.features = features & ~uint32_t(kernels::kCausal);
  c.page_size = (page_size > 0 && page_size <= 128 && (page_size & (page_size - 1)) == 0) ? page_size : 0;
  c.tensor_cores = (kv == DType::f16 || kv == DType::bf16) && q == kv && !(features & kernels::kRope);
  const int max_heads = c.tensor_cores ? 16 : 8;
  c.heads_per_cta = 1;
  for (int g = 1; g <= max_heads && g <= group; ++g)
    if (group % g == 0) c.heads_per_cta = g;
  c.stages = 2;
  c.threads = 128;
  // One CTA per item measured faster than persistent workers on the H200 (docs/DECISIONS.md);
  // KVATTN_DECODE_GRID=workers selects the persistent grid for comparison.
  const char* grid_env = detail::knob("KVATTN_DECODE_GRID");
  const std::string grid = grid_env ? grid_env : "";
  KVATTN_CHECK(grid.empty() || grid == "items" || grid == "workers", "KVATTN_DECODE_GRID is items or workers, not '",
               grid, "'");
  c.persistent = grid == "workers";
  // The tensor-core kernel: bulk copies where the device has them (sm_90+), else cp.async;
  // KVATTN_DECODE_KERNEL=mma|transposed|bulk overrides it for measurements (=decode: the decode
  // kernels' own choice, never the prefill kernels).
  const char* env = detail::knob("KVATTN_DECODE_KERNEL");
  const std::string kernel = env && std::string_view(env) != "decode" ? env : "";
  KVATTN_CHECK(kernel.empty() || kernel == "mma" || kernel == "transposed" || kernel == "bulk" || kernel == "decode" ||
                   kernel == "prefill",
               "KVATTN_DECODE_KERNEL is mma, transposed, bulk, decode or prefill, not '", kernel, "'");
  c.transposed = c.tensor_cores && kernel == "transposed";
  c.bulk = c.tensor_cores && bulk_copies && (kernel.empty() || kernel == "bulk");
  // TMA boxes of 16 tokens x 64 dims: pages of whole boxes, head dims of whole 128-byte rows. A
  // sliding window starts its range at kv_len - 1 - window_left, off the 16-token grid, so every
  // tile would take the TMA kernel's cp.async path: windows keep the row copies.
  c.tma = c.bulk && kernel.empty() && page_size >= 16 && page_size % 16 == 0 && dqk % 64 == 0 && dvo % 64 == 0 &&
          !(features & kernels::kSlidingWindow);
  int smem_limit = 110 * 1024;
  const char* stages_env = detail::knob("KVATTN_DECODE_BULK_STAGES");
  const std::string stages = stages_env ? stages_env : "";
  KVATTN_CHECK(stages.empty() || (stages.size() == 1 && stages[0] >= '2' && stages[0] <= '6'),
               "KVATTN_DECODE_BULK_STAGES is 2 to 6, not '", stages, "'");
  // Experiment knob: KVATTN_DECODE_WARPS=2|3|4 sets the bulk kernels' warps (16 tokens each).
  const char* warps_env = detail::knob("KVATTN_DECODE_WARPS");
  const std::string warps = warps_env ? warps_env : "";
  KVATTN_CHECK(warps.empty() || warps == "2" || warps == "3" || warps == "4", "KVATTN_DECODE_WARPS is 2, 3 or 4, not '",
               warps, "'");
  if (c.bulk) {
    c.stages = stages.empty() ? (skewed_batch ? 2 : 3) : stages[0] - '0';
    if (c.stages >= 4 || !warps.empty()) smem_limit = 227 * 1024;  // asked for: keep the warps
    if (!warps.empty()) c.threads = 32 * (warps[0] - '0');
  }
  c.tile_tokens = c.tensor_cores ? kernels::decode::mma_tile_tokens(c.threads / 32) : 64;
  // Keep at least two CTAs per SM (about 110 KB of shared memory each on a 228 KB SM): wide rows
  // (f32 KV, head dim 256) take 32-token tiles on the CUDA-core path.
  if (!c.tensor_cores && decode_smem_bytes(c) > 110 * 1024) c.tile_tokens = 32;
  // On tensor cores the same holds with two warps (32-token tiles) for head dims above 128.
  if (c.tensor_cores && decode_smem_bytes(c) > smem_limit) {
    c.threads = 64;
    c.tile_tokens = kernels::decode::mma_tile_tokens(2);
  }
  return c;
}

bool decode_folds_in_kernel() {
  const char* env = detail::knob("KVATTN_DECODE_MERGE");
  const std::string v = env ? env : "";
  KVATTN_CHECK(v.empty() || v == "fold" || v == "kernel", "KVATTN_DECODE_MERGE is fold or kernel, not '", v, "'");
  return v == "fold";
}

int decode_smem_bytes(const DecodeKernelConfig& c) {
  if (c.tensor_cores && c.bulk && c.tma)
    return kernels::decode::tma_smem_bytes(c.head_dim_qk, c.head_dim_vo, c.stages, c.threads / 32);
  if (c.tensor_cores && c.bulk)
    return kernels::decode::bulk_smem_bytes(c.head_dim_qk, c.head_dim_vo, c.stages, c.threads / 32);
  if (c.tensor_cores && c.transposed)
    return kernels::decode::mma_t_smem_bytes(c.head_dim_qk, c.head_dim_vo, c.stages, c.threads / 32);
  if (c.tensor_cores)
    return kernels::decode::mma_smem_bytes(c.head_dim_qk, c.head_dim_vo, c.stages, c.threads / 32);
  return kernels::decode::simt_smem_bytes(int(dtype_size(c.kv_dtype)), c.head_dim_qk, c.head_dim_vo,
                                          c.heads_per_cta, c.tile_tokens, c.stages, c.threads);
}

namespace {
std::string code(DType t) { return std::to_string(int(t)); }  // kernels::DTypeCode numbering
}  // namespace

KernelSpec decode_spec(const DecodeKernelConfig& c, const std::string& arch) {
  KernelSpec spec;
  spec.name = c.name();
  spec.entry = "kvattn_" + spec.name;
  spec.arch = arch;
  std::string kernel;
  if (c.tensor_cores) {
    kernel = std::string("kvattn::kernels::decode::") +
             (c.tma ? "DecodeTmaKernel<" : c.bulk ? "DecodeBulkKernel<" : c.transposed ? "DecodeMmaTKernel<" : "DecodeMmaKernel<") +
             code(c.kv_dtype) + ", " + code(c.q_dtype) + ", " + code(c.o_dtype) + ", " + std::to_string(c.head_dim_qk) + ", " +
             std::to_string(c.head_dim_vo) + ", " + std::to_string(c.heads_per_cta) + ", " +
             std::to_string(c.page_size) + ", " + std::to_string(c.features) + "u, " +
             std::to_string(c.stages) + ", " + std::to_string(c.threads / 32) + ">";
    spec.source = c.tma          ? "#include \"kernels/decode/decode_tma_kernel.cuh\"\n"
                  : c.bulk       ? "#include \"kernels/decode/decode_bulk_kernel.cuh\"\n"
                  : c.transposed ? "#include \"kernels/decode/decode_mma_t_kernel.cuh\"\n"
                                 : "#include \"kernels/decode/decode_mma_kernel.cuh\"\n";
  } else {
    kernel = "kvattn::kernels::decode::DecodeKernel<" + code(c.q_dtype) + ", " + code(c.kv_dtype) +
             ", " + code(c.o_dtype) + ", " + std::to_string(c.head_dim_qk) + ", " +
             std::to_string(c.head_dim_vo) + ", " + std::to_string(c.heads_per_cta) + ", " +
             std::to_string(c.page_size) + ", " + std::to_string(c.features) + "u, " +
             std::to_string(c.tile_tokens) + ", " + std::to_string(c.stages) + ", " +
             std::to_string(c.threads) + ">";
    spec.source = "#include \"kernels/decode/decode_kernel.cuh\"\n";
  }
  // Experiment knob (docs/DECISIONS.md): KVATTN_DECODE_L2_PREFETCH=64|128|256 adds the L2 prefetch
  // hint to the K/V copies.
  if (const char* l2 = detail::knob("KVATTN_DECODE_L2_PREFETCH")) {
    const std::string v = l2;
    KVATTN_CHECK(v == "64" || v == "128" || v == "256", "KVATTN_DECODE_L2_PREFETCH is 64, 128 or 256, not '", v, "'");
    spec.options.push_back("-DKVATTN_L2_PREFETCH=" + v);
  }
  spec.source += "#include \"kernels/decode/persistent.cuh\"\n"
                 "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(c.threads) + ") " +
                 spec.entry + "(const __grid_constant__ kvattn::kernels::DecodeParams p) {\n"
                 "  extern __shared__ __align__(16) char smem[];\n"
                 "  kvattn::kernels::decode::" + (c.persistent ? "run_worker<" : "run_one_item<") +
                 kernel + ">(p, smem);\n}\n";
  return spec;
}

int decode_default_workers(int sm_count, int resident_per_sm, int head_chunks, int num_kv_heads, bool persistent) {
  const int slots_per_sm = persistent ? std::max(1, resident_per_sm) : 1;
  int workers = std::max(1, sm_count * slots_per_sm / std::max(1, head_chunks));
  if (!persistent && workers >= 2 * num_kv_heads) workers -= workers % num_kv_heads;
  return workers;
}

bool decode_batch_is_skewed(std::span<const int32_t> kv_len) {
  if (kv_len.size() < 2) return false;
  int64_t total = 0, longest = 0;
  for (int32_t l : kv_len) {
    total += l;
    longest = std::max<int64_t>(longest, l);
  }
  return total > 0 && longest * int64_t(kv_len.size()) >= 4 * total;
}

bool decode_uses_prefill_kernels(DType q, DType kv, int head_dim_qk, int head_dim_vo, int group_size,
                                 uint32_t features, int page_size, bool bulk_copies, int64_t max_smem_per_block,
                                 const DecodeBatchShape& batch) {
  const char* env = detail::knob("KVATTN_DECODE_KERNEL");
  const std::string kernel = env ? env : "";
  KVATTN_CHECK(kernel.empty() || kernel == "mma" || kernel == "transposed" || kernel == "bulk" || kernel == "decode" ||
                   kernel == "prefill",
               "KVATTN_DECODE_KERNEL is mma, transposed, bulk, decode or prefill, not '", kernel, "'");
  if (!kernel.empty() && kernel != "prefill") return false;
  // Only problems the prefill kernels take and whose kernel fits the device's shared memory;
  // the others stay on the decode kernels (and get their errors).
  auto head_dim_ok = [](int d) { return d >= 16 && d <= 256 && d % 16 == 0; };
  if (!head_dim_ok(head_dim_qk) || !head_dim_ok(head_dim_vo)) return false;
  if (!(q == DType::f16 || q == DType::bf16) || !(kv == q || kv == DType::e4m3 || kv == DType::e5m2)) return false;
  const PrefillKernelConfig pc =
      choose_prefill_config(q, kv, q, head_dim_qk, head_dim_vo, group_size, true, page_size, features, 1,
                            max_smem_per_block);
  if (prefill_smem_bytes(pc) > max_smem_per_block) return false;
  if (kernel == "prefill") return true;
  // Where the decode kernel would be a tensor-core one (f16/bf16 KV, no fused RoPE) and the group
  // fills 4 to 16 rows of the prefill kernel's M tile (measured at 4; wider groups take several
  // row tiles per head chunk).
  const bool tensor_core_decode = kv == q && !(features & kernels::kRope);
  if (!tensor_core_decode || group_size < 4 || group_size > 16) return false;
  if (!bulk_copies) return true;
  // sm_90+: long batches of plain softmax decode only (the header says why).
  if (batch.cuda_graph || (features & ~uint32_t(kernels::kCausal)) != 0) return false;
  int64_t total = 0;
  for (int64_t l : batch.kv_len) total += l;
  const int64_t requests = int64_t(batch.kv_len.size());
  return requests * batch.num_kv_heads >= 128 && requests > 0 && total >= kLongDecodeMeanTokens * requests;
}

KernelSpec decode_merge_spec(const DecodeKernelConfig& c, const std::string& arch) {
  const bool sigmoid = c.features & kernels::kSigmoid;
  KernelSpec spec;
  spec.name = "decode_merge_" + std::string(dtype_name(c.o_dtype)) + "_hd" +
              std::to_string(c.head_dim_vo) + (sigmoid ? "_sigmoid" : "");
  spec.entry = "kvattn_" + spec.name;
  spec.arch = arch;
  spec.source = "#include \"kernels/decode/persistent.cuh\"\n"
                "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(kDecodeMergeThreads) +
                ") " + spec.entry + "(const __grid_constant__ kvattn::kernels::DecodeParams p) {\n"
                "  kvattn::kernels::decode::merge_partials<" + code(c.o_dtype) + ", " +
                std::to_string(c.head_dim_vo) + ", " + std::to_string(sigmoid ? kernels::kSigmoid : 0u) +
                "u>(p);\n}\n";
  return spec;
}

}  // namespace kvattn::cuda
