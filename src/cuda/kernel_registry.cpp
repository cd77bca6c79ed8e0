#include "cuda/kernel_registry.h"

#include "cuda/merge_kernels.h"
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

std::vector<Preset> build() {
  std::vector<Preset> p;
  // What a serving deployment needs: precompiled by default, compiled in CI.
  p.push_back({"default", "the kernels a typical deployment uses (merge; decode and prefill to come)", {}});
  auto merge = merge_kernels();
  p[0].kernels.insert(p[0].kernels.end(), merge.begin(), merge.end());
  p.push_back({"merge", "merge_states for f32, f16, bf16", merge});
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
