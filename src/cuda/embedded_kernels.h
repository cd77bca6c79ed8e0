// The device sources under src/kernels, embedded into the library at build time by
// cmake/embed_kernels.cmake. The JIT hands them to NVRTC as headers, so `#include "kernels/..."`
// resolves on a machine that has no kvattn source tree and no CUDA include directory.
#pragma once

#include <span>
#include <string_view>

namespace kvattn::cuda {

struct EmbeddedFile {
  const char* path;     // relative to src/, e.g. "kernels/variants/builtin.cuh"
  const char* content;  // NUL-terminated
};

std::span<const EmbeddedFile> embedded_kernel_files();
// SHA-256 (hex) over every path and content, computed at build time: part of every JIT key.
const char* embedded_kernels_sha256();

}  // namespace kvattn::cuda
