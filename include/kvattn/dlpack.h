// DLPack interop (needs <dlpack/dlpack.h>, e.g. Debian's libdlpack-dev, or any DLPack >= 0.6).
#pragma once

#include <dlpack/dlpack.h>

#include "kvattn/tensor.h"

namespace kvattn {

// Reads the DLTensor (byte_offset folded into the pointer; null strides mean contiguous).
// Unsupported dtypes (fp8 uses DLPack 1.1's codes) or devices throw kvattn::Error.
TensorView from_dlpack(const DLTensor& t);
// A DLManagedTensor that borrows the view's memory; its deleter frees only kvattn's own
// metadata. The caller keeps the memory alive as long as the DLPack consumer uses it.
DLManagedTensor* to_dlpack(const TensorView& t);

}  // namespace kvattn
