// A user-written variant (docs/VARIANTS.md) composed with the built-in one. The user's source
// defines `struct Variant` in namespace kvattn_user with any of these static hooks (positions are
// absolute and aligned bottom-right, SEMANTICS.md; batch is the request, 0 for block-sparse):
//   float logits_transform(const Params&, float logit, int batch, int64_t qo_pos, int64_t kv_pos,
//                          int qo_head, int kv_head)     after sm_scale, soft-cap and ALiBi
//   bool  logits_mask(const Params&, int batch, int64_t qo_pos, int64_t kv_pos, int qo_head,
//                     int kv_head)                        ANDed with the built-in masks
//   float output_transform(const Params&, float value, int batch, int64_t qo_pos, int qo_head,
//                          int dim)                       each output element, after v_scale
//   float sink_logit(const Params&, int batch, int qo_head)  joins the softmax denominator
//   static constexpr bool use_softmax = false;            the weights are the transformed logits
//   void kv_range(const Params&, int batch, int64_t q_first, int64_t q_last, int64_t& kv_first,
//                 int64_t& kv_last)                       a hint: keys any query in [q_first, q_last]
//                 may see lie in [kv_first, kv_last] (narrow them); the prefill kernels skip tiles
//                 outside (logits_mask must still hide those keys: the hint changes no result)
//   void kv_full_range(const Params&, int batch, int64_t q_first, int64_t q_last, int64_t& kv_first,
//                      int64_t& kv_last)                  a promise: every key in [kv_first, kv_last]
//                 (left empty: kv_first > kv_last) passes logits_mask for every query in
//                 [q_first, q_last]; the prefill kernels skip logits_mask on tiles inside
// Params is generated from the declared parameters: scalars by name, tensors as
// kvattn::user::Tensor<T, N> (element access t(i, j, ...) through the caller's strides).
#pragma once

#include "kernels/variants/builtin.cuh"

namespace kvattn::user {

template <class T, int N>
struct Tensor {
  const T* data;
  int64_t shape[N];
  int64_t stride[N];  // elements

  template <class... I>
  KVATTN_HD const T& operator()(I... index) const {
    static_assert(sizeof...(I) == N, "a kvattn::user::Tensor<T, N> takes N indices");
    const int64_t idx[N] = {int64_t(index)...};
    int64_t offset = 0;
    for (int d = 0; d < N; ++d) offset += idx[d] * stride[d];
    return data[offset];
  }
  KVATTN_HD int64_t size(int d) const { return shape[d]; }
};

// Fast math for hooks on the hot path (`fast::tanh(x)` in a variant's source). The GPU uses the
// hardware's approximations, the CPU the exact functions; IEEE tanhf, expf and `/` cost 10-20
// instructions per key in a prefill kernel, these one or two.
namespace fast {
// tanh.approx.f32: relative error about 2^-11 (what the built-in soft-cap uses for bf16).
KVATTN_HD float tanh(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::tanh(x);
#endif
}
// 2^x and e^x through ex2.approx (relative error about 2^-22; flushes subnormals).
KVATTN_HD float exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}
KVATTN_HD float exp(float x) { return exp2(x * 1.4426950408889634f); }
// 1 / x and a / b through the approximate division (relative error about 2^-22; a reciprocal
// of one value for many keys, as in fast::div(logit, p.cap), is computed once).
KVATTN_HD float rcp(float x) {
#if defined(__CUDA_ARCH__)
  return __fdividef(1.0f, x);
#else
  return 1.0f / x;
#endif
}
KVATTN_HD float div(float a, float b) { return a * rcp(b); }
// 1 / (1 + e^-x).
KVATTN_HD float sigmoid(float x) { return rcp(1.0f + exp(-x)); }
}  // namespace fast

}  // namespace kvattn::user

