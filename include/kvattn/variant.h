// Host-side description of an attention variant: which built-in masks and logit transforms are on,
// and their parameters. The device/CPU code that implements them is the functor in
// src/kernels/variants/builtin.cuh; this struct only selects and parameterises it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvattn/dtype.h"
#include "kvattn/tensor.h"

namespace kvattn {

// Llama 3.1 frequency scaling of RoPE (SEMANTICS.md, "Rotary position embedding").
struct Llama31Scaling {
  float factor = 8.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  float original_max_position = 8192.0f;
};

struct RopeConfig {
  float rope_scale = 1.0f;
  float rope_theta = 1.0e4f;
  bool interleave = false;                // pair (x[2t], x[2t+1]) instead of rotate-half
  std::optional<Llama31Scaling> llama31;  // off: plain llama frequencies
};

// A user-written variant (docs/VARIANTS.md): C++ source that defines `struct Variant` with any of
// the hooks logits_transform, logits_mask, output_transform, sink_logit and the constant
// use_softmax, and the parameters the hooks read, declared once by name. It composes with the
// built-in switches of the Variant that carries it (a user mask is ANDed with causal, window and
// custom masks; the user transform follows soft-cap and ALiBi). Compiled at plan() by the system's
// C++ compiler for the CPU backend, or by NVRTC into the GPU decode and prefill kernels, and cached
// on disk by a hash of the source (docs/VARIANTS.md says what runs where).
struct CustomVariant {
  struct TensorParam {
    std::string name;
    DType dtype = DType::f32;  // f32, i32 or u8
    int ndim = 1;              // 1 to 4
  };
  std::string name = "custom";            // an identifier; names the source in compiler errors
  std::string source;                     // defines struct Variant
  std::vector<std::string> f32_params;    // float scalars, Params::<name>
  std::vector<std::string> i32_params;    // int32_t scalars
  std::vector<TensorParam> tensor_params; // kvattn::user::Tensor<T, ndim> Params::<name>

  // Throws kvattn::Error naming the bad field (a name that is not an identifier, a repeat, ...).
  void validate() const;
};

// The values of a CustomVariant's parameters for one plan: every declared one, nothing else.
// Tensors are read by the hooks at run(): they must stay alive and unchanged until the last run()
// of the plan, on the device the plan computes on.
struct CustomValues {
  std::vector<std::pair<std::string, float>> f32;
  std::vector<std::pair<std::string, int32_t>> i32;
  std::vector<std::pair<std::string, TensorView>> tensors;
};

struct Variant {
  bool causal = false;          // j <= p(i), aligned bottom-right
  int window_left = -1;         // sliding window: j >= p(i) - window_left; -1 off
  float logits_soft_cap = 0.0f; // s <- cap * tanh(s / cap); 0 off
  bool alibi = false;           // s <- s + m_h * (j - p(i)), standard slopes for num_qo_heads
  bool custom_mask = false;     // packed bit mask given to plan()
  bool sigmoid = false;         // no softmax: o = sum sigmoid(s + sigmoid_bias) v; no lse
  float sigmoid_bias = 0.0f;
  std::optional<RopeConfig> rope;  // fused RoPE on q (pos p(i)) and k (pos j)
  std::optional<float> sm_scale;   // default 1 / sqrt(head_dim_qk)
  float q_scale = 1.0f, k_scale = 1.0f, v_scale = 1.0f;  // fp8 dequantisation scales
  std::shared_ptr<const CustomVariant> custom;  // a user-written variant; null: none
  CustomValues custom_values;                   // its parameters' values

  // Fluent composition: variants::causal().with_soft_cap(30).with_window(4096)
  Variant with_causal(bool on = true) const { Variant v = *this; v.causal = on; return v; }
  Variant with_window(int w) const { Variant v = *this; v.window_left = w; return v; }
  Variant with_soft_cap(float c) const { Variant v = *this; v.logits_soft_cap = c; return v; }
  Variant with_alibi(bool on = true) const { Variant v = *this; v.alibi = on; return v; }
  Variant with_custom_mask(bool on = true) const { Variant v = *this; v.custom_mask = on; return v; }
  Variant with_rope(RopeConfig r = {}) const { Variant v = *this; v.rope = r; return v; }
  Variant with_sm_scale(float s) const { Variant v = *this; v.sm_scale = s; return v; }
  Variant with_scales(float q, float k, float vs) const {
    Variant v = *this; v.q_scale = q; v.k_scale = k; v.v_scale = vs; return v;
  }
  Variant with_sigmoid(float bias = 0.0f) const {
    Variant v = *this; v.sigmoid = true; v.sigmoid_bias = bias; return v;
  }
  Variant with_custom(CustomVariant c, CustomValues values = {}) const {
    Variant v = *this;
    v.custom = std::make_shared<const CustomVariant>(std::move(c));
    v.custom_values = std::move(values);
    return v;
  }

  // "causal+window(4096)+soft_cap(30)"; "plain" when nothing is on.
  std::string describe() const;
  // Throws kvattn::Error naming the bad field (negative window other than -1, cap < 0, ...).
  void validate() const;
};

namespace variants {
inline Variant plain() { return {}; }
inline Variant causal() { return Variant{}.with_causal(); }
inline Variant sliding_window(int window_left, bool causal = true) {
  return Variant{}.with_causal(causal).with_window(window_left);
}
inline Variant soft_cap(float cap) { return Variant{}.with_soft_cap(cap); }
inline Variant alibi() { return Variant{}.with_alibi(); }
inline Variant custom_mask() { return Variant{}.with_custom_mask(); }
inline Variant sigmoid(float bias = 0.0f) { return Variant{}.with_sigmoid(bias); }
inline Variant rope(RopeConfig r = {}) { return Variant{}.with_rope(r); }

// Attention sinks, as user variants of kvattn's own (docs/VARIANTS.md; every kernel, CPU and GPU):
// gpt-oss learned sinks: `sinks` (f32 [num_qo_heads], on the plan's device, alive until its last
// run()) holds one logit per query head whose e^sink joins that head's softmax denominator only.
Variant learned_sinks(const TensorView& sinks);
// StreamingLLM (Xiao et al., 2023): keys at positions < num_sink stay visible to every query, the
// others within the last `window` positions before it (kv_pos >= q_pos - window), causal.
Variant streaming_sinks(int num_sink, int window);
// The user variants behind them (for Python, precompiling, and tests).
const CustomVariant& learned_sinks_variant();
const CustomVariant& streaming_sinks_variant();
}  // namespace variants

// ALiBi slope of head h among num_heads (SEMANTICS.md): 2^(-8 (h+1) / n) for the first n (largest
// power of two <= num_heads) heads, then 2^(-4 (2k+1) / n) for k = 0, 1, ...
float alibi_slope(int head, int num_heads);

}  // namespace kvattn
