// Document masking for packed sequences (FlexAttention's best-known example): several documents
// share one request, and a query sees only keys of its own document (causal within it when the
// built-in causal switch is on). Parameters: tensor doc_ids (i32, [kv_len] of the packed request,
// non-decreasing document ids; with several requests, index [batch][position] of a 2-D tensor is
// the natural extension). The two range hooks let the prefill kernels skip the tiles of other
// documents (kv_range) and the mask inside a document (kv_full_range).
struct Variant {
  static bool logits_mask(const Params& p, int, int64_t qo_pos, int64_t kv_pos, int, int) {
    return p.doc_ids(qo_pos) == p.doc_ids(kv_pos);
  }
  // The first position in [lo, hi) whose document id is at least doc (hi if none).
  static int64_t first_at_least(const Params& p, int32_t doc, int64_t lo, int64_t hi) {
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (p.doc_ids(mid) < doc) lo = mid + 1; else hi = mid;
    }
    return lo;
  }
  // Queries at q_first..q_last see no key before q_first's document nor after q_last's (searched
  // within the block's key range [kv_first, kv_last], which comes in already narrowed).
  static void kv_range(const Params& p, int, int64_t q_first, int64_t q_last, int64_t& kv_first, int64_t& kv_last) {
    if (kv_first < q_first) kv_first = first_at_least(p, p.doc_ids(q_first), kv_first, q_first);
    if (kv_last > q_last) kv_last = first_at_least(p, p.doc_ids(q_last) + 1, q_last, kv_last + 1) - 1;
  }
  // Queries of one document all see its keys up to the last of them (keys after it: the mask
  // decides, or the built-in causal mask hides them).
  static void kv_full_range(const Params& p, int, int64_t q_first, int64_t q_last, int64_t& kv_first,
                            int64_t& kv_last) {
    const int32_t doc = p.doc_ids(q_first);
    if (p.doc_ids(q_last) != doc) return;
    kv_first = first_at_least(p, doc, 0, q_first);
    kv_last = q_last;
  }
};
