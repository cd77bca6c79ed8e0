#include "kvattn/variant.h"

#include <cmath>
#include <cctype>
#include <set>
#include <sstream>

#include "kvattn/error.h"

namespace kvattn {

std::string Variant::describe() const {
  std::ostringstream os;
  auto sep = [&, first = true]() mutable -> std::ostream& {
    if (!first) os << "+";
    first = false;
    return os;
  };
  if (causal) sep() << "causal";
  if (window_left >= 0) sep() << "window(" << window_left << ")";
  if (logits_soft_cap > 0) sep() << "soft_cap(" << logits_soft_cap << ")";
  if (alibi) sep() << "alibi";
  if (custom_mask) sep() << "custom_mask";
  if (rope) sep() << (rope->llama31 ? "rope_llama31" : "rope") << "(theta=" << rope->rope_theta
                  << ", scale=" << rope->rope_scale << ")";
  if (sigmoid) sep() << "sigmoid(bias=" << sigmoid_bias << ")";
  if (sm_scale) sep() << "sm_scale(" << *sm_scale << ")";
  if (q_scale != 1 || k_scale != 1 || v_scale != 1)
    sep() << "scales(q=" << q_scale << ", k=" << k_scale << ", v=" << v_scale << ")";
  if (custom) sep() << "custom(" << custom->name << ")";
  std::string s = os.str();
  return s.empty() ? "plain" : s;
}

void Variant::validate() const {
  KVATTN_CHECK(window_left >= -1, "variant.window_left = ", window_left,
               " is invalid (>= 0, or -1 for no sliding window)");
  KVATTN_CHECK(std::isfinite(logits_soft_cap) && logits_soft_cap >= 0,
               "variant.logits_soft_cap = ", logits_soft_cap, " is invalid (> 0, or 0 for off)");
  if (sm_scale)
    KVATTN_CHECK(std::isfinite(*sm_scale), "variant.sm_scale = ", *sm_scale, " is not finite");
  KVATTN_CHECK(std::isfinite(q_scale) && std::isfinite(k_scale) && std::isfinite(v_scale),
               "variant scales must be finite: q_scale = ", q_scale, ", k_scale = ", k_scale,
               ", v_scale = ", v_scale);
  KVATTN_CHECK(std::isfinite(sigmoid_bias), "variant.sigmoid_bias = ", sigmoid_bias,
               " is not finite");
  if (rope) {
    KVATTN_CHECK(rope->rope_theta > 0, "variant.rope.rope_theta = ", rope->rope_theta,
                 " must be > 0");
    KVATTN_CHECK(rope->rope_scale > 0, "variant.rope.rope_scale = ", rope->rope_scale,
                 " must be > 0");
    if (rope->llama31) {
      const Llama31Scaling& l = *rope->llama31;
      KVATTN_CHECK(l.factor > 0 && l.original_max_position > 0, "variant.rope.llama31: factor = ",
                   l.factor, " and original_max_position = ", l.original_max_position, " must be > 0");
      KVATTN_CHECK(l.high_freq_factor > l.low_freq_factor && l.low_freq_factor > 0,
                   "variant.rope.llama31: high_freq_factor = ", l.high_freq_factor,
                   " must be greater than low_freq_factor = ", l.low_freq_factor, " > 0");
    }
  }
  if (custom) custom->validate();
}

namespace {
bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}
}  // namespace

void CustomVariant::validate() const {
  KVATTN_CHECK(is_identifier(name), "custom variant name \"", name, "\" is not an identifier");
  KVATTN_CHECK(!source.empty(), "custom variant ", name, " has an empty source");
  std::set<std::string> seen;
  auto add = [&](const std::string& param, const char* kind) {
    KVATTN_CHECK(is_identifier(param), "custom variant ", name, ": ", kind, " parameter name \"", param,
                 "\" is not an identifier");
    KVATTN_CHECK(seen.insert(param).second, "custom variant ", name, ": parameter ", param,
                 " is declared twice");
  };
  for (const auto& p : f32_params) add(p, "f32");
  for (const auto& p : i32_params) add(p, "i32");
  for (const auto& t : tensor_params) {
    add(t.name, "tensor");
    KVATTN_CHECK(t.dtype == DType::f32 || t.dtype == DType::i32 || t.dtype == DType::u8, "custom variant ",
                 name, ": tensor parameter ", t.name, " has dtype ", dtype_name(t.dtype),
                 " (f32, i32 or u8 are supported)");
    KVATTN_CHECK(t.ndim >= 1 && t.ndim <= 4, "custom variant ", name, ": tensor parameter ", t.name,
                 " has ndim = ", t.ndim, " (1 to 4 are supported)");
  }
}

float alibi_slope(int head, int num_heads) {
  KVATTN_CHECK(num_heads >= 1, "alibi_slope: num_heads = ", num_heads, " must be >= 1");
  KVATTN_CHECK(head >= 0 && head < num_heads, "alibi_slope: head = ", head,
               " is out of range [0, ", num_heads, ")");
  int n = 1;
  while (n * 2 <= num_heads) n *= 2;
  if (head < n) return std::exp2(-8.0f * float(head + 1) / float(n));
  int k = head - n;
  return std::exp2(-4.0f * float(2 * k + 1) / float(n));
}

namespace variants {

const CustomVariant& learned_sinks_variant() {
  static const CustomVariant v = [] {
    CustomVariant c;
    c.name = "learned_sinks";
    c.source =
        "struct Variant {\n"
        "  static float sink_logit(const Params& p, int, int qo_head) { return p.sinks(qo_head); }\n"
        "};\n";
    c.tensor_params = {{"sinks", DType::f32, 1}};
    return c;
  }();
  return v;
}

const CustomVariant& streaming_sinks_variant() {
  static const CustomVariant v = [] {
    CustomVariant c;
    c.name = "streaming_sinks";
    c.source =
        "struct Variant {\n"
        "  static bool logits_mask(const Params& p, int, int64_t qo_pos, int64_t kv_pos, int, int) {\n"
        "    return kv_pos <= qo_pos && (kv_pos < p.num_sink || kv_pos >= qo_pos - p.window);\n"
        "  }\n"
        "};\n";
    c.i32_params = {"num_sink", "window"};
    return c;
  }();
  return v;
}

Variant learned_sinks(const TensorView& sinks) {
  CustomValues values;
  values.tensors = {{"sinks", sinks}};
  return Variant{}.with_custom(learned_sinks_variant(), std::move(values));
}

Variant streaming_sinks(int num_sink, int window) {
  KVATTN_CHECK(num_sink >= 0, "streaming_sinks: num_sink = ", num_sink, " is negative");
  KVATTN_CHECK(window >= 0, "streaming_sinks: window = ", window, " is negative");
  CustomValues values;
  values.i32 = {{"num_sink", num_sink}, {"window", window}};
  return Variant{}.with_custom(streaming_sinks_variant(), std::move(values));
}

}  // namespace variants

}  // namespace kvattn
