// Logit soft-capping (Gemma 2, Grok) as a user variant: logit <- cap * tanh(logit / cap).
// Parameters: f32 cap. Computes what the built-in Variant::logits_soft_cap does on bf16: on the
// GPU fast::tanh is the hardware's tanh (relative error about 2^-11; tanhf is exact and costs
// about ten instructions more per key), on the CPU the exact one.
struct Variant {
  static float logits_transform(const Params& p, float logit, int, int64_t, int64_t, int, int) {
    return p.cap * fast::tanh(fast::div(logit, p.cap));
  }
};
