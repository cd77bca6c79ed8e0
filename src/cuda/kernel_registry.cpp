#include <algorithm>
#include <optional>
#include <tuple>
#include "cuda/kernel_registry.h"

#include "cuda/append_kernels.h"
#include "cuda/decode_kernels.h"
#include "cuda/merge_kernels.h"
#include "cuda/prefill_kernels.h"
#include "cuda/rope_kernels.h"
#include "kernels/variants/params.cuh"
#include "kvattn/error.h"

namespace kvattn::cuda {
namespace {

// The soft-cap the presets compile for: 30 (Grok-1; `kvattn bench prefill`), which takes the
// fixed shift (SoftmaxForm::fixed_shift) as every bf16 cap up to 54.7 does (Gemma 2's 50 too; the shift's
// value is read at run time, so one kernel serves them all).
constexpr float kPresetSoftCap = 30.0f;

// The presets choose for the H200's limits (cuda::preset_limits) whatever arch they compile for;
// the cp.async decode kernels are what the same device runs without bulk copies.
DeviceLimits without_bulk_copies(DeviceLimits l) {
  l.cc_major = 8;
  return l;
}

// A user variant the kernel lists below compile in (kvattn jit precompile --variant), or none.
using User = std::optional<UserVariantCode>;

DecodeKernelConfig decode_for(DType q, DType kv, int hd, int group, int page_size, uint32_t features, bool bulk,
                              bool skewed, const detail::Overrides& ov, const User& user = std::nullopt) {
  DecodeProblemKey key;
  key.user_variant = user;
  key.q_dtype = key.o_dtype = q;
  key.kv_dtype = kv;
  key.head_dim_qk = key.head_dim_vo = hd;
  key.group_size = group;
  key.page_size = page_size;
  key.features = features;
  key.skewed_batch = skewed;
  const DeviceLimits limits = bulk ? preset_limits() : without_bulk_copies(preset_limits());
  return choose_decode(key, limits, ov);
}

PrefillKernelConfig prefill_for(DType q, DType kv, int dqk, int dvo, int group, bool paged, int page_size,
                                uint32_t features, int64_t qo, const detail::Overrides& ov, bool uniform_decode = false,
                                float soft_cap = kPresetSoftCap, const User& user = std::nullopt) {
  PrefillProblemKey key;
  key.user_variant = user;
  key.q_dtype = key.o_dtype = q;
  key.kv_dtype = kv;
  key.head_dim_qk = dqk;
  key.head_dim_vo = dvo;
  key.group_size = group;
  key.paged = paged;
  key.page_size = page_size;
  key.features = features;
  key.max_qo_len = qo;
  key.uniform_decode = uniform_decode;
  key.soft_cap = soft_cap;
  return choose_prefill(key, preset_limits(), ov);
}

detail::Overrides with_mma_sync(detail::Overrides ov) {
  ov.prefill_tier = detail::PrefillTier::mma_sync;
  return ov;
}

detail::Overrides with_tanh(detail::Overrides ov, detail::TanhForm t) {
  ov.prefill_tanh = t;
  return ov;
}

std::vector<RegisteredKernel> merge_kernels() {
  std::vector<RegisteredKernel> out;
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    out.push_back({merge_states_spec(t, t, "sm_80").name,
                   [t](const std::string& arch) { return merge_states_spec(t, t, arch); }});
    out.push_back({merge_pair_spec(t, t, "sm_80").name,
                   [t](const std::string& arch) { return merge_pair_spec(t, t, arch); }});
  }
  return out;
}

// The RoPE kernels (apply_rope, apply_rope_with_cos_sin_cache): every dtype, pairing, cos/sin
// source and access width (`all`), or the 16-byte f16/bf16 ones a deployment runs (the default
// preset).
std::vector<RegisteredKernel> rope_kernels(bool all) {
  std::vector<RegisteredKernel> out;
  for (DType t : {DType::bf16, DType::f16, DType::f32})
    for (auto pairs : {kernels::RopePairs::rotate_half, kernels::RopePairs::interleaved})
      for (auto source : {kernels::RopeCosSin::computed, kernels::RopeCosSin::table})
        for (int vec : {16, 0}) {
          if (!all && (t == DType::f32 || vec == 0)) continue;
          const RopeKernelConfig c{t, pairs, source, vec};
          out.push_back({c.name(), [c](const std::string& arch) { return rope_spec(c, arch); }});
        }
  return out;
}

// Decode kernels a serving deployment of common models uses: f16/bf16 and fp8 KV (tensor cores;
// fused RoPE on CUDA cores), head dims 64/128/256, GQA groups 1/4/8 and 32 (MQA), page 16, plain, soft-capped and
// windowed logits.
std::vector<RegisteredKernel> decode_kernels(const detail::Overrides& ov, const User& user = std::nullopt) {
  std::vector<RegisteredKernel> out;
  auto add = [&](DType q, DType kv, int hd, int group, uint32_t features) {
    DecodeKernelConfig c = decode_for(q, kv, hd, group, 16, features, false, false, ov, user);
    out.push_back({c.name(), [c](const std::string& arch) { return decode_spec(c, arch); }});
    // What the same problem runs on sm_90+: the bulk-copy kernel (TMA boxes at page 16).
    DecodeKernelConfig h = decode_for(q, kv, hd, group, 16, features, /*bulk=*/true, false, ov, user);
    if (h.bulk) out.push_back({h.name(), [h](const std::string& arch) { return decode_spec(h, arch); }, 90});
    // ... and for skewed batches (decode_batch_is_skewed): 2 stages.
    DecodeKernelConfig s = decode_for(q, kv, hd, group, 16, features, true, /*skewed=*/true, ov, user);
    if (s.bulk && s.name() != h.name())
      out.push_back({s.name(), [s](const std::string& arch) { return decode_spec(s, arch); }, 90});
    KernelSpec m = decode_merge_spec(c, "sm_80");
    auto dup = std::find_if(out.begin(), out.end(), [&](const RegisteredKernel& k) { return k.name == m.name; });
    if (dup == out.end()) out.push_back({m.name, [c](const std::string& arch) { return decode_merge_spec(c, arch); }});
  };
  for (DType t : {DType::bf16, DType::f16})
    for (int hd : {64, 128, 256})
      for (int group : {1, 4, 8}) add(t, t, hd, group, 0);
  // MQA and large groups: 32 heads per CTA (two M tiles).
  add(DType::bf16, DType::bf16, 128, 32, 0);
  add(DType::bf16, DType::e4m3, 128, 32, 0);
  add(DType::bf16, DType::bf16, 128, 4, kernels::kSoftCap);
  add(DType::bf16, DType::bf16, 128, 4, kernels::kSlidingWindow);
  for (int group : {1, 4, 8}) add(DType::bf16, DType::e4m3, 128, group, 0);
  add(DType::f16, DType::e4m3, 128, 4, 0);
  add(DType::bf16, DType::e5m2, 128, 8, 0);
  add(DType::bf16, DType::e4m3, 64, 4, 0);   // rows of 64 bytes: no TMA boxes, row copies
  add(DType::bf16, DType::e4m3, 256, 4, 0);
  add(DType::bf16, DType::e4m3, 128, 4, kernels::kSoftCap);
  add(DType::bf16, DType::e4m3, 128, 4, kernels::kSlidingWindow);
  add(DType::bf16, DType::bf16, 128, 4, kernels::kRope);
  add(DType::bf16, DType::e4m3, 128, 4, kernels::kRope);  // CUDA cores
  // Pages of fewer than 16 tokens keep the row copies on sm_90+ (DecodeBulkKernel): page 1.
  for (DType t : {DType::bf16, DType::f16})
    for (bool skewed : {false, true}) {
      DecodeKernelConfig r = decode_for(t, t, 128, 4, 1, 0, /*bulk=*/true, skewed, ov, user);
      if (r.bulk) out.push_back({r.name(), [r](const std::string& arch) { return decode_spec(r, arch); }, 90});
    }
  return out;
}

// A prefill kernel, for a paged one its twin that reads a device-resident page table (ids checked
// in the kernel), and its merge kernel unless already listed. A Hopper-tier kernel is compiled
// for sm_90a only, its mma.sync twin (`fallback`, what other archs choose) for the archs below.
void add_prefill_kernel(std::vector<RegisteredKernel>& out, const PrefillKernelConfig& c,
                        const std::optional<PrefillKernelConfig>& fallback = std::nullopt) {
  const bool wgmma = c.tier == detail::PrefillTier::wgmma;
  for (bool checked : {false, true}) {
    if (checked && !c.paged) break;
    PrefillKernelConfig d = c;
    d.checked_ids = checked;
    out.push_back({d.name(), [d](const std::string& arch) { return prefill_spec(d, arch); }, wgmma ? 90 : 0});
    if (wgmma && fallback) {
      PrefillKernelConfig f = *fallback;
      f.checked_ids = checked;
      out.push_back({f.name(), [f](const std::string& arch) { return prefill_spec(f, arch); }, 0, 90});
    }
  }
  KernelSpec m = prefill_merge_spec(c, "sm_80");
  auto dup = std::find_if(out.begin(), out.end(), [&](const RegisteredKernel& k) { return k.name == m.name; });
  if (dup == out.end()) out.push_back({m.name, [c](const std::string& arch) { return prefill_merge_spec(c, arch); }});
}

// A prefill kernel as `make` chooses it under `ov`, with its mma.sync twin when that is a Hopper-tier
// kernel.
template <class Make>
void add_prefill(std::vector<RegisteredKernel>& out, const detail::Overrides& ov, Make make) {
  add_prefill_kernel(out, make(ov), make(with_mma_sync(ov)));
}

// Prefill/append kernels of the same deployments: causal bf16/f16 prefill over ragged and paged
// (page 16) KV for head dims 64/128/256 and 192x128, GQA group 4, long and short (append) query
// runs; one of each variant family; fp8 KV.
std::vector<RegisteredKernel> prefill_kernels(const detail::Overrides& ov, const User& user = std::nullopt) {
  std::vector<RegisteredKernel> out;
  auto add = [&](DType q, DType kv, int dqk, int dvo, int group, bool paged, uint32_t features, int64_t qo,
                 int page_size = 16) {
    add_prefill(out, ov, [&](const detail::Overrides& o) {
      return prefill_for(q, kv, dqk, dvo, group, paged, page_size, features, qo, o, false, kPresetSoftCap, user);
    });
  };
  for (DType t : {DType::bf16, DType::f16})
    for (int hd : {64, 128, 256})
      for (bool paged : {false, true}) add(t, t, hd, hd, 4, paged, kernels::kCausal, 4096);
  add(DType::bf16, DType::bf16, 192, 128, 1, false, kernels::kCausal, 4096);
  add(DType::bf16, DType::bf16, 128, 128, 8, true, kernels::kCausal, 1);   // short appends
  add(DType::bf16, DType::bf16, 128, 128, 4, true, kernels::kCausal, 8);
  add(DType::bf16, DType::bf16, 128, 128, 4, false, 0, 4096);
  add(DType::bf16, DType::bf16, 128, 128, 4, false, kernels::kCausal | kernels::kSoftCap, 4096);
  // The long soft-cap kernel's exact-tanh form too (KVATTN_PREFILL_TANH=exact), so CI compiles both.
  add_prefill(out, ov, [&](const detail::Overrides& o) {
    return prefill_for(DType::bf16, DType::bf16, 128, 128, 4, false, 16, kernels::kCausal | kernels::kSoftCap, 4096,
                       with_tanh(o, detail::TanhForm::exact), false, kPresetSoftCap, user);
  });
  add(DType::bf16, DType::bf16, 128, 128, 4, true, kernels::kCausal | kernels::kSlidingWindow, 4096);
  add(DType::bf16, DType::bf16, 128, 128, 4, false, kernels::kCausal | kernels::kAlibi, 4096);
  add(DType::bf16, DType::bf16, 128, 128, 4, true, kernels::kCustomMask, 4096);
  add(DType::bf16, DType::bf16, 128, 128, 4, false, kernels::kSigmoid, 4096);
  add(DType::bf16, DType::bf16, 128, 128, 4, true, kernels::kCausal | kernels::kRope, 4096);
  add(DType::bf16, DType::e4m3, 128, 128, 4, true, kernels::kCausal, 4096);
  return out;
}

// What `kvattn bench prefill` runs beyond the deployment kernels (MHA 32/32: group 1; pages of 1
// and 16): precompiled before a device call, so that the call spends no time compiling, and read
// by scripts/kernel-frames.
std::vector<RegisteredKernel> prefill_bench_kernels(const detail::Overrides& ov) {
  std::vector<RegisteredKernel> out;
  auto add = [&](int hd, bool paged, int page_size, uint32_t features) {
    add_prefill(out, ov, [&](const detail::Overrides& o) {
      return prefill_for(DType::bf16, DType::bf16, hd, hd, 1, paged, page_size, features, 16384, o);
    });
  };
  for (int hd : {64, 128, 256})
    for (uint32_t features : {0u, uint32_t(kernels::kCausal)}) add(hd, false, 16, features);
  add(128, true, 16, kernels::kCausal);
  add(128, true, 1, kernels::kCausal);
  // Soft-cap in both tanh forms (tanh.approx is the long shape's default; KVATTN_PREFILL_TANH=exact).
  for (detail::TanhForm tanh : {detail::TanhForm::approx, detail::TanhForm::exact}) {
    for (int hd : {128, 64, 256})
      add_prefill(out, ov, [&](const detail::Overrides& o) {
        return prefill_for(DType::bf16, DType::bf16, hd, hd, 1, false, 16, kernels::kCausal | kernels::kSoftCap, 16384,
                           with_tanh(o, tanh));
      });
    add_prefill(out, ov, [&](const detail::Overrides& o) {
      return prefill_for(DType::bf16, DType::bf16, 128, 128, 4, false, 16, kernels::kCausal | kernels::kSoftCap, 16384,
                         with_tanh(o, tanh));
    });
  }
  add_prefill(out, ov, [&](const detail::Overrides& o) {
    return prefill_for(DType::bf16, DType::bf16, 128, 128, 4, false, 16, kernels::kCausal, 16384, o, false, 0.0f);
  });
  return out;
}

std::vector<Preset> build(const detail::Overrides& ov) {
  std::vector<Preset> p;
  // What a serving deployment needs: precompiled by default, compiled in CI.
  p.push_back({"default", "the kernels a typical deployment uses (merge, paged decode, prefill, append, RoPE)", {}});
  auto merge = merge_kernels();
  auto decode = decode_kernels(ov);
  auto prefill = prefill_kernels(ov);
  p[0].kernels.insert(p[0].kernels.end(), merge.begin(), merge.end());
  p[0].kernels.insert(p[0].kernels.end(), decode.begin(), decode.end());
  p[0].kernels.push_back({"append_paged_kv", [](const std::string& arch) { return append_paged_spec(arch); }});
  p[0].kernels.insert(p[0].kernels.end(), prefill.begin(), prefill.end());
  auto rope = rope_kernels(false);
  p[0].kernels.insert(p[0].kernels.end(), rope.begin(), rope.end());
  p.push_back({"merge", "merge_states and merge_state for f32, f16, bf16", merge});
  p.push_back({"rope", "apply_rope and apply_rope_with_cos_sin_cache: f32/f16/bf16, rotate-half and interleaved, "
                       "computed and table cos/sin, 16-byte and scalar accesses",
               rope_kernels(true)});
  // The transposed tensor-core decode (KVATTN_DECODE_KERNEL=transposed), compiled here only.
  for (auto [t, hd, group, features] : {std::tuple{DType::bf16, 128, 4, 0u}, std::tuple{DType::bf16, 128, 8, 0u},
                                        std::tuple{DType::f16, 64, 16, 0u}, std::tuple{DType::bf16, 256, 1, 0u},
                                        std::tuple{DType::bf16, 128, 4, uint32_t(kernels::kSoftCap)},
                                        std::tuple{DType::bf16, 128, 4, uint32_t(kernels::kSlidingWindow)},
                                        std::tuple{DType::bf16, 128, 4, uint32_t(kernels::kSigmoid)}}) {
    DecodeKernelConfig c = decode_for(t, t, hd, group, 16, features, false, false, ov);
    c.transposed = true;
    decode.push_back({c.name(), [c](const std::string& arch) { return decode_spec(c, arch); }});
  }
  // GQA decode on the prefill kernels' decode shape (cuda::decode_uses_prefill_kernels: the default
  // before sm_90 for groups 4-16; KVATTN_DECODE_KERNEL=prefill and `bench decode --via-prefill`).
  for (int group : {4, 8})
    for (bool uniform : {false, true})
      add_prefill(decode, ov, [&](const detail::Overrides& o) {
        return prefill_for(DType::bf16, DType::bf16, 128, 128, group, true, 16, 0, 1, o, uniform, 0.0f);
      });
  p.push_back({"decode", "paged batch decode: bf16/f16/fp8 KV, head dims 64-256, groups 1/4/8", decode});
  p.push_back({"prefill", "batch prefill/append: ragged and paged, head dims 64-256, variants, fp8 KV", prefill});
  p.push_back({"bench-prefill", "what `kvattn bench prefill` adds: MHA (group 1), pages of 1 and 16, soft-cap",
               prefill_bench_kernels(ov)});
  return p;
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> table = build({});
  return table;
}

std::vector<Preset> presets_with(const detail::Overrides& overrides) { return build(overrides); }

std::vector<KernelSpec> user_variant_specs(const CustomVariant& variant, const std::string& arch) {
  const User user = user_variant_code(variant);
  const detail::Overrides none;
  std::vector<RegisteredKernel> kernels = decode_kernels(none, user);
  for (RegisteredKernel& k : prefill_kernels(none, user)) kernels.push_back(std::move(k));
  const int sm = arch_sm(arch);
  std::vector<KernelSpec> specs;
  for (const RegisteredKernel& k : kernels) {
    if (!k.for_arch(sm)) continue;
    const bool seen = std::any_of(specs.begin(), specs.end(), [&](const KernelSpec& s) { return s.name == k.name; });
    if (!seen) specs.push_back(k.make(arch));
  }
  return specs;
}

const Preset& find_preset(std::string_view name) {
  std::string known;
  for (const Preset& p : presets()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  detail::throw_error("unknown JIT preset '", name, "' (known: ", known, ")");
}

std::vector<KernelSpec> preset_specs(std::string_view preset, const std::string& arch,
                                     const detail::Overrides* overrides) {
  std::vector<KernelSpec> specs;
  const int sm = arch_sm(arch);
  const Preset& known = find_preset(preset);  // kvattn::Error naming the presets for an unknown name
  std::vector<Preset> with;
  if (overrides) with = presets_with(*overrides);
  const Preset& p = overrides ? *std::find_if(with.begin(), with.end(), [&](const Preset& x) { return x.name == preset; })
                              : known;
  for (const auto& k : p.kernels)
    if (k.for_arch(sm)) specs.push_back(k.make(arch));
  return specs;
}

}  // namespace kvattn::cuda
