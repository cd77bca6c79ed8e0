#include <algorithm>
#include "cuda/kernel_registry.h"

#include "cuda/decode_kernels.h"
#include "cuda/merge_kernels.h"
#include "kernels/variants/params.cuh"
#include "kvattn/error.h"

namespace kvattn::cuda {
namespace {

std::vector<RegisteredKernel> merge_kernels() {
  std::vector<RegisteredKernel> out;
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    out.push_back({merge_states_spec(t, t, "sm_80").name,
                   [t](const std::string& arch) { return merge_states_spec(t, t, arch); }});
  return out;
}

// Decode kernels a serving deployment of common models uses: f16/bf16 (tensor cores) and fp8 KV
// (CUDA cores), head dims 64/128/256, GQA groups 1/4/8, page 16, plain and soft-capped logits.
std::vector<RegisteredKernel> decode_kernels() {
  std::vector<RegisteredKernel> out;
  auto add = [&](DType q, DType kv, int hd, int group, uint32_t features) {
    DecodeKernelConfig c = choose_decode_config(q, kv, q, hd, hd, group, 16, features);
    out.push_back({c.name(), [c](const std::string& arch) { return decode_spec(c, arch); }});
    KernelSpec m = decode_merge_spec(c, "sm_80");
    auto dup = std::find_if(out.begin(), out.end(), [&](const RegisteredKernel& k) { return k.name == m.name; });
    if (dup == out.end()) out.push_back({m.name, [c](const std::string& arch) { return decode_merge_spec(c, arch); }});
  };
  for (DType t : {DType::bf16, DType::f16})
    for (int hd : {64, 128, 256})
      for (int group : {1, 4, 8}) add(t, t, hd, group, 0);
  add(DType::bf16, DType::bf16, 128, 4, kernels::kSoftCap);
  add(DType::bf16, DType::bf16, 128, 4, kernels::kSlidingWindow);
  add(DType::bf16, DType::e4m3, 128, 4, 0);
  add(DType::bf16, DType::e5m2, 128, 8, 0);
  add(DType::bf16, DType::bf16, 128, 4, kernels::kRope);
  return out;
}

std::vector<Preset> build() {
  std::vector<Preset> p;
  // What a serving deployment needs: precompiled by default, compiled in CI.
  p.push_back({"default", "the kernels a typical deployment uses (merge, paged decode)", {}});
  auto merge = merge_kernels();
  auto decode = decode_kernels();
  p[0].kernels.insert(p[0].kernels.end(), merge.begin(), merge.end());
  p[0].kernels.insert(p[0].kernels.end(), decode.begin(), decode.end());
  p.push_back({"merge", "merge_states for f32, f16, bf16", merge});
  p.push_back({"decode", "paged batch decode: bf16/f16/fp8 KV, head dims 64-256, groups 1/4/8", decode});
  return p;
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> table = build();
  return table;
}

const Preset& find_preset(std::string_view name) {
  std::string known;
  for (const Preset& p : presets()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  detail::throw_error("unknown JIT preset '", name, "' (known: ", known, ")");
}

std::vector<KernelSpec> preset_specs(std::string_view preset, const std::string& arch) {
  std::vector<KernelSpec> specs;
  for (const auto& k : find_preset(preset).kernels) specs.push_back(k.make(arch));
  return specs;
}

}  // namespace kvattn::cuda
