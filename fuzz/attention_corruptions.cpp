// The corruptions of the attention wrappers' calls (attention_problem.h): each is illegal by
// construction, whatever else of the list is applied with it (distinct targets).
#include <algorithm>
#include <limits>

#include "fuzz/attention_problem.h"

namespace kvattn_fuzz::attention {

namespace {
constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kI32Min = std::numeric_limits<int32_t>::min();
}  // namespace

std::vector<Corruption> attention_corruptions(Ctx& ctx, AttnProblem& p, AttnArgs& a, bool prior_plan) {
  std::vector<Corruption> c;
  Source& s = ctx.src;
  Ctx* cx = &ctx;
  AttnArgs* A = &a;
  const AttentionApi api = p.api;
  const bool paged = api == AttentionApi::decode || api == AttentionApi::prefill_paged;
  const bool prefill = api == AttentionApi::prefill_ragged || api == AttentionApi::prefill_paged;
  const int hq = p.hq, hkv = p.hkv, dqk = p.dqk, dvo = p.dvo;
  // Fresh q, out (and lse) of `rows` rows; fresh k, v of `n` rows (ragged and block-sparse KV).
  auto resize_rows = [cx, A, pp = &p](int64_t rows) {
    A->q = cx->keep(make_tensor(*cx, pp->qt, {rows, pp->hq, pp->dqk}, false)).view();
    A->out = cx->keep(make_tensor(*cx, pp->ot, {rows, pp->hq, pp->dvo}, false)).view();
    if (A->lse.defined()) A->lse = cx->keep(make_tensor(*cx, DType::f32, {rows, pp->hq}, false)).view();
  };
  auto resize_kv = [cx, A, pp = &p](int64_t n) {
    A->k = cx->keep(make_tensor(*cx, pp->kvt, {n, pp->hkv, pp->dqk}, false)).view();
    A->v = cx->keep(make_tensor(*cx, pp->kvt, {n, pp->hkv, pp->dvo}, false)).view();
  };

  // Shape and dtypes of the plan.
  {
    const int qh = int(s.pick<int64_t>({0, -1, hq + hkv, hkv > 1 ? hq + 1 : 0}));
    c.push_back({cat("num_qo_heads = ", qh), "dims", [A, qh] { A->shape.num_qo_heads = qh; }});
    const int kh = int(s.pick<int64_t>({0, -2, hq + 1, hkv > 1 ? 1 : hkv + 1}));
    c.push_back({cat("num_kv_heads = ", kh), "dims", [A, kh] { A->shape.num_kv_heads = kh; }});
    std::vector<int64_t> dq{0, 7, 12, 520, -8, 4};
    for (int d : {8, 16, 32, 64})
      if (d != dqk) dq.push_back(d);
    const int d1 = int(s.pick(dq));
    c.push_back({cat("head_dim_qk = ", d1), "dims", [A, d1, dvo] {
                   if (A->shape.head_dim_vo == 0) A->shape.head_dim_vo = dvo;  // keep vo as it was
                   A->shape.head_dim_qk = d1;
                 }});
    std::vector<int64_t> dv{7, 12, 520, -8, 4};
    for (int d : {8, 16, 32, 64})
      if (d != dvo) dv.push_back(d);
    const int d2 = int(s.pick(dv));
    c.push_back({cat("head_dim_vo = ", d2), "dims", [A, d2] { A->shape.head_dim_vo = d2; }});
    auto other = [&](const std::vector<DType>& pool, DType not_this) {
      std::vector<DType> o;
      for (DType d : pool)
        if (d != not_this) o.push_back(d);
      return s.pick(o);
    };
    const DType qd = other(kAllDtypes, p.qt);
    c.push_back({cat("q_dtype = ", dtype_str(qd)), "dtypes", [A, qd, p = &p] {
                   A->shape.q_dtype = qd;
                   if (!A->shape.kv_dtype) A->shape.kv_dtype = p->kvt;
                   if (!A->shape.o_dtype) A->shape.o_dtype = p->ot;
                 }});
    const DType kd = other(kAllDtypes, p.kvt);
    c.push_back({cat("kv_dtype = ", dtype_str(kd)), "dtypes", [A, kd] { A->shape.kv_dtype = kd; }});
    const DType od = other(kAllDtypes, p.ot);
    c.push_back({cat("o_dtype = ", dtype_str(od)), "dtypes", [A, od] { A->shape.o_dtype = od; }});
  }

  // The variant's values.
  {
    Variant* v = &a.shape.variant;
    const int w = int(s.pick<int64_t>({-2, -7, kI32Min}));
    c.push_back({cat("window_left = ", w), "variant.window", [v, w] { v->window_left = w; }});
    const float cap = float(s.pick({-1.0, -0.5, kNaN, kInf}));
    c.push_back({cat("logits_soft_cap = ", cap), "variant.soft_cap", [v, cap] { v->logits_soft_cap = cap; }});
    const float sm = float(non_finite(s));
    c.push_back({cat("sm_scale = ", sm), "variant.sm_scale", [v, sm] { v->sm_scale = sm; }});
    const float bad = float(non_finite(s));
    const int which = int(s.range(0, 2));
    c.push_back({cat("scale #", which, " = ", bad), "variant.scales", [v, bad, which] {
                   (which == 0 ? v->q_scale : which == 1 ? v->k_scale : v->v_scale) = bad;
                 }});
    const float bias = float(non_finite(s));
    c.push_back({cat("sigmoid_bias = ", bias), "variant.sigmoid_bias", [v, bias] { v->sigmoid_bias = bias; }});
    const int rope_case = int(s.range(0, 5));
    const double rv = s.pick({0.0, -1.0, kNaN});
    c.push_back({cat("rope field #", rope_case, " = ", rv), "variant.rope", [v, rope_case, rv] {
                   kvattn::RopeConfig r = v->rope.value_or(kvattn::RopeConfig{});
                   kvattn::Llama31Scaling l = r.llama31.value_or(kvattn::Llama31Scaling{});
                   switch (rope_case) {
                     case 0: r.rope_theta = float(rv); break;
                     case 1: r.rope_scale = float(rv); break;
                     case 2: l.factor = float(rv); r.llama31 = l; break;
                     case 3: l.high_freq_factor = l.low_freq_factor; r.llama31 = l; break;
                     case 4: l.low_freq_factor = float(rv); r.llama31 = l; break;
                     default: l.original_max_position = float(rv); r.llama31 = l; break;
                   }
                   v->rope = r;
                 }});
    if (!p.variant.custom_mask)
      c.push_back({"custom_mask on without a mask", "variant.custom_mask", [v] { v->custom_mask = true; }});
    if (p.variant.custom_mask)
      c.push_back({"custom_mask off with a mask given", "variant.custom_mask", [v] { v->custom_mask = false; }});
    if (p.want_lse && !p.variant.sigmoid)
      c.push_back({"sigmoid with an lse requested", "variant.sigmoid", [v] { v->sigmoid = true; }});
    if (p.variant.sigmoid) {
      HostTensor* lse = &p.lse;
      c.push_back({"lse given for sigmoid attention", "lse", [A, lse] { A->lse = lse->view(); }});
    }
  }

  const int64_t batch = api == AttentionApi::block_sparse ? int64_t(p.bsr_ind.size()) - 1 : int64_t(p.reqs.size());
  scheduler_corruptions(ctx, c, a.shape.scheduler, batch, p.rows);

  // Query, output, lse and ragged K/V tensors.
  // Sizes and dtypes are checked against the plan's: one corruption of either kind per iteration
  // (targets "dims" and "dtypes", shared with the plan fields), or two could agree again.
  tensor_corruptions(ctx, c, "q", a.q, {{p.qt}, true, {0, 1, 2}, false, "q", "dims", "dtypes"});
  tensor_corruptions(ctx, c, "out", a.out, {{p.ot}, true, {0, 1, 2}, true, "out", "dims", "dtypes"});
  tensor_corruptions(ctx, c, "lse", a.lse, {{DType::f32}, false, {0, 1}, true, "lse", "dims", "dtypes"});
  if (!paged) {
    tensor_corruptions(ctx, c, "k", a.k, {{p.kvt}, true, {0, 1, 2}, false, "k", "dims", "dtypes"});
    tensor_corruptions(ctx, c, "v", a.v, {{p.kvt}, true, {0, 1, 2}, false, "v", "dims", "dtypes"});
  }
  // Aliasing (kvattn/attention.h: out and lse share no byte with each other or any input).
  const TensorView& kview = paged ? a.cache.k : a.k;
  const TensorView& vview = paged ? a.cache.v : a.v;
  if (a.out.numel() > 0) {
    if (a.q.numel() > 0) c.push_back({"out overlaps q", "out", [A] { A->out = with_data(A->out, A->q.data()); }});
    if (kview.numel() > 0) {
      const void* kp = kview.data();
      c.push_back({"out overlaps k", "out", [A, kp] { A->out = with_data(A->out, kp); }});
    }
    if (vview.numel() > 0) {
      const void* vp = static_cast<const char*>(vview.data()) + s.range(0, 3) * int64_t(kvattn::dtype_size(p.kvt));
      c.push_back({"out overlaps v", "out", [A, vp] { A->out = with_data(A->out, vp); }});
    }
    if (a.lse.numel() > 0)
      c.push_back({"lse overlaps out", "lse", [A] { A->lse = with_data(A->lse, A->out.data()); }});
    if (!prior_plan) {
      const int64_t bytes = a.out.extent_bytes();
      c.push_back({"workspace overlaps out", "workspace", [A, bytes] {
                     A->workspace = TensorView(A->out.data(), DType::u8, {bytes});
                   }});
    }
  }
  if (a.lse.numel() > 0 && a.q.numel() > 0)
    c.push_back({"lse overlaps q", "lse", [A] { A->lse = with_data(A->lse, A->q.data()); }});
  if (!prior_plan) c.push_back({"run() before plan()", "plan_first", [A] { A->plan_first = false; }});

  // Paged KV: page table, page size, cache.
  if (paged) {
    const auto& pk = *p.paged;
    const std::vector<int32_t> ind = kvattn_test::as_int32(pk.indptr);
    const int32_t used = ind.back();
    const int64_t num_pages = pk.num_pages();
    // The arrays whose lengths give the batch size agree again when two grow alike (one more,
    // empty request): all their corruptions share the target "batch".
    indptr_corruptions(ctx, c, "kv_indptr", a.table.indptr, "batch");
    index_array_corruptions(ctx, c, "kv_indptr", a.table.indptr, true, "batch");
    {
      TensorView* t = &a.table.indptr;
      const int64_t nidx = pk.indices.numel();
      c.push_back({"kv_indptr[-1] past the end of kv_indices", "batch", [cx, t, nidx] {
                     auto v = int32_values(*t);
                     v.back() = int32_t(nidx + 1);
                     replace_int32(*cx, *t, v);
                   }});
    }
    index_array_corruptions(ctx, c, "kv_indices", a.table.indices, false);
    if (used > 0) {
      TensorView* t = &a.table.indices;
      const int64_t j = s.range(0, used - 1);
      const int32_t bad = int32_t(s.pick<int64_t>({num_pages, num_pages + 7, kI32Max, -1, kI32Min}));
      c.push_back({cat("kv_indices[", j, "] = ", bad), "kv_indices", [cx, t, j, bad] {
                     auto v = int32_values(*t);
                     v[size_t(j)] = bad;
                     replace_int32(*cx, *t, v);
                   }});
      c.push_back({"kv_indices shorter than kv_indptr[-1]", "kv_indices",
                   [t, used] { *t = with_size(*t, 0, used - 1); }});
    }
    index_array_corruptions(ctx, c, "kv_last_page_len", a.table.last_page_len, true, "batch");
    if (!p.reqs.empty()) {
      TensorView* t = &a.table.last_page_len;
      const int64_t b = s.range(0, int64_t(p.reqs.size()) - 1);
      const bool has_pages = ind[size_t(b) + 1] > ind[size_t(b)];
      const int32_t bad = int32_t(has_pages ? s.pick<int64_t>({0, -1, p.page_size + 1, kI32Max})
                                            : s.pick<int64_t>({-1, p.page_size + 1, kI32Min}));
      c.push_back({cat("kv_last_page_len[", b, "] = ", bad), "batch", [cx, t, b, bad] {
                     auto v = int32_values(*t);
                     v[size_t(b)] = bad;
                     replace_int32(*cx, *t, v);
                   }});
    }
    const int ps = int(s.pick<int64_t>({0, -1, p.page_size + 1, p.page_size - 1}));
    c.push_back({cat("page_size = ", ps), "dims", [A, ps] { A->page_size = ps; }});
    const int tok = p.layout == KVLayout::NHD ? 1 : 2, head = p.layout == KVLayout::NHD ? 2 : 1;
    tensor_corruptions(ctx, c, "paged k", a.cache.k, {{p.kvt}, true, {tok, head, 3}, false, "paged k", "dims", "dtypes"});
    tensor_corruptions(ctx, c, "paged v", a.cache.v, {{p.kvt}, true, {tok, head, 3}, false, "paged v", "dims", "dtypes"});
    if (used > 0) {
      int32_t max_id = 0;
      for (int32_t i = 0; i < used; ++i) max_id = std::max(max_id, int32_t(pk.indices.get_at(i)));
      c.push_back({cat("cache of ", max_id, " pages (page id ", max_id, " used)"), "cache.pages", [A, max_id] {
                     A->cache.k = with_size(A->cache.k, 0, max_id);
                     A->cache.v = with_size(A->cache.v, 0, max_id);
                   }});
    }
    c.push_back({"paged v with one page less than k", "cache.pages", [A] {
                   if (A->cache.v.size(0) > 0) A->cache.v = with_size(A->cache.v, 0, A->cache.v.size(0) - 1);
                   else A->cache.k = with_size(A->cache.k, 0, 1);
                 }});
    c.push_back({"cache layout flipped", "cache.layout", [A] {
                   A->cache.layout = A->cache.layout == KVLayout::NHD ? KVLayout::HND : KVLayout::NHD;
                 }});
    if (!prior_plan)
      c.push_back({"wrapper layout flipped", "cache.layout", [A] {
                     A->wrapper_layout = A->wrapper_layout == KVLayout::NHD ? KVLayout::HND : KVLayout::NHD;
                   }});
  }

  // BatchPrefill: qo_indptr, ragged kv_indptr, which KV description, custom mask.
  if (prefill) {
    indptr_corruptions(ctx, c, "qo_indptr", a.qo_indptr, "batch");
    index_array_corruptions(ctx, c, "qo_indptr", a.qo_indptr, true, "batch");
    if (!p.reqs.empty()) {
      TensorView* t = &a.qo_indptr;
      // (qo_len > kv_len is legal: FlashInfer plans it, queries then sit at negative positions.)
      c.push_back({"qo_indptr[-1] = INT32_MAX", "batch", [cx, t] {
                     auto v = int32_values(*t);
                     v.back() = kI32Max;
                     replace_int32(*cx, *t, v);
                   }});
    }
    if (api == AttentionApi::prefill_ragged) {
      indptr_corruptions(ctx, c, "kv_indptr", a.kv_indptr, "batch");
      index_array_corruptions(ctx, c, "kv_indptr", a.kv_indptr, true, "batch");
      if (!p.reqs.empty()) {
        TensorView* t = &a.kv_indptr;
        c.push_back({"kv_indptr[-1] = INT32_MAX", "batch", [cx, t] {
                       auto v = int32_values(*t);
                       v.back() = kI32Max;
                       replace_int32(*cx, *t, v);
                     }});
      }
      c.push_back({"no kv_indptr and no page table", "plan.kv", [A] { A->plan_kv_indptr = false; }});
      c.push_back({"run() with a paged cache on a ragged plan", "run.kind", [A] {
                     A->run_paged = true;
                     A->cache = kvattn::PagedKVCache{with_extra_dim(A->k), with_extra_dim(A->v), A->wrapper_layout};
                   }});
    } else {
      HostTensor* kvi = &p.kv_indptr;
      c.push_back({"both kv_indptr and a page table", "plan.kv", [A, kvi] {
                     A->plan_kv_indptr = true;
                     A->kv_indptr = kvi->view();
                   }});
      c.push_back({"no kv_indptr and no page table", "plan.kv", [A] { A->plan_page_table = false; }});
      HostTensor* q = &p.q;
      c.push_back({"run() with ragged k, v on a paged plan", "run.kind", [A, q] {
                     A->run_paged = false;
                     A->k = q->view();
                     A->v = q->view();
                   }});
    }
    if (p.variant.custom_mask) {
      TensorView* m = &a.custom_mask;
      const DType md = s.pick({DType::i32, DType::f32, DType::e4m3});
      c.push_back({cat("custom_mask: dtype ", dtype_str(md)), "custom_mask", [m, md] { *m = with_dtype(*m, md); }});
      c.push_back({"custom_mask: 2-D", "custom_mask", [m] { *m = with_extra_dim(*m); }});
      if (a.custom_mask.numel() > 1)
        c.push_back({"custom_mask: stride 2", "custom_mask", [m] { *m = with_stride(*m, 0, 2); }});
      if (a.custom_mask.numel() > 0) {
        c.push_back({"custom_mask: null data", "custom_mask", [m] { *m = with_data(*m, nullptr); }});
      }
      c.push_back({"custom_mask: on cuda:0", "custom_mask", [m] { *m = with_device(*m, kvattn::Device::cuda(0)); }});
      if (p.mask_ind.back() > 0) {
        const int64_t n = p.mask_ind.back() - 1;
        c.push_back({"custom_mask shorter than mask_indptr[-1]", "custom_mask", [m, n] { *m = with_size(*m, 0, n); }});
      }
      indptr_corruptions(ctx, c, "mask_indptr", a.mask_indptr, "batch");
      index_array_corruptions(ctx, c, "mask_indptr", a.mask_indptr, true, "batch");
      std::vector<int64_t> with_bits;
      for (size_t b = 0; b < p.reqs.size(); ++b)
        if (p.reqs[b].qo * p.reqs[b].kv > 0) with_bits.push_back(int64_t(b));
      if (!with_bits.empty()) {
        const int64_t b = s.pick(with_bits);
        const int64_t need = (p.reqs[size_t(b)].qo * p.reqs[size_t(b)].kv + 7) / 8;
        TensorView* t = &a.mask_indptr;
        c.push_back({cat("request ", b, "'s mask one byte short"), "batch", [cx, t, b, need] {
                       auto v = int32_values(*t);
                       v[size_t(b) + 1] = int32_t(v[size_t(b)] + need - 1);
                       replace_int32(*cx, *t, v);
                     }});
      }
    }
  }

  // Block-sparse: the BSR's sizes, indptr and indices.
  if (api == AttentionApi::block_sparse) {
    kvattn::BSRMatrix* m = &a.bsr;
    const int64_t M = p.M, N = p.N, R = p.R, C = p.C;
    const int dims_case = int(s.range(0, 7));
    // Cases 0 and 1 break only the divisibility: q, out, lse (k, v) get the new row count and
    // indptr / indices stay consistent with the new block counts.
    const int64_t row_blocks = int64_t(p.bsr_ind.size()) - 1;
    c.push_back({cat("bsr sizes case ", dims_case), "bsr.dims+bsr indptr+bsr indices+dims",
                 [m, cx, dims_case, M, N, R, C, row_blocks, resize_rows, resize_kv] {
                   switch (dims_case) {
                     case 0:
                       if (R > 1) { m->M = M + 1; resize_rows(M + 1); }
                       else if (M > 0) { m->R = M + 1; replace_int32(*cx, m->indptr, {0}); }
                       else { m->M = 1; m->R = 2; resize_rows(1); }
                       break;
                     case 1:
                       if (C > 1) { m->N = N + 1; resize_kv(N + 1); }
                       else if (N > 0) {
                         m->C = N + 1;
                         replace_int32(*cx, m->indptr, std::vector<int32_t>(size_t(row_blocks + 1), 0));
                         replace_int32(*cx, m->indices, {});
                       } else { m->N = 1; m->C = 2; resize_kv(1); }
                       break;
                     case 2: m->R = 0; break;
                     case 3: m->C = -C; break;
                     case 4: m->M = int64_t(1) << 32; m->R = int64_t(1) << 32; break;
                     case 5: m->N = -N - C; break;
                     case 6: m->M = (kvattn::kMaxTotalTokens / R + 1) * R; break;
                     default: m->C = (kvattn::kMaxKVLen / std::max<int64_t>(1, N) + 1) * std::max<int64_t>(1, N); m->N = m->C; break;
                   }
                 }});
    indptr_corruptions(ctx, c, "bsr indptr", a.bsr.indptr);
    index_array_corruptions(ctx, c, "bsr indptr", a.bsr.indptr, true);
    {
      TensorView* t = &a.bsr.indptr;
      const int64_t nidx = int64_t(p.bsr_idx.size());
      if (p.bsr_ind.size() > 1)
        c.push_back({"bsr indptr[-1] past the end of bsr indices", "bsr indptr", [cx, t, nidx] {
                       auto v = int32_values(*t);
                       v.back() = int32_t(nidx + 1);
                       replace_int32(*cx, *t, v);
                     }});
    }
    index_array_corruptions(ctx, c, "bsr indices", a.bsr.indices, false);
    if (!p.bsr_idx.empty()) {
      TensorView* t = &a.bsr.indices;
      const int64_t j = s.range(0, int64_t(p.bsr_idx.size()) - 1);
      const int32_t bad = int32_t(s.pick<int64_t>({N / C, N / C + 3, kI32Max, -1, kI32Min}));
      c.push_back({cat("bsr indices[", j, "] = ", bad), "bsr indices", [cx, t, j, bad] {
                     auto v = int32_values(*t);
                     v[size_t(j)] = bad;
                     replace_int32(*cx, *t, v);
                   }});
      // A column block listed twice in one block row: insert a copy of entry j into its row.
      TensorView* ip = &a.bsr.indptr;
      std::vector<int32_t> ind = p.bsr_ind, idx = p.bsr_idx;
      c.push_back({cat("bsr indices[", j, "] repeated in its block row"), "bsr indices+bsr indptr", [cx, t, ip, j, ind, idx] {
                     auto i2 = ind;
                     auto x2 = idx;
                     x2.insert(x2.begin() + j, idx[size_t(j)]);
                     size_t row = 0;
                     while (ind[row + 1] <= j) ++row;
                     for (size_t r = row + 1; r < i2.size(); ++r) ++i2[r];
                     replace_int32(*cx, *t, x2);
                     replace_int32(*cx, *ip, i2);
                   }});
    }
  }
  return c;
}

}  // namespace kvattn_fuzz::attention
