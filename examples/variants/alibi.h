// ALiBi as a user variant, with the slopes from a tensor: logit <- logit + slope[h] * (kv_pos -
// qo_pos). Parameters: tensor slopes (f32, [num_qo_heads]). With the standard slopes it equals the
// built-in Variant::alibi. Positions fit in 32 bits: the difference converts to float from int32
// (a 64-bit conversion costs the prefill kernels several percent).
struct Variant {
  static float logits_transform(const Params& p, float logit, int, int64_t qo_pos, int64_t kv_pos, int qo_head,
                                int) {
    return logit + p.slopes(qo_head) * float(int32_t(kv_pos - qo_pos));
  }
};
