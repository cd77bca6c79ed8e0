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

namespace {
bool same_declaration(const CustomVariant& a, const CustomVariant& b) {
  auto same_tensors = [&] {
    if (a.tensor_params.size() != b.tensor_params.size()) return false;
    for (size_t i = 0; i < a.tensor_params.size(); ++i) {
      const auto &x = a.tensor_params[i], &y = b.tensor_params[i];
      if (x.name != y.name || x.dtype != y.dtype || x.ndim != y.ndim) return false;
    }
    return true;
  };
  return a.name == b.name && a.source == b.source && a.f32_params == b.f32_params && a.i32_params == b.i32_params &&
         same_tensors();
}
}  // namespace

const UserVariantCode& UserVariantCodeCache::code_of(const CustomVariant& v) {
  if (!variant_ || !same_declaration(*variant_, v)) {
    code_ = user_variant_code(v);  // validates first: a bad declaration leaves the cache as it was
    variant_ = v;
  }
  return code_;
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
