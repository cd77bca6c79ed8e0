// T5-style relative position bias: logit <- logit + bias[h][bucket(kv_pos - qo_pos)], with T5's
// bucketing (half the buckets exact for small distances, the rest logarithmic up to max_distance;
// causal form: only keys at or before the query get distinct buckets). Parameters: tensor bias
// (f32, [num_qo_heads, num_buckets]), i32 max_distance.
struct Variant {
  static int bucket(int64_t distance, int num_buckets, int max_distance) {
    const int64_t n = distance < 0 ? -distance : 0;  // how far back the key is
    const int exact = num_buckets / 2;
    if (n < exact) return int(n);
    const float scaled = logf(float(n) / float(exact)) / logf(float(max_distance) / float(exact));
    const int b = exact + int(scaled * float(num_buckets - exact));
    return b < num_buckets - 1 ? b : num_buckets - 1;
  }
  static float logits_transform(const Params& p, float logit, int, int64_t qo_pos, int64_t kv_pos, int qo_head,
                                int) {
    return logit + p.bias(qo_head, bucket(kv_pos - qo_pos, int(p.bias.size(1)), p.max_distance));
  }
};
