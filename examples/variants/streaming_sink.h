// StreamingLLM (Xiao et al., 2023): the first num_sink tokens stay visible to every query, the
// others only within a sliding window of `window` keys (causal). Parameters: i32 num_sink, i32 window.
struct Variant {
  static bool logits_mask(const Params& p, int, int64_t qo_pos, int64_t kv_pos, int, int) {
    if (kv_pos > qo_pos) return false;
    return kv_pos < p.num_sink || kv_pos >= qo_pos - p.window;
  }
};
