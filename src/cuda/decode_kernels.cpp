#include "cuda/decode_kernels.h"

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
  return n + variant_name_suffix(user_variant);
}

DecodeKernelConfig choose_decode(const DecodeProblemKey& key, const DeviceLimits& limits, const detail::Overrides& ov) {
  using detail::DecodeKernelChoice;
  const DType q = key.q_dtype, kv = key.kv_dtype;
  const int dqk = key.head_dim_qk, dvo = key.head_dim_vo, group = key.group_size, page_size = key.page_size;
  const uint32_t features = key.features;
  for (int d : {dqk, dvo})
    KVATTN_CHECK(d % 16 == 0 && d >= 16 && d <= 256, "head dim ", d,
                 " is not supported by the GPU decode kernels (a multiple of 16 up to 256)");
  KVATTN_CHECK(q == DType::f16 || q == DType::bf16 || q == DType::f32, "q_dtype ",
               dtype_name(q), " is not supported on the GPU");
  KVATTN_CHECK(!(features & kernels::kCustomMask), "custom masks are not supported by decode");
  DecodeKernelConfig c;
  c.q_dtype = q;
  c.kv_dtype = kv;
  c.o_dtype = key.o_dtype;
  c.head_dim_qk = dqk;
  c.head_dim_vo = dvo;
  c.user_variant = key.user_variant;
  // Decode queries sit at the last position, so the causal mask never hides a key: drop its bit.
  c.features = features & ~uint32_t(kernels::kCausal);
  c.page_size = (page_size > 0 && page_size <= 128 && (page_size & (page_size - 1)) == 0) ? page_size : 0;
  // Tensor cores take f16/bf16 K/V in q's dtype, and fp8 K/V under f16/bf16 q (as f16 MMAs:
  // kernels/decode/decode_mma_kernel.cuh); fused RoPE rotates K in f32 on the CUDA-core kernel.
  const bool fp8_kv = kv == DType::e4m3 || kv == DType::e5m2;
  const bool two_byte_q = q == DType::f16 || q == DType::bf16;
  c.tensor_cores = ((kv == q && two_byte_q) || (fp8_kv && two_byte_q)) && !(features & kernels::kRope);
  c.stages = 2;
  c.threads = 128;
  // One CTA per item measured faster than persistent workers on the H200 (docs/DECISIONS.md).
  c.persistent = ov.decode_grid == detail::DecodeGrid::workers;
  c.l2_prefetch = ov.decode_l2_prefetch.value_or(0);
  // The tensor-core kernel: bulk copies where the device has them (sm_90+), else cp.async; an
  // override of mma|transposed|bulk picks one for measurements (decode: the decode kernels' own
  // choice, never the prefill kernels).
  const DecodeKernelChoice kernel = ov.decode_kernel == DecodeKernelChoice::prefill
                                        ? DecodeKernelChoice::decode
                                        : ov.decode_kernel.value_or(DecodeKernelChoice::decode);
  const bool own_choice = kernel == DecodeKernelChoice::decode;
  // 2-byte K/V only; the transposed kernel takes built-in variants only.
  c.transposed = c.tensor_cores && !fp8_kv && !key.user_variant && kernel == DecodeKernelChoice::transposed;
  // Query heads per CTA: the largest divisor of the group up to the kernel's rows. The tensor-core
  // kernels take two 16-row M tiles (17-32 heads: MQA and large groups read each KV byte once per
  // 32 heads, not per 16) where the accumulators fit (head_dim_vo <= 128); the transposed kernel
  // takes 16.
  const int max_heads = !c.tensor_cores ? 8 : (c.transposed || dvo > 128) ? 16 : 32;
  c.heads_per_cta = 1;
  for (int g = 1; g <= max_heads && g <= group; ++g)
    if (group % g == 0) c.heads_per_cta = g;
  c.bulk = c.tensor_cores && limits.has_bulk_copies() && (own_choice || kernel == DecodeKernelChoice::bulk);
  // TMA boxes of 16 tokens x 128 bytes: pages of whole boxes, head dims of whole 128-byte rows. A
  // sliding window starts its range at kv_len - 1 - window_left, off the 16-token grid, so every
  // tile would take the TMA kernel's cp.async path: windows keep the row copies.
  const int box_dims = fp8_kv ? 128 : 64;
  c.tma = c.bulk && own_choice && page_size >= 16 && page_size % 16 == 0 && dqk % box_dims == 0 && dvo % box_dims == 0 &&
          !(features & kernels::kSlidingWindow);
  // Two CTAs per SM with room for the L1: kDecodeSmemPerCta, or half of a smaller SM.
  const int64_t two_per_sm = std::min(kDecodeSmemPerCta, limits.smem_per_sm / 2 - limits.reserved_smem_per_block);
  int64_t smem_limit = two_per_sm;
  if (c.bulk) {
    c.stages = ov.decode_bulk_stages.value_or(key.skewed_batch ? 2 : 3);
    // Asked for deep pipelines or a warp count: keep the warps, whatever the shared memory.
    if (c.stages >= 4 || ov.decode_warps) smem_limit = limits.smem_per_block_optin;
    if (ov.decode_warps) c.threads = 32 * *ov.decode_warps;
  }
  c.tile_tokens = c.tensor_cores ? kernels::decode::mma_tile_tokens(c.threads / 32) : 64;
  // fp8 K/V on the bulk kernels: a CTA streams half the bytes of a 2-byte one, so the split fills
  // more CTAs per SM, and the ring's depth follows the batch (fp8_decode_tuning says why).
  if (c.bulk && fp8_kv) {
    const Fp8DecodeTuning t = fp8_decode_tuning(key.skewed_batch, c.heads_per_cta);
    c.split_ctas_per_sm = t.split_ctas_per_sm;
    if (!ov.decode_bulk_stages) {
      const int shallow = c.stages;
      c.stages = t.stages;
      if (decode_smem_bytes(c) > two_per_sm) c.stages = shallow;
    }
  }
  // Wide rows (f32 KV, head dim 256) take 32-token tiles on the CUDA-core path.
  if (!c.tensor_cores && decode_smem_bytes(c) > two_per_sm) c.tile_tokens = 32;
  // On tensor cores the same holds with two warps (32-token tiles) for head dims above 128.
  if (c.tensor_cores && decode_smem_bytes(c) > smem_limit) {
    c.threads = 64;
    c.tile_tokens = kernels::decode::mma_tile_tokens(2);
  }
  return c;
}

