// The stand-alone operations checked against attention itself (BatchPrefill over ragged KV):
//  * merge_state / merge_states of attention over parts of the KV equal attention over the
//    concatenated KV (SEMANTICS.md: the merge "equals attention over the union"), including rows
//    that a custom mask hides from one part or from all of it (lse = -inf);
//  * apply_rope followed by plain attention equals attention with the fused RoPE variant.
//
// Tolerances. f32: both sides compute the same sums in f32 in different orders (the parts' online
// softmax, then the merge); outputs are convex combinations of v in [-1, 1] and errors are a few
// f32 ulps of that (~1e-7), so 1e-5 absolute for o and 1e-5 * max(1, |lse|) for lse leave a 100x
// margin while a wrong weight moves o by O(0.1). bf16 (q, k, v and o in bf16): the inputs are the
// same stored values on both sides; each o is rounded once to bf16 (2^-9 relative), the merged
// one after its parts were rounded too, so 3 * 2^-9 + the f32 margin. Fully hidden rows must give
// o = 0 and lse = -inf exactly.
#include "ops_testing.h"

namespace ops_test {
namespace {

constexpr int kHq = 4, kHkv = 2, kD = 64;

struct Ragged {  // one side of a prefill: per request lengths and the stored tensor
  std::vector<int32_t> indptr{0};
  void add(int64_t n) { indptr.push_back(indptr.back() + int32_t(n)); }
  int64_t total() const { return indptr.back(); }
};

// Runs BatchPrefill (ragged KV); out and lse are views (possibly strided).
void prefill(DType t, const kvattn::Variant& var, Ragged& qo, Ragged& kv, kvattn::TensorView q,
             kvattn::TensorView k, kvattn::TensorView v, kvattn::TensorView out,
             kvattn::TensorView lse, std::vector<uint8_t>* mask = nullptr,
             std::vector<int32_t>* mask_indptr = nullptr) {
  kvattn::BatchPrefillPlan p;
  p.num_qo_heads = kHq;
  p.num_kv_heads = kHkv;
  p.head_dim_qk = kD;
  p.q_dtype = t;
  p.variant = var;
  p.qo_indptr = i32_view(qo.indptr);
  p.kv_indptr = i32_view(kv.indptr);
  if (mask) {
    p.custom_mask = kvattn::TensorView(mask->data(), DType::u8, {int64_t(mask->size())});
    p.mask_indptr = i32_view(*mask_indptr);
  }
  kvattn::BatchPrefill bp;
  bp.plan(p);
  bp.run(q, k, v, out, lse);
}

// Per request, KV split into `parts` contiguous pieces of random lengths (each >= qo_len).
struct SplitCase {
  int B = 3, parts;
  std::vector<int64_t> qo_len;
  std::vector<std::vector<int64_t>> part_len;  // [b][part]
  Ragged qo, full;
  std::vector<Ragged> part;
  Buf q, k, v;                   // k, v: the full KV, request by request
  std::vector<Buf> pk, pv;       // per part, gathered
  // Custom mask per request as bools [qo_len][kv_len] (empty: no mask).
  std::vector<std::vector<std::vector<bool>>> visible;

