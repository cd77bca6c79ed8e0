// What a kernel choice needs to know about the device: queried from the runtime (runtime.h,
// limits_of) for the device in hand, or taken from the table of architectures for a preset or a
// unit test. Plain data, no CUDA headers, so the choice functions stay testable on the CPU for
// every architecture kvattn supports.
#pragma once

#include <cstdint>
#include <string_view>

namespace kvattn::cuda {

struct DeviceLimits {
  int sm_count = 0;
  int64_t smem_per_block_optin = 0;     // cudaDevAttrMaxSharedMemoryPerBlockOptin
  int64_t smem_per_sm = 0;              // cudaDevAttrMaxSharedMemoryPerMultiprocessor
  int64_t reserved_smem_per_block = 0;  // cudaDevAttrReservedSharedMemoryPerBlock
  int cc_major = 0, cc_minor = 0;

  // cp.async.bulk, TMA and mbarrier transactions (sm_90+), with the shared memory the bulk decode
  // kernels' pipelines need.
  bool has_bulk_copies() const { return cc_major >= 9 && smem_per_block_optin >= 200 * 1024; }
  // wgmma and setmaxnreg: the sm_90a target, which only compute capability 9.0 has.
  bool has_wgmma() const { return cc_major == 9 && cc_minor == 0; }
  // Shared memory each of `ctas` resident CTAs can have: its share of the SM less the
  // per-block reservation, and no more than one block may opt in to.
  int64_t smem_per_cta(int ctas) const;
  bool operator==(const DeviceLimits&) const = default;
};

// The limits of the architectures kvattn is tuned and tested for (the CUDA C++ Programming
// Guide's per-compute-capability table; SM counts of A100, RTX 3090, L4 and H100/H200):
// "sm_80", "sm_86", "sm_89", "sm_90" / "sm_90a". kvattn::Error for another name.
DeviceLimits limits_of_arch(std::string_view arch);

// The limits the built-in presets are chosen for: the H200 (sm_90a), whatever arch they are
// compiled for (compiling them for sm_80 checks that the code builds there; a device in hand
// chooses from its own queried limits).
DeviceLimits preset_limits();

}  // namespace kvattn::cuda