Fp8DecodeTuning fp8_decode_tuning(bool skewed_batch, int heads_per_cta) {
  // Measured on the H200, e4m3 at 32/8 heads (docs/DECISIONS.md, "fp8 decode"; against 3 stages
  // split over one CTA per SM): uniform batches split over three CTAs per SM (the kernel's
  // residency) fill the waves: 64 x 4096 176 -> 154 us, 256 x 4096 unchanged, 16 x 4096 63 -> 47 us
  // (64 x 1016 pays 10% for the extra splits); 5 stages at two CTAs per SM gained less there and
  // lost 9% at 256 x 4096. Skewed batches: 4 stages, two CTAs per SM (Zipf 163 -> 150 us; three
  // per SM 160). Two M tiles (17-32 heads per CTA, MQA): 5 stages, two per SM (32/1 63 -> 54 us;
  // three per SM 72).
  if (skewed_batch) return {kFp8DecodeSkewedStages, 2};
  if (heads_per_cta > 16) return {kFp8DecodeLargeGroupStages, 2};
  return {3, 3};
}

int decode_smem_bytes(const DecodeKernelConfig& c) {
  const int kv_bytes = int(dtype_size(c.kv_dtype));
  const int m_tiles = (c.heads_per_cta + 15) / 16;
  const int warps = c.threads / 32;
  if (c.tensor_cores && c.bulk && c.tma)
    return kernels::decode::tma_smem_bytes(c.head_dim_qk, c.head_dim_vo, c.stages, warps, kv_bytes, m_tiles);
  if (c.tensor_cores && c.bulk)
    return kernels::decode::bulk_smem_bytes(c.head_dim_qk, c.head_dim_vo, c.stages, warps, kv_bytes, m_tiles);
  if (c.tensor_cores && c.transposed)
    return kernels::decode::mma_t_smem_bytes(c.head_dim_qk, c.head_dim_vo, c.stages, warps);
  if (c.tensor_cores)
    return kernels::decode::mma_smem_bytes(c.head_dim_qk, c.head_dim_vo, c.stages, warps, kv_bytes, m_tiles);
  return kernels::decode::simt_smem_bytes(int(dtype_size(c.kv_dtype)), c.head_dim_qk, c.head_dim_vo,
                                          c.heads_per_cta, c.tile_tokens, c.stages, c.threads);
}

