// SKIP_WITHOUT_GPU(): the first statement of every GPU test case. It skips the case, saying why,
// where no CUDA device can run it (CI has none) or the build has no CUDA backend.
#pragma once

#include <gtest/gtest.h>

#include <string>

#if KVATTN_WITH_CUDA
#include "support/device_mirror.h"

#define SKIP_WITHOUT_GPU()                                                                    \
  do {                                                                                        \
    std::string gpu_skip_reason;                                                              \
    if (!::kvattn_test::gpu_available(&gpu_skip_reason))                                      \
      GTEST_SKIP() << "no CUDA device: " << gpu_skip_reason;                                  \
  } while (0)
#else
#define SKIP_WITHOUT_GPU() GTEST_SKIP() << "this build has no CUDA backend"
#endif
