// Sigmoid attention (Ramapuram et al., 2024) as a user variant: no softmax, each key weighs
// sigmoid(logit + bias), no normalisation and no LSE. Parameters: f32 bias. Equals the built-in
// Variant::sigmoid.
struct Variant {
  static constexpr bool use_softmax = false;
  static float logits_transform(const Params& p, float logit, int, int64_t, int64_t, int, int) {
    return 1.0f / (1.0f + expf(-(logit + p.bias)));
  }
};
