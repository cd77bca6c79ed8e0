// Learned attention sinks (gpt-oss): a per-head logit that joins the softmax denominator only, so
// a head may put weight "nowhere". o = sum_j e^{s_j} v_j / (e^{sink[h]} + sum_j e^{s_j}).
// Parameters: tensor sinks (f32, [num_qo_heads]).
struct Variant {
  static float sink_logit(const Params& p, int, int qo_head) { return p.sinks(qo_head); }
};