namespace {
std::string code(DType t) { return std::to_string(int(t)); }  // kernels::DTypeCode numbering
}  // namespace

KernelSpec decode_spec(const DecodeKernelConfig& c, const std::string& arch) {
  KernelSpec spec;
  spec.name = c.name();
  spec.entry = entry_symbol(spec.name);
  spec.arch = arch;
  // The kernel reads a named configuration; the *KernelFor adapters next to each kernel template
  // map the names onto its parameters.
  std::string config = "struct KernelConfig {\n";
  auto member = [&config](const char* type, const char* name, const std::string& value) {
    config.append("  static constexpr ").append(type).append(" ").append(name).append(" = ").append(value).append(";\n");
  };
  member("int", "q_dtype", code(c.q_dtype));
  member("int", "kv_dtype", code(c.kv_dtype));
  member("int", "o_dtype", code(c.o_dtype));
  member("int", "head_dim_qk", std::to_string(c.head_dim_qk));
  member("int", "head_dim_vo", std::to_string(c.head_dim_vo));
  member("int", "heads_per_cta", std::to_string(c.heads_per_cta));
  member("int", "page_size", std::to_string(c.page_size));
  member("uint32_t", "features", std::to_string(c.features) + "u");
  member("int", "stages", std::to_string(c.stages));
  KVATTN_CHECK(!(c.user_variant && c.tensor_cores && c.transposed), "decode kernel ", c.name(),
               ": the transposed decode kernel does not take user variants");
  config += variant_member(c.user_variant, c.features);
  std::string kernel;
  if (c.tensor_cores) {
    member("int", "warps", std::to_string(c.threads / 32));
    kernel = c.tma ? "DecodeTmaKernelFor" : c.bulk ? "DecodeBulkKernelFor" : c.transposed ? "DecodeMmaTKernelFor" : "DecodeMmaKernelFor";
    spec.source = c.tma          ? "#include \"kernels/decode/decode_tma_kernel.cuh\"\n"
                  : c.bulk       ? "#include \"kernels/decode/decode_bulk_kernel.cuh\"\n"
                  : c.transposed ? "#include \"kernels/decode/decode_mma_t_kernel.cuh\"\n"
                                 : "#include \"kernels/decode/decode_mma_kernel.cuh\"\n";
  } else {
    member("int", "tile_tokens", std::to_string(c.tile_tokens));
    member("int", "threads", std::to_string(c.threads));
    kernel = "DecodeKernelFor";
    spec.source = "#include \"kernels/decode/decode_kernel.cuh\"\n";
  }
  config += "};\n";
  // The L2 prefetch hint on the K/V copies (an experiment, docs/DECISIONS.md).
  if (c.l2_prefetch > 0) spec.options.push_back("-DKVATTN_L2_PREFETCH=" + std::to_string(c.l2_prefetch));
  if (c.user_variant) {
    spec.user_file = c.user_variant->file;
    spec.user_source = c.user_variant->source;
  }
  spec.source += "#include \"kernels/decode/persistent.cuh\"\n" + variant_definitions(c.user_variant) + config +
                 user_softmax_record(c.user_variant) +
                 "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(c.threads) + ") " +
                 spec.entry + "(const __grid_constant__ kvattn::kernels::DecodeParams p) {\n"
                 "  extern __shared__ __align__(16) char smem[];\n"
                 "  kvattn::kernels::decode::" + (c.persistent ? "run_worker<" : "run_one_item<") +
                 "kvattn::kernels::decode::" + kernel + "<KernelConfig>>(p, smem);\n}\n";
  return spec;
}

