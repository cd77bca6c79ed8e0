// A user variant's parameter block (kernels/variants/custom.cuh): the C++ definition of its
// `struct Params`, generated from the declared parameters, and the bytes of one plan's values in
// exactly that layout (each scalar in an 8-byte slot; a tensor as pointer, shape, strides).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvattn/variant.h"

namespace kvattn::detail {

// `struct Params { ... };` with static_asserts of its size and offsets.
std::string custom_params_source(const CustomVariant& v);

// `namespace kvattn_user { Params; the user's source under #line 1 "<name>.variant" }`, what the
// CPU shared object and the GPU kernels compile; `resume_file` names the lines after it.
std::string custom_variant_namespace(const CustomVariant& v, const std::string& resume_file);

// Checks `values` against the declaration (every parameter given once, nothing else; tensors of
// the declared dtype and ndim, on `device`) and packs them. Throws kvattn::Error naming the
// parameter.
std::vector<uint64_t> pack_custom_params(const CustomVariant& v, const CustomValues& values, Device device);

}  // namespace kvattn::detail
