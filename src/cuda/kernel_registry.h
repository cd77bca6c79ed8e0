// The table of built-in kernels: named presets, each a list of kernels that `kvattn jit
// precompile --preset NAME` compiles and CI compiles for sm_90a and sm_80 (a kernel that does not
// compile fails CI). Add a kernel family by appending its spec builders to a preset in
// kernel_registry.cpp.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/overrides.h"
#include "cuda/jit.h"
#include "kvattn/variant.h"

namespace kvattn::cuda {

struct RegisteredKernel {
  std::string name;                                     // same as the spec's name
  std::function<KernelSpec(const std::string& arch)> make;
  int min_sm = 0;    // compiled only for archs from this one on (90: Hopper instructions), 0: any
  int below_sm = 0;  // compiled only for archs below this one (a fallback those archs run), 0: any
  bool for_arch(int sm) const { return sm >= min_sm && (below_sm == 0 || sm < below_sm); }
};

struct Preset {
  std::string name;
  std::string description;
  std::vector<RegisteredKernel> kernels;
};

// The presets as the kernel choices make them without overrides (the environment's KVATTN_*
// variables do not change what a preset compiles), and with given overrides (`kvattn jit
// precompile --with-overrides`: the kernels a measurement under those variables will run).
const std::vector<Preset>& presets();
std::vector<Preset> presets_with(const detail::Overrides& overrides);
// Throws kvattn::Error naming the known presets when `name` is not one.
const Preset& find_preset(std::string_view name);
// The preset's kernels for `arch` ("sm_90a", "sm_80"...), leaving out those whose min_sm is above it.
std::vector<KernelSpec> preset_specs(std::string_view preset, const std::string& arch,
                                     const detail::Overrides* overrides = nullptr);
// The default preset's decode and prefill kernels (and their merge kernels) with a user variant
// composed in, for `arch` (`kvattn jit precompile --variant`). Throws kvattn::Error for a
// variant whose declaration is invalid (CustomVariant::validate).
std::vector<KernelSpec> user_variant_specs(const CustomVariant& variant, const std::string& arch);

}  // namespace kvattn::cuda
