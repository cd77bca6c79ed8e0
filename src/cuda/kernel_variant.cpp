#include "cuda/kernel_variant.h"

#include "core/custom_params.h"
#include "core/sha256.h"

namespace kvattn::cuda {

UserVariantCode user_variant_code(const CustomVariant& v) {
  v.validate();
  UserVariantCode c;
  c.name = v.name;
  c.file = v.name + ".variant";
  c.source = v.source;
  c.definition = detail::custom_variant_namespace(v, "kvattn-generated-kernel.cu");
  c.digest = detail::Sha256().field("kvattn gpu variant 1").field(c.definition).hex_digest().substr(0, 12);
  return c;
}

std::string variant_name_suffix(const std::optional<UserVariantCode>& user) {
  return user ? "_u" + user->name + "_" + user->digest : std::string();
}

std::string variant_definitions(const std::optional<UserVariantCode>& user) {
  if (!user) return {};
  return "#include \"kernels/variants/custom.cuh\"\n" + user->definition;
}

std::string variant_member(const std::optional<UserVariantCode>& user, uint32_t features) {
  const std::string builtin = "kvattn::kernels::BuiltinVariant<" + std::to_string(features) + "u>";
  if (!user) return "  using Variant = " + builtin + ";\n";
  return "  using Variant = kvattn::kernels::ComposedVariant<" + builtin +
         ", kvattn_user::Variant, kvattn_user::Params>;\n";
}

std::string user_softmax_record(const std::optional<UserVariantCode>& user) {
  if (!user) return {};
  return std::string("extern \"C\" __device__ const int ") + kUserSoftmaxSymbol +
         " = KernelConfig::Variant::kUserSoftmax ? 1 : 0;\n";
}

}  // namespace kvattn::cuda
