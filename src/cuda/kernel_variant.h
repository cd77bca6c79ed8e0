// The variant a JIT kernel is specialised for: the built-in one of its feature bits, or a user
// variant (docs/VARIANTS.md) composed with it. Every kernel spec (decode, its merge, prefill, its
// merge) writes its variant through these, so that one user variant compiles the same way into
// every kernel family.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kvattn/variant.h"

namespace kvattn::cuda {

// A user variant as kernels compile it: the generated `namespace kvattn_user` (its Params and its
// source under #line 1 "<name>.variant") and a digest of it that kernel names carry.
struct UserVariantCode {
  std::string name;        // CustomVariant::name
  std::string file;        // "<name>.variant": what NVRTC's messages cite for the user's lines
  std::string source;      // the user's own source (error messages quote its lines)
  std::string definition;  // namespace kvattn_user { ... }
  std::string digest;      // 12 hex digits of SHA-256(definition)
  bool operator==(const UserVariantCode&) const = default;
};

// Validates `v` (kvattn::Error naming the problem) and generates its code.
UserVariantCode user_variant_code(const CustomVariant& v);

// user_variant_code of the last variant asked for, kept while the next one is the same (name,
// source, declarations): a runner's plan() then compares strings instead of hashing the source.
class UserVariantCodeCache {
 public:
  const UserVariantCode& code_of(const CustomVariant& v);

 private:
  std::optional<CustomVariant> variant_;
  UserVariantCode code_;
};

// "_u<name>_<digest>" for a user variant, "" for the built-in one.
std::string variant_name_suffix(const std::optional<UserVariantCode>& user);

// What a generated kernel source needs before its KernelConfig: the custom-variant header and the
// user's namespace, or nothing for the built-in variant.
std::string variant_definitions(const std::optional<UserVariantCode>& user);

// The KernelConfig member `using Variant = ...;` for `features` (kernels::VariantFeature bits).
std::string variant_member(const std::optional<UserVariantCode>& user, uint32_t features);

// A kernel source's tail that records, for the host, whether a user variant's weights are a
// softmax (only the compiled code knows its use_softmax): the device int kUserSoftmaxSymbol,
// after the KernelConfig. Empty for the built-in variant.
inline constexpr const char* kUserSoftmaxSymbol = "kvattn_user_softmax";
std::string user_softmax_record(const std::optional<UserVariantCode>& user);

}  // namespace kvattn::cuda