  SplitCase(std::mt19937_64& g, DType t, int parts_, bool with_mask) : parts(parts_), part(size_t(parts_)) {
    for (int b = 0; b < B; ++b) {
      qo_len.push_back(randint(g, 1, 6));
      part_len.emplace_back();
      int64_t kv = 0;
      for (int i = 0; i < parts; ++i) {
        part_len.back().push_back(randint(g, qo_len.back(), 25));
        part[size_t(i)].add(part_len.back().back());
        kv += part_len.back().back();
      }
      qo.add(qo_len.back());
      full.add(kv);
      if (with_mask) {  // row modes: part 0 hidden, last part hidden, all hidden, random bits
        std::vector<std::vector<bool>> m(size_t(qo_len.back()), std::vector<bool>(size_t(kv)));
        for (size_t i = 0; i < m.size(); ++i) {
          auto& row = m[i];
          // Row 0 of request b always takes mode b (so each mode occurs); the others at random.
          int mode = i == 0 ? b : int(randint(g, 0, 9));
          for (int64_t j = 0; j < kv; ++j) {
            bool in_first = j < part_len.back()[0], in_last = j >= kv - part_len.back().back();
            row[size_t(j)] = mode == 0 ? !in_first : mode == 1 ? !in_last : mode == 2 ? false : randint(g, 0, 9) < 7;
          }
        }
        visible.push_back(m);
      }
    }
    auto fill = [&](Buf& buf, int64_t n) {
      buf = Buf(t, n);
      for (int64_t i = 0; i < n; ++i) buf.set(i, uniform(g, -1, 1));
    };
    fill(q, qo.total() * kHq * kD);
    fill(k, full.total() * kHkv * kD);
    fill(v, full.total() * kHkv * kD);
    for (int i = 0; i < parts; ++i) {  // gather part i of each request
      pk.emplace_back(t, part[size_t(i)].total() * kHkv * kD);
      pv.emplace_back(t, part[size_t(i)].total() * kHkv * kD);
      for (int b = 0; b < B; ++b) {
        int64_t src = full.indptr[size_t(b)];
        for (int j = 0; j < i; ++j) src += part_len[size_t(b)][size_t(j)];
        for (int64_t tkn = 0; tkn < part_len[size_t(b)][size_t(i)]; ++tkn)
          for (int64_t e = 0; e < kHkv * kD; ++e) {
            int64_t dst = (part[size_t(i)].indptr[size_t(b)] + tkn) * kHkv * kD + e;
            pk.back().set_bits(dst, k.bits((src + tkn) * kHkv * kD + e));
            pv.back().set_bits(dst, v.bits((src + tkn) * kHkv * kD + e));
          }
      }
    }
  }
  // Packs the mask of KV columns [c0, c0 + n) of every request (bit i * n + j, little-endian).
  void pack(int64_t part_index, std::vector<uint8_t>& bytes, std::vector<int32_t>& ind) const {
    bytes.clear();
    ind = {0};
    for (int b = 0; b < B; ++b) {
      int64_t c0 = 0, n = 0;
      for (int64_t i = 0; i < parts; ++i) {
        if (part_index >= 0 && i < part_index) c0 += part_len[size_t(b)][size_t(i)];
        if (part_index < 0 || i == part_index) n += part_len[size_t(b)][size_t(i)];
      }
      const int64_t bits = qo_len[size_t(b)] * n;
      std::vector<uint8_t> req(size_t((bits + 7) / 8), 0);
      for (int64_t i = 0; i < qo_len[size_t(b)]; ++i)
        for (int64_t j = 0; j < n; ++j)
          if (visible[size_t(b)][size_t(i)][size_t(c0 + j)]) req[size_t((i * n + j) / 8)] |= uint8_t(1u << ((i * n + j) % 8));
      bytes.insert(bytes.end(), req.begin(), req.end());
      ind.push_back(int32_t(bytes.size()));
    }
    if (bytes.empty()) bytes.push_back(0);
  }
};

void compare(const Buf& got_o, const Buf& got_s, const Buf& want_o, const Buf& want_s, double o_tol,
             int64_t rows) {
  Checker c("merged vs concatenated attention");
  for (int64_t i = 0; i < rows * kHq; ++i) {
    const double ws = want_s.get(i), gs = got_s.get(i);
    if (ws == -kInf) {
      c.exact(gs, -kInf, "lse " + std::to_string(i));
      for (int e = 0; e < kD; ++e) c.exact(got_o.get(i * kD + e), 0.0, "o " + std::to_string(i * kD + e));
      continue;
    }
    c.close(gs, ws, 1e-5 * std::max(1.0, std::fabs(ws)), "lse " + std::to_string(i));
    for (int e = 0; e < kD; ++e) c.close(got_o.get(i * kD + e), want_o.get(i * kD + e), o_tol, "o " + std::to_string(i * kD + e));
  }
  EXPECT_TRUE(c.result());
}

TEST(OpsVsAttention, MergeStateOfTwoKVPartsEqualsAttentionOverTheConcatenation) {
  OPS_TEST_RNG(rng);
  for (DType t : {DType::f32, DType::bf16})
    for (bool with_mask : {false, true}) {
      SCOPED_TRACE(std::string(kvattn::dtype_name(t)) + (with_mask ? " custom mask" : " plain"));
      SplitCase sc(rng, t, 2, with_mask);
      const int64_t nq = sc.qo.total();
      const kvattn::Variant var = with_mask ? kvattn::variants::custom_mask() : kvattn::variants::soft_cap(8);
      std::vector<uint8_t> mbytes;
      std::vector<int32_t> mind;
      std::vector<Buf> o, s;
      for (int part = -1; part < 2; ++part) {  // -1: the whole KV
        o.emplace_back(t, nq * kHq * kD);
        s.emplace_back(DType::f32, nq * kHq);
        if (with_mask) sc.pack(part, mbytes, mind);
        Buf& kk = part < 0 ? sc.k : sc.pk[size_t(part)];
        Buf& vv = part < 0 ? sc.v : sc.pv[size_t(part)];
        Ragged& kv = part < 0 ? sc.full : sc.part[size_t(part)];
        prefill(t, var, sc.qo, kv, sc.q.view({nq, kHq, kD}), kk.view({kv.total(), kHkv, kD}),
                vv.view({kv.total(), kHkv, kD}), o.back().view({nq, kHq, kD}), s.back().view({nq, kHq}),
                with_mask ? &mbytes : nullptr, with_mask ? &mind : nullptr);
      }
      Buf mo(t, nq * kHq * kD), ms(DType::f32, nq * kHq);
      kvattn::merge_state(o[1].view({nq, kHq, kD}), s[1].view({nq, kHq}), o[2].view({nq, kHq, kD}),
                          s[2].view({nq, kHq}), mo.view({nq, kHq, kD}), ms.view({nq, kHq}));
      int64_t hidden = 0;
      for (int64_t i = 0; i < nq * kHq; ++i) hidden += s[1].get(i) == -kInf || s[2].get(i) == -kInf;
      if (with_mask) EXPECT_GT(hidden, 0) << "the mask should hide a whole part from some rows";
      compare(mo, ms, o[0], s[0], t == DType::f32 ? 1e-5 : 3 * 0x1p-9 + 1e-5, nq);
      // In place, with every other row masked out: those keep part 0's state.
      std::vector<uint8_t> mask(static_cast<size_t>(nq));
      for (int64_t r = 0; r < nq; ++r) mask[size_t(r)] = uint8_t(r % 2);
      const Buf o1 = o[1], s1 = s[1];
      kvattn::merge_state_in_place(o[1].view({nq, kHq, kD}), s[1].view({nq, kHq}), o[2].view({nq, kHq, kD}),
                                   s[2].view({nq, kHq}), kvattn::TensorView(mask.data(), DType::u8, {nq}));
      Checker c("merge_state_in_place vs merge_state");
      for (int64_t i = 0; i < nq * kHq * kD; ++i)
        c.exact(o[1].bits(i), (i / (kHq * kD)) % 2 ? mo.bits(i) : o1.bits(i), "o " + std::to_string(i));
      for (int64_t i = 0; i < nq * kHq; ++i)
        c.exact(s[1].bits(i), (i / kHq) % 2 ? ms.bits(i) : s1.bits(i), "lse " + std::to_string(i));
      EXPECT_TRUE(c.result());
    }
}

// Three parts written by attention straight into strided views of [nq, 3, Hq, D] and [nq, 3, Hq]
// (the split-KV layout), folded by merge_states.
TEST(OpsVsAttention, MergeStatesOfThreeKVPartsEqualsAttentionOverTheConcatenation) {
  OPS_TEST_RNG(rng);
  for (bool with_mask : {false, true}) {
    SCOPED_TRACE(with_mask ? "custom mask" : "plain");
    SplitCase sc(rng, DType::f32, 3, with_mask);
    const int64_t nq = sc.qo.total();
    const kvattn::Variant var = with_mask ? kvattn::variants::custom_mask() : kvattn::variants::plain();
    std::vector<uint8_t> mbytes;
    std::vector<int32_t> mind;
    Buf po(DType::f32, nq * 3 * kHq * kD), ps(DType::f32, nq * 3 * kHq);
    for (int part = 0; part < 3; ++part) {
      if (with_mask) sc.pack(part, mbytes, mind);
      Ragged& kv = sc.part[size_t(part)];
      prefill(DType::f32, var, sc.qo, kv, sc.q.view({nq, kHq, kD}), sc.pk[size_t(part)].view({kv.total(), kHkv, kD}),
              sc.pv[size_t(part)].view({kv.total(), kHkv, kD}),
              po.view({nq, kHq, kD}, {3 * kHq * kD, kD, 1}, part * kHq * kD),
              ps.view({nq, kHq}, {3 * kHq, 1}, part * kHq), with_mask ? &mbytes : nullptr,
              with_mask ? &mind : nullptr);
    }
    Buf fo(DType::f32, nq * kHq * kD), fs(DType::f32, nq * kHq), mo(DType::f32, nq * kHq * kD),
        ms(DType::f32, nq * kHq);
    if (with_mask) sc.pack(-1, mbytes, mind);
    prefill(DType::f32, var, sc.qo, sc.full, sc.q.view({nq, kHq, kD}), sc.k.view({sc.full.total(), kHkv, kD}),
            sc.v.view({sc.full.total(), kHkv, kD}), fo.view({nq, kHq, kD}), fs.view({nq, kHq}),
            with_mask ? &mbytes : nullptr, with_mask ? &mind : nullptr);
    kvattn::merge_states(po.view({nq, 3, kHq, kD}), ps.view({nq, 3, kHq}), mo.view({nq, kHq, kD}), ms.view({nq, kHq}));
    compare(mo, ms, fo, fs, 1e-5, nq);
  }
}

// apply_rope then plain causal attention == causal attention with the fused RoPE. Prefill (qo_len =
// kv_len, one apply_rope call for q and k with positions 0..n-1) and append (qo_len < kv_len:
// queries at kv_len - qo_len + i, so q and k are rotated by separate calls).
// f32: both paths rotate the same f32 vectors with the same code, so they agree to rounding
// (1e-6). bf16: apply_rope rounds the rotated q and k to bf16 (2^-9 each), which moves each logit by
// at most delta = sm_scale * 2^-8 * max|q'| * max|k'| (Cauchy-Schwarz); a softmax weight then moves
// by a factor within e^(+-2 delta), so o by (e^(2 delta) - 1) * max|v| plus two bf16 roundings of o
// (2 * 2^-9), and lse by delta * log2(e).
TEST(OpsVsAttention, ApplyRopeThenAttentionEqualsFusedRope) {
  OPS_TEST_RNG(rng);
  kvattn::RopeConfig configs[3];
  configs[1].interleave = true;
  configs[1].rope_scale = 2;
  configs[2].rope_theta = 5e5f;
  configs[2].llama31 = kvattn::Llama31Scaling{};
  for (DType t : {DType::f32, DType::bf16})
    for (bool append : {false, true})
      for (const auto& cfg : configs) {
        SCOPED_TRACE(std::string(kvattn::dtype_name(t)) + (append ? " append " : " prefill ") +
                     kvattn::Variant{}.with_rope(cfg).describe() + (cfg.interleave ? " interleave" : ""));
        SplitCase sc(rng, t, 1, false);  // qo_len <= kv_len per request
        Ragged qo;
        const int64_t nkv = sc.full.total();
        for (int b = 0; b < sc.B; ++b) qo.add(append ? sc.qo_len[size_t(b)] : sc.part_len[size_t(b)][0]);
        const int64_t nq = qo.total();
        Buf q(t, nq * kHq * kD);
        for (int64_t i = 0; i < q.size(); ++i) q.set(i, uniform(rng, -1, 1));
        std::vector<int32_t> qpos, kpos;
        for (int b = 0; b < sc.B; ++b) {
          const int64_t kv = sc.part_len[size_t(b)][0], n = qo.indptr[size_t(b) + 1] - qo.indptr[size_t(b)];
          for (int64_t i = 0; i < n; ++i) qpos.push_back(int32_t(kv - n + i));
          for (int64_t j = 0; j < kv; ++j) kpos.push_back(int32_t(j));
        }
        Buf qr(t, nq * kHq * kD), kr(t, nkv * kHkv * kD), scratch(t, std::max(nq * kHq, nkv * kHkv) * kD);
        kvattn::RopeOptions opt;
        static_cast<kvattn::RopeConfig&>(opt) = cfg;
        auto Q = q.view({nq, kHq, kD}), K = sc.k.view({nkv, kHkv, kD});
        auto QR = qr.view({nq, kHq, kD}), KR = kr.view({nkv, kHkv, kD});
        if (!append) {
          kvattn::apply_rope(Q, K, QR, KR, i32_view(qpos), opt);
        } else {
          kvattn::apply_rope(Q, Q, QR, scratch.view({nq, kHq, kD}), i32_view(qpos), opt);
          kvattn::apply_rope(K, K, KR, scratch.view({nkv, kHkv, kD}), i32_view(kpos), opt);
        }
        Buf o1(t, nq * kHq * kD), s1(DType::f32, nq * kHq), o2(t, nq * kHq * kD), s2(DType::f32, nq * kHq);
        auto V = sc.v.view({nkv, kHkv, kD});
        prefill(t, kvattn::variants::causal(), qo, sc.full, QR, KR, V, o1.view({nq, kHq, kD}), s1.view({nq, kHq}));
        prefill(t, kvattn::variants::causal().with_rope(cfg), qo, sc.full, Q, K, V, o2.view({nq, kHq, kD}),
                s2.view({nq, kHq}));
        double o_tol = 1e-6, lse_tol = 1e-6;  // lse: plus 1e-6 relative below
        if (t != DType::f32) {
          double qmax = 0, kmax = 0;
          for (int64_t i = 0; i < nq * kHq; ++i) {
            double n2 = 0;
            for (int e = 0; e < kD; ++e) n2 += qr.get(i * kD + e) * qr.get(i * kD + e);
            qmax = std::max(qmax, std::sqrt(n2));
          }
          for (int64_t i = 0; i < nkv * kHkv; ++i) {
            double n2 = 0;
            for (int e = 0; e < kD; ++e) n2 += kr.get(i * kD + e) * kr.get(i * kD + e);
            kmax = std::max(kmax, std::sqrt(n2));
          }
          const double delta = (1.0 / std::sqrt(double(kD))) * 0x1p-8 * qmax * kmax;
          o_tol = std::expm1(2 * delta) + 2 * 0x1p-9 + 1e-5;
          lse_tol = delta * 1.4426950408889634 + 1e-5;
        }
        Checker c("apply_rope + attention vs fused rope");
        for (int64_t i = 0; i < nq * kHq; ++i) {
          c.close(s1.get(i), s2.get(i), lse_tol + 1e-6 * std::fabs(s2.get(i)), "lse " + std::to_string(i));
          for (int e = 0; e < kD; ++e) c.close(o1.get(i * kD + e), o2.get(i * kD + e), o_tol, "o " + std::to_string(i * kD + e));
        }
        EXPECT_TRUE(c.result());
      }
}

}  // namespace
}  // namespace ops_test
