// PrefixLM (T5, UniLM): the first prefix_len positions of each request attend to each other in
// both directions, the rest causally. Parameters: tensor prefix_len (i32, [batch]). The range
// hooks let the prefill kernels skip the keys no query of a tile sees and the mask where every
// query sees every key.
struct Variant {
  static bool logits_mask(const Params& p, int batch, int64_t qo_pos, int64_t kv_pos, int, int) {
    return kv_pos <= qo_pos || kv_pos < p.prefix_len(batch);
  }
  // Keys past both q_last and the prefix are hidden from queries q_first..q_last.
  static void kv_range(const Params& p, int batch, int64_t, int64_t q_last, int64_t&, int64_t& kv_last) {
    const int64_t last = q_last > p.prefix_len(batch) - 1 ? q_last : p.prefix_len(batch) - 1;
    if (last < kv_last) kv_last = last;
  }
  // Keys up to q_first, or in the prefix, are visible to all of them.
  static void kv_full_range(const Params& p, int batch, int64_t q_first, int64_t, int64_t& kv_first,
                            int64_t& kv_last) {
    kv_first = 0;
    kv_last = q_first > p.prefix_len(batch) - 1 ? q_first : p.prefix_len(batch) - 1;
  }
};
