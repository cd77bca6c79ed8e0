#include "cuda/device_limits.h"

#include <algorithm>

#include "kvattn/error.h"

namespace kvattn::cuda {

int64_t DeviceLimits::smem_per_cta(int ctas) const {
  return std::min(smem_per_block_optin, smem_per_sm / std::max(1, ctas) - reserved_smem_per_block);
}

DeviceLimits limits_of_arch(std::string_view arch) {
  constexpr int64_t KB = 1024;
  if (arch == "sm_80") return {108, 163 * KB, 164 * KB, 1 * KB, 8, 0};
  if (arch == "sm_86") return {84, 99 * KB, 100 * KB, 1 * KB, 8, 6};
  if (arch == "sm_89") return {58, 99 * KB, 100 * KB, 1 * KB, 8, 9};
  if (arch == "sm_90" || arch == "sm_90a") return {132, 227 * KB, 228 * KB, 1 * KB, 9, 0};
  detail::throw_error("no device limits known for arch '", arch, "' (sm_80, sm_86, sm_89, sm_90a)");
}

DeviceLimits preset_limits() { return limits_of_arch("sm_90a"); }

}  // namespace kvattn::cuda
