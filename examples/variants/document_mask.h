// Document masking for packed sequences (FlexAttention's best-known example): several documents
// share one request, and a query sees only keys of its own document (causal within it when the
// built-in causal switch is on). Parameters: tensor doc_ids (i32, [kv_len] of the packed request,
// non-decreasing document ids; with several requests, index [batch][position] of a 2-D tensor is
// the natural extension). kv_range tells the prefill kernels that no query sees a key before its
// document's start, so they skip the tiles of earlier documents.
struct Variant {
  static bool logits_mask(const Params& p, int, int64_t qo_pos, int64_t kv_pos, int, int) {
    return p.doc_ids(qo_pos) == p.doc_ids(kv_pos);
  }
  // Queries at q_first.. see no key before the first of q_first's document (ids non-decreasing).
  static void kv_range(const Params& p, int, int64_t q_first, int64_t, int64_t& kv_first, int64_t&) {
    const int32_t doc = p.doc_ids(q_first);
    int64_t lo = 0, hi = q_first;  // the first position of `doc` lies in [lo, hi]
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (p.doc_ids(mid) < doc) lo = mid + 1; else hi = mid;
    }
    if (lo > kv_first) kv_first = lo;
  }
};