namespace kvattn::kernels {

// Which hooks a user variant U with parameter block P defines, and with the contract's signature.
template <class U, class P>
struct UserHooks {
  static constexpr bool transform = requires(const P& p) {
    { U::logits_transform(p, 0.0f, 0, int64_t(0), int64_t(0), 0, 0) };
  };
  static constexpr bool mask = requires(const P& p) { { U::logits_mask(p, 0, int64_t(0), int64_t(0), 0, 0) }; };
  static constexpr bool output = requires(const P& p) {
    { U::output_transform(p, 0.0f, 0, int64_t(0), 0, 0) };
  };
  static constexpr bool sink = requires(const P& p) { { U::sink_logit(p, 0, 0) }; };
  static constexpr bool range = requires(const P& p, int64_t& a, int64_t& b) {
    U::kv_range(p, 0, int64_t(0), int64_t(0), a, b);
  };
  static constexpr bool full_range = requires(const P& p, int64_t& a, int64_t& b) {
    U::kv_full_range(p, 0, int64_t(0), int64_t(0), a, b);
  };
  static constexpr bool softmax_flag = requires { U::use_softmax; };
  // A member of a hook's name that the contract cannot call is a signature mismatch.
  static constexpr bool named_transform = requires { &U::logits_transform; };
  static constexpr bool named_mask = requires { &U::logits_mask; };
  static constexpr bool named_output = requires { &U::output_transform; };
  static constexpr bool named_sink = requires { &U::sink_logit; };
  static constexpr bool named_range = requires { &U::kv_range; };
  static constexpr bool named_full_range = requires { &U::kv_full_range; };
};

template <class Builtin, class U, class P>
struct ComposedVariant {
  using Hooks = UserHooks<U, P>;
  static_assert(!Hooks::named_transform || Hooks::transform,
                "logits_transform must be callable as static float logits_transform(const Params&, float logit, "
                "int batch, int64_t qo_pos, int64_t kv_pos, int qo_head, int kv_head)");
  static_assert(!Hooks::named_mask || Hooks::mask,
                "logits_mask must be callable as static bool logits_mask(const Params&, int batch, int64_t qo_pos, "
                "int64_t kv_pos, int qo_head, int kv_head)");
  static_assert(!Hooks::named_output || Hooks::output,
                "output_transform must be callable as static float output_transform(const Params&, float value, "
                "int batch, int64_t qo_pos, int qo_head, int dim)");
  static_assert(!Hooks::named_sink || Hooks::sink,
                "sink_logit must be callable as static float sink_logit(const Params&, int batch, int qo_head)");
  static_assert(!Hooks::named_range || Hooks::range,
                "kv_range must be callable as static void kv_range(const Params&, int batch, int64_t q_first, "
                "int64_t q_last, int64_t& kv_first, int64_t& kv_last)");
  static_assert(!Hooks::named_full_range || Hooks::full_range,
                "kv_full_range must be callable as static void kv_full_range(const Params&, int batch, int64_t "
                "q_first, int64_t q_last, int64_t& kv_first, int64_t& kv_last)");

  static constexpr bool kUserSoftmax = [] {
    if constexpr (Hooks::softmax_flag) return bool(U::use_softmax);
    return true;
  }();
  static_assert(kUserSoftmax || !Hooks::sink, "sink_logit needs the softmax (use_softmax = false has no denominator)");
  static_assert(Builtin::kMaySoftmax || !Hooks::sink,
                "sink_logit needs the softmax (the built-in sigmoid attention has no denominator)");
  static constexpr bool kUser = true;
  static constexpr bool kHasSink = Hooks::sink;
  static constexpr bool kHasOutput = Hooks::output;
  static constexpr bool kHasKvRange = Hooks::range;
  static constexpr bool kHasUserTransform = Hooks::transform, kHasUserMask = Hooks::mask;
  static constexpr bool kHasFullRange = Hooks::full_range;

