// Document masking for packed sequences (FlexAttention's best-known example): several documents
// share one request, and a query sees only keys of its own document (causal within it when the
// built-in causal switch is on). Parameters: tensor doc_ids (i32, [kv_len] of the packed request,
// non-decreasing document ids; with several requests, index [batch][position] of a 2-D tensor is
// the natural extension).
struct Variant {
  static bool logits_mask(const Params& p, int, int64_t qo_pos, int64_t kv_pos, int, int) {
    return p.doc_ids(qo_pos) == p.doc_ids(kv_pos);
  }
};
