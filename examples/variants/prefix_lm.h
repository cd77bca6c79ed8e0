// PrefixLM (T5, UniLM): the first prefix_len positions of each request attend to each other in
// both directions, the rest causally. Parameters: tensor prefix_len (i32, [batch]).
struct Variant {
  static bool logits_mask(const Params& p, int batch, int64_t qo_pos, int64_t kv_pos, int, int) {
    return kv_pos <= qo_pos || kv_pos < p.prefix_len(batch);
  }
};
