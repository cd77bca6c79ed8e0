// Logit soft-capping (Gemma 2, Grok) as a user variant: logit <- cap * tanh(logit / cap).
// Parameters: f32 cap. Equals the built-in Variant::logits_soft_cap.
struct Variant {
  static float logits_transform(const Params& p, float logit, int, int64_t, int64_t, int, int) {
    return p.cap * tanhf(logit / p.cap);
  }
};