  KVATTN_HD static const P& params(const VariantParams& p) { return *static_cast<const P*>(p.user_params); }
  KVATTN_HD static int batch(const VariantParams& p, const LogitCoord& c) { return p.one_sequence ? 0 : c.request; }
  KVATTN_HD static int kv_head(const VariantParams& p, int qo_head) {
    return qo_head / (p.num_qo_heads / p.num_kv_heads);
  }

  KVATTN_HD static bool has(const VariantParams& p, uint32_t bit) { return Builtin::has(p, bit); }
  KVATTN_HD static bool use_softmax(const VariantParams& p) { return kUserSoftmax && Builtin::use_softmax(p); }
  KVATTN_HD static void query_transform(const VariantParams& p, float* q, int dim, int64_t pos) {
    Builtin::query_transform(p, q, dim, pos);
  }
  KVATTN_HD static void key_transform(const VariantParams& p, float* k, int dim, int64_t pos) {
    Builtin::key_transform(p, k, dim, pos);
  }
  // The user's parameter block, copied: a kernel that reads it once per tile keeps it in registers
  // (hooks called under a per-key condition would each load it again).
  using UserParams = P;
  KVATTN_HD static P user_params(const VariantParams& p) { return params(p); }

  KVATTN_HD static float logits_transform(const VariantParams& p, const P& up, float s, const LogitCoord& c) {
    s = Builtin::logits_transform(p, s, c);
    if constexpr (Hooks::transform)
      s = float(U::logits_transform(up, s, batch(p, c), c.q_pos, c.kv_pos, c.qo_head, kv_head(p, c.qo_head)));
    return s;
  }
  KVATTN_HD static float logits_transform(const VariantParams& p, float s, const LogitCoord& c) {
    return logits_transform(p, params(p), s, c);
  }
  // The user's mask alone (the prefill kernels apply the built-in masks themselves, where they cut).
  KVATTN_HD static bool user_mask(const VariantParams& p, const P& up, const LogitCoord& c) {
    if constexpr (Hooks::mask)
      return bool(U::logits_mask(up, batch(p, c), c.q_pos, c.kv_pos, c.qo_head, kv_head(p, c.qo_head)));
    return true;
  }
  KVATTN_HD static bool logits_mask(const VariantParams& p, const LogitCoord& c) {
    return Builtin::logits_mask(p, c) && user_mask(p, params(p), c);
  }
  // The weight of a key without softmax: the built-in sigmoid's, else the transformed logit.
  KVATTN_HD static float weight(const VariantParams& p, float s) {
    return Builtin::use_softmax(p) ? s : Builtin::sigmoid_weight(p, s);
  }
  // Narrows [lo, hi] to the keys the queries at positions [q_first, q_last] may see (a hint).
  KVATTN_HD static void kv_range(const VariantParams& p, int request, int64_t q_first, int64_t q_last, int64_t& lo,
                                 int64_t& hi) {
    if constexpr (Hooks::range) U::kv_range(params(p), p.one_sequence ? 0 : request, q_first, q_last, lo, hi);
  }
  // Sets [lo, hi] (empty on entry) to keys every query at [q_first, q_last] sees (a promise).
  KVATTN_HD static void kv_full_range(const VariantParams& p, int request, int64_t q_first, int64_t q_last,
                                      int64_t& lo, int64_t& hi) {
    if constexpr (Hooks::full_range)
      U::kv_full_range(params(p), p.one_sequence ? 0 : request, q_first, q_last, lo, hi);
  }
  KVATTN_HD static float sink_logit(const VariantParams& p, int request, int qo_head) {
    if constexpr (Hooks::sink) return float(U::sink_logit(params(p), p.one_sequence ? 0 : request, qo_head));
    return 0.0f;
  }
  KVATTN_HD static float output_transform(const VariantParams& p, float value, int request, int64_t q_pos,
                                          int qo_head, int dim) {
    if constexpr (Hooks::output)
      return float(U::output_transform(params(p), value, p.one_sequence ? 0 : request, q_pos, qo_head, dim));
    return value;
  }
};

}  // namespace kvattn::kernels
