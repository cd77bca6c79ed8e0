#include "cuda/prefill_kernels.h"
#include "core/env_knobs.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "kernels/prefill/smem_layout.cuh"
#include "kernels/variants/params.cuh"
#include "kvattn/error.h"

namespace kvattn::cuda {

std::string PrefillKernelConfig::name() const {
  // Appends only: `"x" + std::to_string(...)` makes GCC 12 warn (-Wrestrict, a false positive).
  std::string n = "prefill_";
  auto add = [&n](const char* tag, std::string_view value) { n.append(tag).append(value); };
  n += dtype_name(q_dtype);
  if (kv_dtype != q_dtype) add("_kv", dtype_name(kv_dtype));
  if (o_dtype != q_dtype) add("_o", dtype_name(o_dtype));
  add("_hd", std::to_string(head_dim_qk));
  if (head_dim_vo != head_dim_qk) add("x", std::to_string(head_dim_vo));
  add("_g", std::to_string(heads_per_cta));
  add("_w", std::to_string(warps));
  if (m_tiles > 1) add("x", std::to_string(m_tiles));
  if (kv_warps > 1) add("_kw", std::to_string(kv_warps));
  add("_k", std::to_string(kv_tile));
  add("_s", std::to_string(stages));
  if (min_blocks > 1) add("_b", std::to_string(min_blocks));
  if (paged) {
    add("_paged", std::to_string(page_size));
    if (checked_ids) n += "_dids";
  } else {
    n += "_ragged";
  }
  add("_f", std::to_string(features));
  if (fast_tanh && (features & kernels::kSoftCap)) n += "_tanhx";
  if (tuning != 0) add("_t", std::to_string(tuning));
  return n;
}

std::string prefill_variant_for() {
  const char* v = detail::knob("KVATTN_PREFILL_VARIANT");
  if (v && *v) return v;
  // m2k64 is the fastest on the H200 (docs/DECISIONS.md). Soft-cap at head dims 65-128 took
  // m2k48 until 29ac2ce (m2k64 spilled); with the soft-cap tuning m2k64 measured 308.6 against
  // m2k48's 270.9 TFLOP/s (1 x 16k causal; 2026-11-30, docs/perf/HISTORY.md).
  return "m2k64";
}

namespace {
// KVATTN_PREFILL_TUNING=<0-2047> when set (an experiment knob).
std::optional<uint32_t> tuning_knob() {
  using namespace kernels::prefill;
  const char* env = detail::knob("KVATTN_PREFILL_TUNING");
  if (!env || !*env) return std::nullopt;
  const std::string v = env;
  const bool digits = v.size() <= 4 && v.find_first_not_of("0123456789") == std::string::npos;
  const int bits = digits ? std::stoi(v) : -1;
  KVATTN_CHECK(bits >= 0 && bits <= int(kTuneAll), "KVATTN_PREFILL_TUNING is a number 0-", int(kTuneAll), ", not '", v,
               "'");
  return uint32_t(bits);
}
}  // namespace

PrefillDecodeShape prefill_decode_shape(bool uniform_decode) {
  // Four KV warps of 16 tokens, 2 stages, 3 CTAs per SM: measured fastest of eight shapes for GQA
  // decode (H200, bf16, hd 128, group 4, page 16; 2026-11-30 at 53a0a95, docs/perf/HISTORY.md):
  // 64 x 4096 4,192-4,196 GB/s, 64 Zipf lengths 98% of that; the one-warp shape before it 3,985
  // and 85%. Uniform batches: six warps at 2 CTAs per SM (a later call, same kernels: 64 x 4096
  // 4,300-4,307, 256 x 4096 4,479-4,482, against 4,229-4,239 and 4,373-4,375).
  PrefillDecodeShape s = uniform_decode ? PrefillDecodeShape{6, 16, 2, 2} : PrefillDecodeShape{4, 16, 2, 3};
  const char* env = detail::knob("KVATTN_PREFILL_DECODE_SHAPE");
  if (!env || !*env) return s;
  const std::string v = env;
  int used = 0, used_b = 0;
  bool parsed = std::sscanf(v.c_str(), "%dx%ds%d%n", &s.kv_warps, &s.warp_tokens, &s.stages, &used) == 3;
  if (parsed && size_t(used) < v.size())  // "b<ctas>", and nothing after it
    parsed = std::sscanf(v.c_str() + used, "b%d%n", &s.min_blocks, &used_b) == 1 && size_t(used + used_b) == v.size();
  const bool warps_ok = s.kv_warps == 1 || s.kv_warps == 2 || s.kv_warps == 4 || s.kv_warps == 6 || s.kv_warps == 8;
  const bool valid = parsed && warps_ok && (s.warp_tokens == 16 || s.warp_tokens == 32 || s.warp_tokens == 64) &&
                     s.stages >= 2 && s.stages <= 4 && s.kv_warps * s.warp_tokens <= 128 && s.min_blocks >= 1 &&
                     s.min_blocks <= 8;
  KVATTN_CHECK(valid, "KVATTN_PREFILL_DECODE_SHAPE is <kv_warps 1|2|4|6|8>x<tokens 16|32|64>s<stages 2-4>",
               "[b<CTAs per SM 1-8>] with at most 128 tokens per tile (e.g. 4x16s2), not '", v, "'");
  return s;
}

uint32_t prefill_tuning_for(uint32_t features, int dqk, int dvo, int kv_bytes, int heads_per_cta, bool paged,
                            bool fast_tanh) {
  using namespace kernels::prefill;
  if (const auto bits = tuning_knob()) return *bits;
  // Measured on generated values (H200, 2026-11-30 at 29ac2ce and a073d20, docs/perf/HISTORY.md;
  // 1 x 16k causal unless said): the lazy rescale is never slower; hd 64 unrolled +1%; hd 256
  // unrolled and swizzled +9% (P packed early -1%); hd 128 one head per CTA swizzled, unrolled and
  // P packed early +6% (non-causal +4%, page 16 +7%); GQA-packed CTAs unrolled +6% (swizzled and
  // packed -1%); paged GQA-packed CTAs all +2% (append), but only where they do not spill (custom
  // masks, fp8 or RoPE K/V: lazy only); soft-cap unrolled +13% (swizzled -8%, packed -8%). The lean
  // copies (at a073d20): hd 64 +3.5%, hd 128 +5% (non-causal +3.7%), hd 256 +3%; not for soft-cap
  // (-4.7%) or ragged GQA-packed CTAs (-1.9%). Soft-cap through tanh.approx (at 370aabc): P packed
  // early and lean copies +3% over lazy and unrolled. ALiBi transforms a mask-free tile in one
  // block (+3.7% at 32/8, at 370aabc); soft-cap measured slower that way (exact -3.3%, tanh.approx
  // -2%), and sigmoid is unmeasured, so they keep the per-row blocks.
  const int d = std::max(dqk, dvo);
  const uint32_t lazy_unrolled = kTuneLazyRescale | kTuneUnrollQK;
  const uint32_t all = kTuneLazyRescale | kTuneSwizzleKV | kTuneUnrollQK | kTunePackP | kTuneLeanCopies;
  if (features & kernels::kSoftCap) return fast_tanh ? lazy_unrolled | kTunePackP | kTuneLeanCopies : lazy_unrolled;
  const uint32_t whole_tile = (features & kernels::kAlibi) ? uint32_t(kTuneWholeTileTransform) : 0u;
  if (d <= 64) return whole_tile | lazy_unrolled | (paged ? 0u : uint32_t(kTuneLeanCopies));
  // Above hd 128, plain softmax over ragged 2-byte K/V goes by halves, each with its own running
  // maximum (H200, at 2780334 and a97c407: hd 256 causal 294 -> 311; hd 128 -7%, hd 64 -1%,
  // quarters slower).
  const bool halves = !paged && kv_bytes == 2 &&
                      !(features & (kernels::kAlibi | kernels::kSigmoid | kernels::kCustomMask | kernels::kRope));
  if (d > 128)
    return whole_tile | lazy_unrolled | kTuneSwizzleKV | (paged ? 0u : uint32_t(kTuneLeanCopies)) |
           (halves ? uint32_t(kTuneHalfTiles) : 0u);
  if (heads_per_cta == 1) return whole_tile | all;
  if (!paged) return whole_tile | lazy_unrolled;
  const bool swizzled = swizzles_kv(true, dqk, dvo, kv_bytes, (features & kernels::kRope) != 0);
  return whole_tile | (swizzled && !(features & kernels::kCustomMask) ? all : kTuneLazyRescale);
}

PrefillTileShape prefill_long_shape(const std::string& variant, int dqk, int dvo) {
  const int d = std::max(dqk, dvo);
  const int cls = d <= 64 ? 0 : d <= 128 ? 1 : 2;
  struct Row {
    const char* name;
    PrefillTileShape shape[3];
  };
  static const Row kRows[] = {
      {"m2k32", {{4, 2, 64, 2, 2}, {4, 2, 32, 3, 2}, {4, 1, 32, 2, 2}}},
      {"m2k64", {{4, 2, 64, 3, 2}, {4, 2, 64, 2, 2}, {8, 1, 64, 2, 1}}},
      {"m1k64", {{8, 1, 64, 2, 1}, {8, 1, 64, 2, 1}, {8, 1, 32, 2, 1}}},
      {"m2w8", {{8, 2, 64, 2, 1}, {8, 2, 32, 2, 1}, {8, 1, 64, 2, 1}}},
      {"m2k48", {{4, 2, 48, 3, 2}, {4, 2, 48, 2, 2}, {8, 1, 48, 2, 1}}},
      {"m2k48s3", {{4, 2, 48, 3, 2}, {4, 2, 48, 3, 2}, {8, 1, 48, 2, 1}}},
  };
  for (const Row& r : kRows)
    if (variant == r.name) return r.shape[cls];
  detail::throw_error("KVATTN_PREFILL_VARIANT = '", variant, "' is not a prefill variant (m2k32, m2k64, m1k64, m2w8, m2k48, m2k48s3)");
}

namespace {
// Whether soft-cap's fixed shift (kTuneCapShift, smem_layout.cuh) applies: bf16, soft-cap under
// softmax without ALiBi, a cap within cap_shift_fits.
bool cap_shift_applies(DType q, uint32_t features, float soft_cap) {
  using namespace kernels;
  return q == DType::bf16 && (features & kSoftCap) != 0 && (features & (kSigmoid | kAlibi)) == 0 &&
         prefill::cap_shift_fits(soft_cap * 1.4426950408889634f);
}

// The long shape's bits where the shift applies (H200, 2026-11-30 at 7bc9489, docs/perf/HISTORY.md;
// 1 x 16k causal): the five bits, the whole-tile transform and the tile in halves (863): hd 64
// 179.7 (no shift) -> 215.0, hd 128 305.6 -> 329.5, 32/8 302.7 -> 326.2; above hd 128 in quarters
// (1887: hd 256 at cap 50 237.0 -> 307.8, its plain twin 294.6). tanh.approx in quarters everywhere
// (hd 128 341 -> 359 over its bits 285, hd 256 261 -> 321) except at hd 64, where halves on two
// stages run faster (at 1613d39: 252 in quarters on three stages, 264 in halves on two;
// choose_prefill_config sets the stages).
uint32_t shifted_soft_cap_tuning(int head_dim, bool fast_tanh) {
  using namespace kernels::prefill;
  const uint32_t halves = kTuneLazyRescale | kTuneSwizzleKV | kTuneUnrollQK | kTunePackP | kTuneLeanCopies |
                          kTuneWholeTileTransform | kTuneCapShift | kTuneHalfTiles;
  return halves | ((fast_tanh && head_dim > 64) || head_dim > 128 ? uint32_t(kTuneQuarterTiles) : 0u);
}

// Sets or clears the fixed shift where it applies. A knob that sets the bit elsewhere is
// overruled (the shift would overflow there); one that clears it keeps it cleared (A/B runs).
void set_cap_shift(PrefillKernelConfig& c, float soft_cap) {
  using namespace kernels;
  const bool applies = cap_shift_applies(c.q_dtype, c.features, soft_cap);
  const bool knob_clears = tuning_knob() && (*tuning_knob() & prefill::kTuneCapShift) == 0;
  if (applies && !knob_clears)
    c.tuning |= prefill::kTuneCapShift;
  else
    c.tuning &= ~uint32_t(prefill::kTuneCapShift);
}
}  // namespace

PrefillKernelConfig choose_prefill_config(DType q, DType kv, DType o, int dqk, int dvo, int group,
                                          bool paged, int page_size, uint32_t features, int64_t max_qo_len,
                                          int64_t max_smem_per_block, bool uniform_decode, float soft_cap,
                                          TanhForm tanh) {
  for (int d : {dqk, dvo})
    KVATTN_CHECK(d % 16 == 0 && d >= 16 && d <= 256, "head dim ", d,
                 " is not supported by the GPU prefill kernels (a multiple of 16 up to 256)");
  KVATTN_CHECK(q == DType::f16 || q == DType::bf16, "q_dtype ", dtype_name(q),
               " is not supported by the GPU prefill kernels (tensor cores take f16 or bf16)");
  KVATTN_CHECK(kv == q || kv == DType::e4m3 || kv == DType::e5m2, "kv_dtype ", dtype_name(kv),
               " is not supported by the GPU prefill kernels with q_dtype ", dtype_name(q),
               " (the same dtype as q, or fp8 e4m3/e5m2)");
  KVATTN_CHECK(o == DType::f32 || o == DType::f16 || o == DType::bf16, "o_dtype ", dtype_name(o),
               " is not supported on the GPU");
  KVATTN_CHECK(group >= 1, "GQA group size ", group, " must be >= 1");
  PrefillKernelConfig c;
  c.q_dtype = q;
  c.kv_dtype = kv;
  c.o_dtype = o;
  c.head_dim_qk = dqk;
  c.head_dim_vo = dvo;
  c.features = features;
  c.paged = paged;
  c.page_size = paged && page_size > 0 && page_size <= 128 && (page_size & (page_size - 1)) == 0 ? page_size : 0;
  const char* tanh_env = detail::knob("KVATTN_PREFILL_TANH");
  const std::string tanh_mode = tanh_env ? tanh_env : "";
  KVATTN_CHECK(tanh_mode.empty() || tanh_mode == "exact" || tanh_mode == "approx",
               "KVATTN_PREFILL_TANH is exact or approx, not '", tanh_mode, "'");
  // Soft-cap's tanh: tanh.approx.f32 (one MUFU op, FlashInfer's form) on the long shape, where
  // the MUFU pipe bounds the kernel (hd 128: 5% cost against the exact form's 12%; at 7bc9489);
  // the exact ex2 + rcp form on the short and decode shapes, which memory bounds (it costs nothing
  // there). KVATTN_PREFILL_TANH=exact|approx forces one form on every shape.
  if (tanh == TanhForm::by_shape && !tanh_mode.empty())
    tanh = tanh_mode == "exact" ? TanhForm::exact : TanhForm::approx;
  const bool soft_capped = (features & kernels::kSoftCap) != 0;
  c.fast_tanh = soft_capped && tanh == TanhForm::approx;
  const bool wide = std::max(dqk, dvo) > 128;
  const int max_warps = wide ? 4 : 8;
  c.heads_per_cta = 1;
  for (int g = 1; g <= group && g <= 128; ++g)
    if (group % g == 0) c.heads_per_cta = g;
  const int64_t rows = std::max<int64_t>(1, max_qo_len) * c.heads_per_cta;
  const PrefillTileShape s = prefill_long_shape(prefill_variant_for(), dqk, dvo);
  const int long_rows = s.warps * 16 * s.m_tiles;
  if (2 * rows >= long_rows && c.heads_per_cta <= long_rows) {
    c.warps = s.warps;
    c.m_tiles = s.m_tiles;
    c.kv_tile = s.kv_tile;
    c.stages = s.stages;
    c.min_blocks = s.min_blocks;
    c.fast_tanh = soft_capped && tanh != TanhForm::exact;
    c.tuning = prefill_tuning_for(features, dqk, dvo, int(dtype_size(kv)), c.heads_per_cta, paged, c.fast_tanh);
    // (Measured with 2-byte K/V as it lands; fp8, RoPE and custom masks keep their bits and the shift.)
    const bool shifted_long = cap_shift_applies(q, features, soft_cap) && kv == q &&
                              !(features & (kernels::kRope | kernels::kCustomMask));
    if (shifted_long && !tuning_knob()) c.tuning = shifted_soft_cap_tuning(std::max(dqk, dvo), c.fast_tanh);
    // tanh.approx at hd 64 on m2k64: two stages (shifted_soft_cap_tuning; measured on ragged KV,
    // the exact form gains nothing from them).
    if (shifted_long && c.fast_tanh && std::max(dqk, dvo) <= 64 && prefill_variant_for() == "m2k64") c.stages = 2;
    // The swizzle only applies to K/V copied as they are: keep the name true to the code.
    if (!kernels::prefill::swizzles_kv(true, dqk, dvo, int(dtype_size(kv)), (features & kernels::kRope) != 0))
      c.tuning &= ~uint32_t(kernels::prefill::kTuneSwizzleKV);
    // Each of min_blocks CTAs gets its share of the SM's 228 KB less 1 KB reserved per CTA (the
    // H200's), and no CTA more than the device allows one block (A100: 163 KB, Ada: 99 KB).
    const int64_t budget = std::min<int64_t>(max_smem_per_block, std::min(227 * 1024, 228 * 1024 / c.min_blocks - 1024));
    // Halved to a multiple of 16 (the MMA's k): 64 -> 32, 48 -> 32.
    while (prefill_smem_bytes(c) > budget && c.kv_tile > 32) c.kv_tile = std::max(32, (c.kv_tile / 2 + 15) / 16 * 16);
    while (prefill_smem_bytes(c) > budget && c.stages > 2) --c.stages;
    set_cap_shift(c, soft_cap);
    return c;
  }
  c.warps = 1;
  while (c.warps < max_warps && int64_t(c.warps) * 16 < rows) c.warps *= 2;
  while (c.warps * 16 < c.heads_per_cta) c.warps *= 2;  // the M tile holds at least one token
  c.kv_tile = wide || c.warps == 1 ? 32 : 64;
  c.stages = 2;
  if (c.warps == 1) {
    const PrefillDecodeShape d = prefill_decode_shape(uniform_decode);
    c.kv_warps = d.kv_warps;
    c.kv_tile = d.kv_warps * d.warp_tokens;
    c.stages = d.stages;
    // All five code-generation bits (H200 at 53a0a95: 4x16s2b3 64 x 4096 4,192 GB/s with them,
    // 3,990 without).
    using namespace kernels::prefill;
    c.tuning = tuning_knob().value_or(uint32_t(kTuneLazyRescale | kTuneSwizzleKV | kTuneUnrollQK | kTunePackP |
                                               kTuneLeanCopies));
    if (!swizzles_kv(true, dqk, dvo, int(dtype_size(kv)), (features & kernels::kRope) != 0))
      c.tuning &= ~uint32_t(kTuneSwizzleKV);
    // Too big for the device's per-block limit: fewer stages, then fewer tokens per warp, then
    // fewer KV warps (down to one warp of 16 tokens).
    while (prefill_smem_bytes(c) > max_smem_per_block) {
      if (c.stages > 2) {
        --c.stages;
      } else if (c.kv_tile > 16 * c.kv_warps) {
        c.kv_tile /= 2;
      } else if (c.kv_warps > 1) {  // 16 tokens per warp here: 8 -> 4 -> 2 -> 1, 6 -> 3 -> 1
        c.kv_warps /= 2;
        c.kv_tile = 16 * c.kv_warps;
      } else {
        break;
      }
    }
    // No more CTAs per SM in __launch_bounds__ than shared memory lets run (228 KB, 1 KB reserved
    // per CTA, on the H200): the bound only caps registers.
    c.min_blocks = d.min_blocks;
    while (c.min_blocks > 1 && int64_t(c.min_blocks) * (prefill_smem_bytes(c) + 1024) > 228 * 1024) --c.min_blocks;
    set_cap_shift(c, soft_cap);
    return c;
  }
  while (prefill_smem_bytes(c) > max_smem_per_block && c.kv_tile > 32) c.kv_tile /= 2;
  set_cap_shift(c, soft_cap);
  return c;
}

int prefill_smem_bytes(const PrefillKernelConfig& c) {
  const bool rope = (c.features & kernels::kRope) != 0;
  const int kv_bytes = int(dtype_size(c.kv_dtype));
  const bool swizzled = kernels::prefill::swizzles_kv((c.tuning & kernels::prefill::kTuneSwizzleKV) != 0,
                                                      c.head_dim_qk, c.head_dim_vo, kv_bytes, rope);
  return kernels::prefill::smem_layout(c.head_dim_qk, c.head_dim_vo, kv_bytes, c.rows(), c.kv_tile, c.stages,
                                       c.paged, rope, swizzled, c.kv_warps)
      .total;
}

namespace {
std::string code(DType t) { return std::to_string(int(t)); }  // kernels::DTypeCode numbering
}  // namespace

KernelSpec prefill_spec(const PrefillKernelConfig& c, const std::string& arch) {
  KernelSpec spec;
  spec.name = c.name();
  spec.entry = "kvattn_" + spec.name;
  spec.arch = arch;
  const std::string config = "kvattn::kernels::prefill::PrefillConfig<" + code(c.q_dtype) + ", " +
                             code(c.kv_dtype) + ", " + code(c.o_dtype) + ", " +
                             std::to_string(c.head_dim_qk) + ", " + std::to_string(c.head_dim_vo) +
                             ", " + std::to_string(c.heads_per_cta) + ", " + std::to_string(c.warps) +
                             ", " + std::to_string(c.m_tiles) + ", " + std::to_string(c.kv_tile) + ", " +
                             std::to_string(c.stages) + ", " + (c.paged ? "true" : "false") + ", " +
                             std::to_string(c.page_size) + ", " + std::to_string(c.features) + "u, " +
                             (c.fast_tanh ? "true" : "false") + ", " + (c.paged && c.checked_ids ? "true" : "false") +
                             ", " + std::to_string(c.tuning) + "u" +
                             (c.kv_warps > 1 ? ", " + std::to_string(c.kv_warps) : std::string()) + ">";
  spec.source = "#include \"kernels/prefill/entry.cuh\"\n"
                "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(c.threads()) + ", " +
                std::to_string(c.min_blocks) + ") " + spec.entry +
                "(const __grid_constant__ kvattn::kernels::PrefillParams p) {\n"
                "  extern __shared__ __align__(16) char smem[];\n"
                "  kvattn::kernels::prefill::run_one_item<kvattn::kernels::prefill::PrefillMmaKernel<" +
                config + ">>(p, smem);\n}\n";
  // Experiment knob: KVATTN_PREFILL_LAZY_LOG2=1..8, the lazy rescale's threshold (score_math.cuh;
  // 8 when unset). A compile option, so the JIT key changes with it.
  if (const char* v = detail::knob("KVATTN_PREFILL_LAZY_LOG2"); v && *v) {
    const std::string t = v;
    KVATTN_CHECK(t.size() == 1 && t[0] >= '1' && t[0] <= '8', "KVATTN_PREFILL_LAZY_LOG2 is 1 to 8, not '", t, "'");
    spec.options.push_back("-DKVATTN_PREFILL_LAZY_LOG2=" + t + ".0f");
  }
  return spec;
}

KernelSpec prefill_merge_spec(const PrefillKernelConfig& c, const std::string& arch) {
  const bool sigmoid = c.features & kernels::kSigmoid;
  KernelSpec spec;
  spec.name = "prefill_merge_" + std::string(dtype_name(c.o_dtype)) + "_hd" + std::to_string(c.head_dim_vo) +
              (sigmoid ? "_sigmoid" : "");
  spec.entry = "kvattn_" + spec.name;
  spec.arch = arch;
  spec.source = "#include \"kernels/prefill/entry.cuh\"\n"
                "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(kPrefillMergeThreads) +
                ") " + spec.entry + "(const __grid_constant__ kvattn::kernels::PrefillParams p) {\n"
                "  kvattn::kernels::prefill::merge_partials<" + code(c.o_dtype) + ", " +
                std::to_string(c.head_dim_vo) + ", " + (sigmoid ? "true" : "false") + ">(p);\n}\n";
  return spec;
}

}  // namespace kvattn::cuda