int decode_default_workers(int sm_count, int resident_per_sm, int split_ctas_per_sm, int head_chunks, int num_kv_heads,
                           bool persistent) {
  // The split never asks for more CTAs per SM than fit (a shallow fallback or an override can
  // leave fewer resident than the tuning table's row assumes).
  const int split = resident_per_sm > 0 ? std::min(split_ctas_per_sm, resident_per_sm) : split_ctas_per_sm;
  const int slots_per_sm = persistent ? std::max(1, resident_per_sm) : std::max(1, split);
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

bool decode_uses_prefill_kernels(const DecodeProblemKey& key, const DeviceLimits& limits, const detail::Overrides& ov,
                                 const DecodeBatchShape& batch) {
  using detail::DecodeKernelChoice;
  if (ov.decode_kernel && *ov.decode_kernel != DecodeKernelChoice::prefill) return false;
  const DType q = key.q_dtype, kv = key.kv_dtype;
  // Only problems the prefill kernels take and whose kernel fits the device's shared memory;
  // the others stay on the decode kernels (and get their errors).
  auto head_dim_ok = [](int d) { return d >= 16 && d <= 256 && d % 16 == 0; };
  if (!head_dim_ok(key.head_dim_qk) || !head_dim_ok(key.head_dim_vo)) return false;
  if (!(q == DType::f16 || q == DType::bf16) || !(kv == q || kv == DType::e4m3 || kv == DType::e5m2)) return false;
  PrefillProblemKey pk;
  pk.q_dtype = pk.o_dtype = q;
  pk.kv_dtype = kv;
  pk.head_dim_qk = key.head_dim_qk;
  pk.head_dim_vo = key.head_dim_vo;
  pk.group_size = key.group_size;
  pk.paged = true;
  pk.page_size = key.page_size;
  pk.features = key.features;
  pk.max_qo_len = 1;
  const PrefillKernelConfig pc = choose_prefill(pk, limits, ov);
  if (prefill_smem_bytes(pc) > limits.smem_per_block_optin) return false;
  if (ov.decode_kernel == DecodeKernelChoice::prefill) return true;
  // Where the decode kernel would be a tensor-core one (f16/bf16 KV, no fused RoPE) and the group
  // fills 4 to 16 rows of the prefill kernel's M tile (measured at 4; wider groups take several
  // row tiles per head chunk).
  const bool tensor_core_decode = kv == q && !(key.features & kernels::kRope);
  if (!tensor_core_decode || key.group_size < 4 || key.group_size > 16) return false;
  if (!limits.has_bulk_copies()) return true;
  // sm_90+: long batches of plain softmax decode only (the header says why).
  if (batch.cuda_graph || (key.features & ~uint32_t(kernels::kCausal)) != 0) return false;
  int64_t total = 0;
  for (int64_t l : batch.kv_len) total += l;
  const int64_t requests = int64_t(batch.kv_len.size());
  return requests * batch.num_kv_heads >= 128 && requests > 0 && total >= kLongDecodeMeanTokens * requests;
}

KernelSpec decode_merge_spec(const DecodeKernelConfig& c, const std::string& arch) {
  const bool sigmoid = c.features & kernels::kSigmoid;
  KernelSpec spec;
  // The merge reads only the softmax switch of the built-in features (and a user variant's hooks).
  const uint32_t features = c.user_variant ? c.features : sigmoid ? uint32_t(kernels::kSigmoid) : 0u;
  spec.name = "decode_merge_" + std::string(dtype_name(c.o_dtype)) + "_hd" + std::to_string(c.head_dim_vo) +
              (c.user_variant ? "_f" + std::to_string(features) : sigmoid ? "_sigmoid" : "") +
              variant_name_suffix(c.user_variant);
  spec.entry = entry_symbol(spec.name);
  spec.arch = arch;
  if (c.user_variant) {
    spec.user_file = c.user_variant->file;
    spec.user_source = c.user_variant->source;
  }
  spec.source = "#include \"kernels/decode/persistent.cuh\"\n" + variant_definitions(c.user_variant) +
                "struct KernelConfig {\n" + variant_member(c.user_variant, features) + "};\n"
                "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(kDecodeMergeThreads) +
                ") " + spec.entry + "(const __grid_constant__ kvattn::kernels::DecodeParams p) {\n"
                "  kvattn::kernels::decode::merge_partials<" + code(c.o_dtype) + ", " +
                std::to_string(c.head_dim_vo) + ", KernelConfig::Variant>(p);\n}\n";
  return spec;
}

}  // namespace kvattn::cuda
