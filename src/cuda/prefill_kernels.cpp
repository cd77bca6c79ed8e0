#include "cuda/prefill_kernels.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "kernels/prefill/smem_layout.cuh"
#include "kernels/prefill/wgmma_layout.cuh"
#include "kernels/variants/params.cuh"
#include "kvattn/error.h"

namespace kvattn::cuda {

std::string PrefillKernelConfig::name() const {
  // Appends only: `"x" + std::to_string(...)` makes GCC 12 warn (-Wrestrict, a false positive).
  std::string n = tier == detail::PrefillTier::wgmma ? "prefill_wgmma_" : "prefill_";
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
  if (fast_tanh && (features & kernels::kSoftCap)) n += "_tanh-approx";
  if (tuning != kernels::prefill::PrefillTuning{}) add("_", detail::tuning_name(tuning));
  if (lazy_log2 > 0) add("_lazylog", std::to_string(lazy_log2));
  return n + variant_name_suffix(user_variant);
}

detail::PrefillDecodeShape prefill_decode_shape(bool uniform_decode, const detail::Overrides& overrides) {
  // Four KV warps of 16 tokens, 2 stages, 3 CTAs per SM: measured fastest of eight shapes for GQA
  // decode (H200, bf16, hd 128, group 4, page 16; 2026-11-30 at 53a0a95, docs/perf/HISTORY.md):
  // 64 x 4096 4,192-4,196 GB/s, 64 Zipf lengths 98% of that; the one-warp shape before it 3,985
  // and 85%. Uniform batches: six warps at 2 CTAs per SM (a later call, same kernels: 64 x 4096
  // 4,300-4,307, 256 x 4096 4,479-4,482, against 4,229-4,239 and 4,373-4,375).
  if (overrides.prefill_decode_shape) return *overrides.prefill_decode_shape;
  return uniform_decode ? detail::PrefillDecodeShape{6, 16, 2, 2} : detail::PrefillDecodeShape{4, 16, 2, 3};
}

namespace {
using kernels::prefill::PrefillTuning;
using kernels::prefill::SoftmaxForm;
using kernels::prefill::TileSplit;

// The tunings the table below names (smem_layout.cuh says what each choice does).
constexpr PrefillTuning kLazyUnrolled{SoftmaxForm::lazy_rescale, false, true, false, false, false, TileSplit::whole};
constexpr PrefillTuning kLazyOnly{SoftmaxForm::lazy_rescale, false, false, false, false, false, TileSplit::whole};
// Lazy rescale, swizzled K/V, unrolled Q K^T, P packed early, lean copies.
constexpr PrefillTuning kAllFive{SoftmaxForm::lazy_rescale, true, true, true, true, false, TileSplit::whole};

PrefillTuning with(PrefillTuning t, auto&& edit) {
  edit(t);
  return t;
}
}  // namespace

PrefillTuning prefill_tuning_for(uint32_t features, int dqk, int dvo, int kv_bytes, int heads_per_cta, bool paged,
                                 bool fast_tanh) {
  using namespace kernels::prefill;
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
  if (features & kernels::kSoftCap)
    return fast_tanh ? with(kLazyUnrolled, [](PrefillTuning& t) { t.pack_p = t.lean_copies = true; }) : kLazyUnrolled;
  const bool whole_tile = (features & kernels::kAlibi) != 0;
  auto base = [&](PrefillTuning t) {
    t.whole_tile_transform = whole_tile;
    return t;
  };
  if (d <= 64) return with(base(kLazyUnrolled), [&](PrefillTuning& t) { t.lean_copies = !paged; });
  // Above hd 128, plain softmax over ragged 2-byte K/V goes by halves, each with its own running
  // maximum (H200, at 2780334 and a97c407: hd 256 causal 294 -> 311; hd 128 -7%, hd 64 -1%,
  // quarters slower).
  const bool halves = !paged && kv_bytes == 2 &&
                      !(features & (kernels::kAlibi | kernels::kSigmoid | kernels::kCustomMask | kernels::kRope));
  if (d > 128)
    return with(base(kLazyUnrolled), [&](PrefillTuning& t) {
      t.swizzle_kv = true;
      t.lean_copies = !paged;
      if (halves) t.split = TileSplit::halves;
    });
  if (heads_per_cta == 1) return base(kAllFive);
  if (!paged) return base(kLazyUnrolled);
  const bool swizzled = swizzles_kv(true, dqk, dvo, kv_bytes, (features & kernels::kRope) != 0);
  return base(swizzled && !(features & kernels::kCustomMask) ? kAllFive : kLazyOnly);
}

PrefillTileShape prefill_long_shape(detail::PrefillLongShape shape, int dqk, int dvo) {
  using detail::PrefillLongShape;
  const int d = std::max(dqk, dvo);
  const int cls = d <= 64 ? 0 : d <= 128 ? 1 : 2;
  struct Row {
    PrefillLongShape name;
    PrefillTileShape shape[3];
  };
  // m2k64 is the fastest on the H200 (docs/PERFORMANCE.md). Soft-cap at head dims 65-128 took
  // m2k48 until 29ac2ce (m2k64 spilled); with the soft-cap tuning m2k64 measured 308.6 against
  // m2k48's 270.9 TFLOP/s (1 x 16k causal; 2026-11-30, docs/perf/HISTORY.md).
  static constexpr Row kRows[] = {
      {PrefillLongShape::m2k32, {{4, 2, 64, 2, 2}, {4, 2, 32, 3, 2}, {4, 1, 32, 2, 2}}},
      {PrefillLongShape::m2k64, {{4, 2, 64, 3, 2}, {4, 2, 64, 2, 2}, {8, 1, 64, 2, 1}}},
      {PrefillLongShape::m1k64, {{8, 1, 64, 2, 1}, {8, 1, 64, 2, 1}, {8, 1, 32, 2, 1}}},
      {PrefillLongShape::m2w8, {{8, 2, 64, 2, 1}, {8, 2, 32, 2, 1}, {8, 1, 64, 2, 1}}},
      {PrefillLongShape::m2k48, {{4, 2, 48, 3, 2}, {4, 2, 48, 2, 2}, {8, 1, 48, 2, 1}}},
      {PrefillLongShape::m2k48s3, {{4, 2, 48, 3, 2}, {4, 2, 48, 3, 2}, {8, 1, 48, 2, 1}}},
  };
  for (const Row& r : kRows)
    if (shape == r.name) return r.shape[cls];
  detail::throw_error("internal: no tile shape for ", detail::name_of(shape));
}

namespace {
// Whether soft-cap's fixed shift (SoftmaxForm::fixed_shift, smem_layout.cuh) applies: bf16,
// soft-cap under softmax without ALiBi, a cap within cap_shift_fits.
bool cap_shift_applies(DType q, uint32_t features, float soft_cap) {
  using namespace kernels;
  return q == DType::bf16 && (features & kSoftCap) != 0 && (features & (kSigmoid | kAlibi)) == 0 &&
         prefill::cap_shift_fits(soft_cap * 1.4426950408889634f);
}

// The long shape's tuning where the shift applies (H200, 2026-11-30 at 7bc9489,
// docs/perf/HISTORY.md; 1 x 16k causal): the fixed shift with the other four choices, the
// whole-tile transform and the tile in halves: hd 64 179.7 (no shift) -> 215.0, hd 128
// 305.6 -> 329.5, 32/8 302.7 -> 326.2; above hd 128 in quarters (hd 256 at cap 50 237.0 -> 307.8,
// its plain twin 294.6). tanh.approx in quarters everywhere (hd 128 341 -> 359 over its lazy
// tuning's 285, hd 256 261 -> 321) except at hd 64, where halves on two stages run faster (at
// 1613d39: 252 in quarters on three stages, 264 in halves on two; choose_prefill sets the stages).
PrefillTuning shifted_soft_cap_tuning(int head_dim, bool fast_tanh) {
  PrefillTuning t{SoftmaxForm::fixed_shift, true, true, true, true, true, TileSplit::halves};
  if ((fast_tanh && head_dim > 64) || head_dim > 128) t.split = TileSplit::quarters;
  return t;
}

// The fixed shift wherever it applies, and nowhere else (it would overflow there). An overriding
// tuning that names another softmax form keeps it (A/B runs).
void set_cap_shift(PrefillKernelConfig& c, float soft_cap, const detail::Overrides& ov) {
  const bool applies = cap_shift_applies(c.q_dtype, c.features, soft_cap);
  const bool override_declines = ov.prefill_tuning && ov.prefill_tuning->softmax != SoftmaxForm::fixed_shift;
  if (applies && !override_declines)
    c.tuning.softmax = SoftmaxForm::fixed_shift;
  else if (c.tuning.softmax == SoftmaxForm::fixed_shift)
    c.tuning.softmax = SoftmaxForm::lazy_rescale;
}

// The Hopper tier for a long query run when it applies (choose_prefill's first rule): fills `c`
// (dtypes, head dims, features, paging and heads per CTA set) and returns true, else leaves it.
bool choose_wgmma(PrefillKernelConfig& c, const DeviceLimits& limits, const detail::Overrides& ov, float soft_cap) {
  using namespace kernels;
  const bool applies = limits.has_wgmma() && c.kv_dtype == c.q_dtype && !(c.features & kRope) &&
                       c.head_dim_qk % 64 == 0 && c.head_dim_vo % 64 == 0 && c.heads_per_cta <= 128;
  if (!applies || ov.prefill_tier.value_or(detail::PrefillTier::wgmma) != detail::PrefillTier::wgmma) return false;
  PrefillKernelConfig w = c;
  w.tier = detail::PrefillTier::wgmma;
  w.warps = 8;
  w.m_tiles = 1;
  w.kv_warps = 1;
  w.kv_tile = std::max(c.head_dim_qk, c.head_dim_vo) <= 128 ? 128 : 64;
  w.stages = 2;
  w.min_blocks = 1;
  // A user variant computes soft-cap with tanhf in its hook path (score_math.cuh), never tanh.approx.
  const bool soft_capped = (c.features & kSoftCap) != 0 && !c.user_variant;
  w.fast_tanh = soft_capped && ov.prefill_tanh != detail::TanhForm::exact;
  // Of the tuning only the softmax form and the whole-tile transform apply: the rest is cleared so
  // that the name says what the kernel does.
  PrefillTuning lazy;
  lazy.softmax = SoftmaxForm::lazy_rescale;
  lazy.whole_tile_transform = (c.features & kAlibi) != 0;
  const PrefillTuning tuning = ov.prefill_tuning.value_or(lazy);
  w.tuning = PrefillTuning{};
  w.tuning.softmax = tuning.softmax;
  w.tuning.whole_tile_transform = tuning.whole_tile_transform;
  set_cap_shift(w, soft_cap, ov);
  if (prefill_smem_bytes(w) > limits.smem_per_block_optin) return false;
  c = w;
  return true;
}
}  // namespace

PrefillKernelConfig choose_prefill(const PrefillProblemKey& key, const DeviceLimits& limits,
                                   const detail::Overrides& ov) {
  const DType q = key.q_dtype, kv = key.kv_dtype, o = key.o_dtype;
  const int dqk = key.head_dim_qk, dvo = key.head_dim_vo, group = key.group_size;
  const uint32_t features = key.features;
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
  // A user variant's scores take the per-key hook path (score_math.cuh): no soft-cap fixed shift.
  const float soft_cap = key.user_variant ? 0.0f : key.soft_cap;
  PrefillKernelConfig c;
  c.user_variant = key.user_variant;
  c.q_dtype = q;
  c.kv_dtype = kv;
  c.o_dtype = o;
  c.head_dim_qk = dqk;
  c.head_dim_vo = dvo;
  c.features = features;
  c.paged = key.paged;
  c.page_size = key.paged && key.page_size > 0 && key.page_size <= 128 && (key.page_size & (key.page_size - 1)) == 0
                    ? key.page_size
                    : 0;
  c.lazy_log2 = ov.prefill_lazy_log2.value_or(0);
  // Soft-cap's tanh: tanh.approx.f32 (one MUFU op, FlashInfer's form) on the long shape, where
  // the MUFU pipe bounds the kernel (hd 128: 5% cost against the exact form's 12%; at 7bc9489);
  // the exact ex2 + rcp form on the short and decode shapes, which memory bounds (it costs nothing
  // there). Overrides::prefill_tanh forces one form on every shape.
  const bool soft_capped = (features & kernels::kSoftCap) != 0 && !key.user_variant;  // see choose_wgmma
  c.fast_tanh = soft_capped && ov.prefill_tanh == detail::TanhForm::approx;
  const bool wide = std::max(dqk, dvo) > 128;
  const int max_warps = wide ? 4 : 8;
  c.heads_per_cta = 1;
  for (int g = 1; g <= group && g <= 128; ++g)
    if (group % g == 0) c.heads_per_cta = g;
  const int64_t rows = std::max<int64_t>(1, key.max_qo_len) * c.heads_per_cta;
  if (2 * rows >= 128 && choose_wgmma(c, limits, ov, soft_cap)) return c;
  const detail::PrefillLongShape long_shape = ov.prefill_long_shape.value_or(detail::PrefillLongShape::m2k64);
  const PrefillTileShape s = prefill_long_shape(long_shape, dqk, dvo);
  const int long_rows = s.warps * 16 * s.m_tiles;
  if (2 * rows >= long_rows && c.heads_per_cta <= long_rows) {
    c.warps = s.warps;
    c.m_tiles = s.m_tiles;
    c.kv_tile = s.kv_tile;
    c.stages = s.stages;
    c.min_blocks = s.min_blocks;
    c.fast_tanh = soft_capped && ov.prefill_tanh != detail::TanhForm::exact;
    c.tuning = ov.prefill_tuning.value_or(
        prefill_tuning_for(features, dqk, dvo, int(dtype_size(kv)), c.heads_per_cta, key.paged, c.fast_tanh));
    // (Measured with 2-byte K/V as it lands; fp8, RoPE and custom masks keep their tuning and the shift.)
    const bool shifted_long = cap_shift_applies(q, features, soft_cap) && kv == q &&
                              !(features & (kernels::kRope | kernels::kCustomMask));
    if (shifted_long && !ov.prefill_tuning) c.tuning = shifted_soft_cap_tuning(std::max(dqk, dvo), c.fast_tanh);
    // tanh.approx at hd 64 on m2k64: two stages (shifted_soft_cap_tuning; measured on ragged KV,
    // the exact form gains nothing from them).
    if (shifted_long && c.fast_tanh && std::max(dqk, dvo) <= 64 && long_shape == detail::PrefillLongShape::m2k64)
      c.stages = 2;
    // The swizzle only applies to K/V copied as they are: keep the name true to the code.
    if (!kernels::prefill::swizzles_kv(true, dqk, dvo, int(dtype_size(kv)), (features & kernels::kRope) != 0))
      c.tuning.swizzle_kv = false;
    // Each of min_blocks CTAs gets its share of the SM less the per-block reservation, and no CTA
    // more than the device allows one block.
    const int64_t budget = limits.smem_per_cta(c.min_blocks);
    // Halved to a multiple of 16 (the MMA's k): 64 -> 32, 48 -> 32.
    while (prefill_smem_bytes(c) > budget && c.kv_tile > 32) c.kv_tile = std::max(32, (c.kv_tile / 2 + 15) / 16 * 16);
    while (prefill_smem_bytes(c) > budget && c.stages > 2) --c.stages;
    // Still over (Ada's 100 KB SM holds one such CTA): ask __launch_bounds__ for the CTAs that fit,
    // so the register cap does not assume residency the shared memory denies.
    while (c.min_blocks > 1 && prefill_smem_bytes(c) > limits.smem_per_cta(c.min_blocks)) --c.min_blocks;
    set_cap_shift(c, soft_cap, ov);
    return c;
  }
  c.warps = 1;
  while (c.warps < max_warps && int64_t(c.warps) * 16 < rows) c.warps *= 2;
  while (c.warps * 16 < c.heads_per_cta) c.warps *= 2;  // the M tile holds at least one token
  c.kv_tile = wide || c.warps == 1 ? 32 : 64;
  c.stages = 2;
  const int64_t max_smem_per_block = limits.smem_per_block_optin;
  if (c.warps == 1) {
    const detail::PrefillDecodeShape d = prefill_decode_shape(key.uniform_decode, ov);
    c.kv_warps = d.kv_warps;
    c.kv_tile = d.kv_warps * d.warp_tokens;
    c.stages = d.stages;
    // All five code-generation choices (H200 at 53a0a95: 4x16s2b3 64 x 4096 4,192 GB/s with them,
    // 3,990 without).
    c.tuning = ov.prefill_tuning.value_or(kAllFive);
    if (!kernels::prefill::swizzles_kv(true, dqk, dvo, int(dtype_size(kv)), (features & kernels::kRope) != 0))
      c.tuning.swizzle_kv = false;
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
    // No more CTAs per SM in __launch_bounds__ than shared memory lets run: the bound only caps
    // registers.
    c.min_blocks = d.min_blocks;
    while (c.min_blocks > 1 &&
           int64_t(c.min_blocks) * (prefill_smem_bytes(c) + limits.reserved_smem_per_block) > limits.smem_per_sm)
      --c.min_blocks;
    set_cap_shift(c, soft_cap, ov);
    return c;
  }
  while (prefill_smem_bytes(c) > max_smem_per_block && c.kv_tile > 32) c.kv_tile /= 2;
  set_cap_shift(c, soft_cap, ov);
  return c;
}

int prefill_smem_bytes(const PrefillKernelConfig& c) {
  if (c.tier == detail::PrefillTier::wgmma)
    return kernels::prefill::wgmma_smem_layout(c.head_dim_qk, c.head_dim_vo, c.rows(), c.kv_tile, c.stages, c.paged)
        .total;
  const bool rope = (c.features & kernels::kRope) != 0;
  const int kv_bytes = int(dtype_size(c.kv_dtype));
  const bool swizzled =
      kernels::prefill::swizzles_kv(c.tuning.swizzle_kv, c.head_dim_qk, c.head_dim_vo, kv_bytes, rope);
  return kernels::prefill::smem_layout(c.head_dim_qk, c.head_dim_vo, kv_bytes, c.rows(), c.kv_tile, c.stages,
                                       c.paged, rope, swizzled, c.kv_warps)
      .total;
}

namespace {
std::string code(DType t) { return std::to_string(int(t)); }  // kernels::DTypeCode numbering
}  // namespace

namespace {
const char* softmax_form(SoftmaxForm f) {
  return f == SoftmaxForm::lazy_rescale ? "lazy_rescale" : f == SoftmaxForm::fixed_shift ? "fixed_shift" : "running_max";
}
const char* tile_split(TileSplit t) {
  return t == TileSplit::halves ? "halves" : t == TileSplit::quarters ? "quarters" : "whole";
}
const char* boolean(bool b) { return b ? "true" : "false"; }
}  // namespace

KernelSpec prefill_spec(const PrefillKernelConfig& c, const std::string& arch) {
  KernelSpec spec;
  spec.name = c.name();
  spec.entry = entry_symbol(spec.name);
  spec.arch = arch;
  const PrefillTuning& t = c.tuning;
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
  member("int", "warps", std::to_string(c.warps));
  member("int", "m_tiles", std::to_string(c.m_tiles));
  member("int", "kv_warps", std::to_string(c.kv_warps));
  member("int", "kv_tile", std::to_string(c.kv_tile));
  member("int", "stages", std::to_string(c.stages));
  member("bool", "paged", boolean(c.paged));
  member("int", "page_size", std::to_string(c.page_size));
  member("bool", "checked_ids", boolean(c.paged && c.checked_ids));
  member("uint32_t", "features", std::to_string(c.features) + "u");
  member("bool", "fast_tanh", boolean(c.fast_tanh));
  member("kvattn::kernels::prefill::PrefillTuning", "tuning",
         std::string("{kvattn::kernels::prefill::SoftmaxForm::") + softmax_form(t.softmax) + ", " + boolean(t.swizzle_kv) +
             ", " + boolean(t.unroll_qk) + ", " + boolean(t.pack_p) + ", " + boolean(t.lean_copies) + ", " +
             boolean(t.whole_tile_transform) + ", kvattn::kernels::prefill::TileSplit::" + tile_split(t.split) + "}");
  config += variant_member(c.user_variant, c.features) + "};\n";
  if (c.user_variant) {
    spec.user_file = c.user_variant->file;
    spec.user_source = c.user_variant->source;
  }
  const bool wgmma = c.tier == detail::PrefillTier::wgmma;
  // The wgmma tile layout swizzles on 1024-byte periods of shared addresses.
  spec.source = std::string(wgmma ? "#include \"kernels/prefill/prefill_wgmma_kernel.cuh\"\n" : "") +
                "#include \"kernels/prefill/entry.cuh\"\n" + variant_definitions(c.user_variant) + config +
                user_softmax_record(c.user_variant) +
                "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(c.threads()) + ", " +
                std::to_string(c.min_blocks) + ") " + spec.entry +
                "(const __grid_constant__ kvattn::kernels::PrefillParams p) {\n"
                "  extern __shared__ __align__(" + (wgmma ? "1024" : "16") + ") char smem[];\n"
                "  kvattn::kernels::prefill::run_one_item<kvattn::kernels::prefill::" +
                (wgmma ? "PrefillWgmmaKernel" : "PrefillMmaKernel") +
                "<kvattn::kernels::prefill::PrefillConfig<KernelConfig>>>(p, smem);\n}\n";
  // The lazy rescale's threshold (score_math.cuh; 8 by default): a compile option, in the JIT key.
  if (c.lazy_log2 > 0) spec.options.push_back("-DKVATTN_PREFILL_LAZY_LOG2=" + std::to_string(c.lazy_log2) + ".0f");
  return spec;
}

KernelSpec prefill_merge_spec(const PrefillKernelConfig& c, const std::string& arch) {
  const bool sigmoid = c.features & kernels::kSigmoid;
  // The merge reads only the softmax switch of the built-in features (and a user variant's hooks,
  // with the query's position from the page table's form).
  const uint32_t features = c.user_variant ? c.features : sigmoid ? uint32_t(kernels::kSigmoid) : 0u;
  const bool paged = c.user_variant && c.paged;
  KernelSpec spec;
  spec.name = "prefill_merge_" + std::string(dtype_name(c.o_dtype)) + "_hd" + std::to_string(c.head_dim_vo) +
              (c.user_variant ? std::string(paged ? "_paged" : "_ragged") + "_f" + std::to_string(features)
                              : sigmoid ? "_sigmoid" : "") +
              variant_name_suffix(c.user_variant);
  spec.entry = entry_symbol(spec.name);
  spec.arch = arch;
  if (c.user_variant) {
    spec.user_file = c.user_variant->file;
    spec.user_source = c.user_variant->source;
  }
  spec.source = "#include \"kernels/prefill/entry.cuh\"\n" + variant_definitions(c.user_variant) +
                "struct KernelConfig {\n" + variant_member(c.user_variant, features) + "};\n"
                "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(kPrefillMergeThreads) +
                ") " + spec.entry + "(const __grid_constant__ kvattn::kernels::PrefillParams p) {\n"
                "  kvattn::kernels::prefill::merge_partials<" + code(c.o_dtype) + ", " +
                std::to_string(c.head_dim_vo) + ", KernelConfig::Variant, " + (paged ? "true" : "false") +
                ">(p);\n}\n";
  return spec;
}

}  // namespace kvattn::cuda
