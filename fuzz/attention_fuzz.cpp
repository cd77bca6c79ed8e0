// The attention wrappers: BatchDecode, BatchPrefill (ragged and paged KV) and
// BlockSparseAttention, plan() and run() on the CPU backend.
//
// Legal problems: 0-6 requests (decode, 15% of problems: 2-6 requests whose page lists begin with
// the same 128+ tokens of pages, in every SharedPrefix mode, so that BatchDecode's automatic
// cascade runs; block-sparse: 0-5 block rows of R = 1-6 queries over 0-8 column
// blocks of C = 1-8 keys), GQA groups 1-4, head dims 8/16/32/64 (qk and vo may differ), page sizes
// 1-16 over a shuffled page pool whose unused bytes are NaN, NHD/HND, split or 5-D combined
// caches, padded strides, q f32/f16/bf16, KV also fp8 e4m3/e5m2, any out dtype, every variant
// the API supports (causal, window, soft-cap, ALiBi, sm_scale, q/k/v scales, sigmoid, custom mask,
// fused RoPE with Llama 3.1 scaling), scheduler options and an optional host workspace. The
// result is compared with the float64 reference (tests/reference) element by element, with the
// tolerances of tests/support/compare.h (see check_result), and the inputs must be unchanged.
//
// Corrupted problems: one to three of the corruptions of attention_corruptions.cpp, each
// illegal by construction; plan() or run() must throw kvattn::Error and leave every buffer as it
// was. When the wrapper held an earlier plan and plan() was the call that threw, that plan must
// still be in place: a legal run() after the rejection is checked against the reference.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <optional>

#include "fuzz/attention_problem.h"
#include "reference/reference.h"
#include "support/compare.h"

namespace kvattn_fuzz {
namespace {

using namespace attention;
using kvattn_test::ComputeTolerance;

const char* api_name(AttentionApi a) {
  switch (a) {
    case AttentionApi::decode: return "BatchDecode";
    case AttentionApi::prefill_ragged: return "BatchPrefill(ragged)";
    case AttentionApi::prefill_paged: return "BatchPrefill(paged)";
    case AttentionApi::block_sparse: return "BlockSparseAttention";
  }
  return "?";
}


struct Wrappers {
  std::optional<kvattn::BatchDecode> decode;
  std::optional<kvattn::BatchPrefill> prefill;
  std::optional<kvattn::BlockSparseAttention> block_sparse;
  explicit Wrappers(const AttnArgs& a) {
    switch (a.api) {
      case AttentionApi::decode: decode.emplace(a.workspace, a.wrapper_layout); break;
      case AttentionApi::prefill_ragged:
      case AttentionApi::prefill_paged: prefill.emplace(a.workspace, a.wrapper_layout); break;
      case AttentionApi::block_sparse: block_sparse.emplace(a.workspace); break;
    }
  }
};

void do_plan(const AttnArgs& a, Wrappers& w) {
  switch (a.api) {
    case AttentionApi::decode: {
      kvattn::BatchDecodePlan p;
      static_cast<kvattn::AttentionShape&>(p) = a.shape;
      p.page_table = a.table;
      p.page_size = a.page_size;
      p.shared_prefix = a.shared_prefix;
      w.decode->plan(p);
      return;
    }
    case AttentionApi::prefill_ragged:
    case AttentionApi::prefill_paged: {
      kvattn::BatchPrefillPlan p;
      static_cast<kvattn::AttentionShape&>(p) = a.shape;
      p.qo_indptr = a.qo_indptr;
      if (a.plan_kv_indptr) p.kv_indptr = a.kv_indptr;
      if (a.plan_page_table) p.page_table = a.table;
      p.page_size = a.page_size;
      p.custom_mask = a.custom_mask;
      p.mask_indptr = a.mask_indptr;
      w.prefill->plan(p);
      return;
    }
    case AttentionApi::block_sparse: {
      kvattn::BlockSparsePlan p;
      static_cast<kvattn::AttentionShape&>(p) = a.shape;
      p.bsr = a.bsr;
      w.block_sparse->plan(p);
      return;
    }
  }
}

void do_run(const AttnArgs& a, const Wrappers& w) {
  switch (a.api) {
    case AttentionApi::decode:
      w.decode->run(a.q, a.cache, a.out, a.lse);
      w.decode->check_errors();  // the CPU validates every id before computing: always quiet
      return;
    case AttentionApi::prefill_ragged:
    case AttentionApi::prefill_paged:
      if (a.run_paged)
        w.prefill->run(a.q, a.cache, a.out, a.lse);
      else
        w.prefill->run(a.q, a.k, a.v, a.out, a.lse);
      w.prefill->check_errors();
      return;
    case AttentionApi::block_sparse: w.block_sparse->run(a.q, a.k, a.v, a.out, a.lse); return;
  }
}


Variant random_variant(Source& s, AttentionApi api, bool fp8) {
  Variant v;
  v.causal = s.chance(35);
  if (s.chance(20)) v.window_left = int(s.range(0, 24));
  if (s.chance(20)) v.logits_soft_cap = float(s.uniform(1.0, 50.0));
  v.alibi = s.chance(15);
  if (s.chance(15)) v.sm_scale = float(s.uniform(-0.5, 0.5));
  if (s.chance(10)) {
    v.sigmoid = true;
    v.sigmoid_bias = float(s.uniform(-2.0, 2.0));
  }
  if (s.chance(15)) {
    kvattn::RopeConfig r;
    r.rope_scale = float(s.uniform(0.5, 4.0));
    r.rope_theta = s.pick({1.0e4f, 5.0e5f, 500.0f});
    r.interleave = s.coin();
    if (s.chance(30)) r.llama31 = kvattn::Llama31Scaling{};
    v.rope = r;
  }
  if (s.chance(fp8 ? 60 : 15))
    v = v.with_scales(float(s.uniform(0.25, 2.0)), float(s.uniform(0.25, 2.0)), float(s.uniform(-2.0, 2.0)));
  const bool prefill = api == AttentionApi::prefill_ragged || api == AttentionApi::prefill_paged;
  v.custom_mask = prefill && s.chance(20);
  return v;
}

double fill(Ctx& ctx, int mode, char what) {
  if (mode == 1) return 1.0;
  if (what == 'v') return ctx.values.uniform(-1, 1);
  if (mode == 2) return ctx.values.uniform(0.5, 1.5);  // logits of one sign, near head_dim
  return std::clamp(ctx.values.normal(), -3.0, 3.0);
}

void generate(Ctx& ctx, AttnProblem& p) {
  Source& s = ctx.src;
  const AttentionApi api = p.api;
  p.hkv = int(s.range(1, 3));
  p.hq = p.hkv * int(s.range(1, 4));
  p.dqk = int(s.pick<int64_t>({8, 16, 32, 64}));
  p.dvo = s.chance(70) ? p.dqk : int(s.pick<int64_t>({8, 16, 32, 64}));
  p.qt = s.pick(kComputeDtypes);
  p.kvt = s.chance(40) ? p.qt : s.pick(kKVDtypes);
  p.ot = s.chance(50) ? p.qt : s.pick(kComputeDtypes);
  p.variant = random_variant(s, api, kvattn::is_fp8(p.kvt));
  p.layout = s.coin() ? KVLayout::NHD : KVLayout::HND;
  p.page_size = int(s.range(1, 16));
  p.want_lse = !p.variant.sigmoid && s.chance(80);
  const int fill_mode = s.chance(85) ? 0 : s.chance(30) ? 1 : 2;

  // Lengths.
  std::vector<std::pair<int64_t, int64_t>> lens;  // (qo, kv)
  if (api == AttentionApi::block_sparse) {
    p.R = s.range(1, 6);
    p.C = s.range(1, 8);
    const int64_t row_blocks = s.range(0, 5), col_blocks = s.range(0, 8);
    p.M = p.R * row_blocks;
    p.N = p.C * col_blocks;
    p.bsr_ind = {0};
    for (int64_t r = 0; r < row_blocks; ++r) {
      std::vector<int32_t> cols;
      const int density = int(s.range(0, 100));
      for (int32_t c = 0; c < col_blocks; ++c)
        if (s.chance(density)) cols.push_back(c);
      for (size_t i = cols.size(); i > 1; --i) std::swap(cols[i - 1], cols[size_t(s.range(0, int64_t(i) - 1))]);
      p.bsr_idx.insert(p.bsr_idx.end(), cols.begin(), cols.end());
      p.bsr_ind.push_back(int32_t(p.bsr_idx.size()));
    }
    lens.push_back({p.M, p.N});
  } else if (api == AttentionApi::decode && s.chance(15)) {
    // Requests whose page lists begin with the same pages (a radix-tree cache), as long as
    // BatchDecode's shared-prefix detection needs (128 tokens of full pages at least), then a few
    // pages of their own; some requests may stop inside the prefix (they share nothing).
    p.shared_prefix_pages = (128 + p.page_size - 1) / p.page_size + int(s.range(0, 2));
    const int64_t prefix = int64_t(p.shared_prefix_pages) * p.page_size;
    const int64_t B = s.range(2, 6);
    for (int64_t b = 0; b < B; ++b)
      lens.push_back({1, s.chance(10) ? s.range(1, prefix) : prefix + s.range(1, 40)});
  } else {
    const int64_t B = s.range(0, api == AttentionApi::decode ? 6 : 5);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t kv = s.chance(12) ? 0 : s.range(1, s.chance(20) ? 96 : 32);
      const int64_t qo = api == AttentionApi::decode ? 1 : s.chance(10) ? std::min<int64_t>(kv, 16)
                                                                       : s.range(0, std::min<int64_t>(kv, 16));
      lens.push_back({qo, api == AttentionApi::decode ? std::max<int64_t>(kv, 0) : kv});
    }
    if (api == AttentionApi::decode)  // decode: one query per request, even with no KV
      for (auto& l : lens) l.first = 1;
  }
  for (auto [qo, kv] : lens) p.rows += qo;
  const bool paged = api == AttentionApi::decode || api == AttentionApi::prefill_paged;
  const bool combined = paged && p.dqk == p.dvo && s.chance(30);

  std::ostringstream os;
  os << api_name(api) << ": heads " << p.hq << "/" << p.hkv << " dims " << p.dqk << "/" << p.dvo << " q "
     << dtype_str(p.qt) << " kv " << dtype_str(p.kvt) << " out " << dtype_str(p.ot) << " variant "
     << p.variant.describe() << (p.want_lse ? " lse" : " no-lse") << " fill " << fill_mode;
  if (api == AttentionApi::block_sparse) {
    os << " bsr M " << p.M << " N " << p.N << " R " << p.R << " C " << p.C << " indptr [";
    for (int32_t x : p.bsr_ind) os << x << " ";
    os << "] indices [";
    for (int32_t x : p.bsr_idx) os << x << " ";
    os << "]";
  } else {
    os << " lens (qo,kv) [";
    for (auto [qo, kv] : lens) os << "(" << qo << "," << kv << ")";
    os << "]";
  }
  if (paged) os << " " << kvattn::kv_layout_name(p.layout) << " page " << p.page_size << (combined ? " combined" : " split");
  if (p.shared_prefix_pages > 0) os << " shared prefix " << p.shared_prefix_pages << " pages";
  ctx.note(os.str());

  // Queries.
  p.q = make_tensor(ctx, p.qt, {p.rows, p.hq, p.dqk});
  int64_t row0 = 0;
  for (auto [qo, kv] : lens) {
    RequestValues r;
    r.qo = qo;
    r.kv = kv;
    r.q_pos0 = kv - qo;
    for (int64_t i = 0; i < qo; ++i)
      for (int h = 0; h < p.hq; ++h)
        for (int e = 0; e < p.dqk; ++e) {
          const int64_t off = p.q.offset({row0 + i, h, e});
          p.q.set_at(off, fill(ctx, fill_mode, 'q'));
          r.q.push_back(p.q.get_at(off));
        }
    row0 += qo;
    p.reqs.push_back(std::move(r));
  }

  // Keys and values.
  std::vector<int32_t> kv_ind{0}, qo_ind{0};
  for (auto [qo, kv] : lens) {
    kv_ind.push_back(kv_ind.back() + int32_t(kv));
    qo_ind.push_back(qo_ind.back() + int32_t(qo));
  }
  if (paged) {
    std::vector<int64_t> kv_lens;
    for (auto [qo, kv] : lens) kv_lens.push_back(kv);
    kvattn_test::PagedKVSpec spec{kv_lens, p.page_size, p.hkv, p.dqk, p.dvo, p.kvt, p.layout, combined,
                                  s.chance(40), false, int(s.range(0, 3)), p.shared_prefix_pages};
    p.paged.emplace(spec, ctx.values);
  } else {
    p.k = make_tensor(ctx, p.kvt, {int64_t(kv_ind.back()), p.hkv, p.dqk});
    p.v = make_tensor(ctx, p.kvt, {int64_t(kv_ind.back()), p.hkv, p.dvo});
  }
  for (size_t b = 0; b < p.reqs.size(); ++b) {
    RequestValues& r = p.reqs[b];
    r.k.resize(size_t(r.kv * p.hkv * p.dqk));
    r.v.resize(size_t(r.kv * p.hkv * p.dvo));
    for (int64_t j = 0; j < r.kv; ++j)
      for (int h = 0; h < p.hkv; ++h) {
        for (int e = 0; e < p.dqk; ++e) {
          const double x = fill(ctx, fill_mode, 'k');
          double& dst = r.k[size_t((j * p.hkv + h) * p.dqk + e)];
          if (paged) {
            dst = p.paged->set_k(b, j, h, e, x);
          } else {
            const int64_t off = p.k.offset({kv_ind[b] + j, h, e});
            p.k.set_at(off, x);
            dst = p.k.get_at(off);
          }
        }
        for (int e = 0; e < p.dvo; ++e) {
          const double x = fill(ctx, fill_mode, 'v');
          double& dst = r.v[size_t((j * p.hkv + h) * p.dvo + e)];
          if (paged) {
            dst = p.paged->set_v(b, j, h, e, x);
          } else {
            const int64_t off = p.v.offset({kv_ind[b] + j, h, e});
            p.v.set_at(off, x);
            dst = p.v.get_at(off);
          }
        }
      }
  }

  // Custom mask: random bits per request at byte offsets with gaps; some rows fully masked.
  p.mask_ind = {0};
  if (p.variant.custom_mask) {
    for (const RequestValues& r : p.reqs) {
      const int64_t bits = r.qo * r.kv, start = int64_t(p.mask_bytes.size());
      p.mask_bytes.resize(size_t(start + (bits + 7) / 8 + ctx.values.integer(0, 2)));
      for (size_t i = size_t(start); i < p.mask_bytes.size(); ++i) p.mask_bytes[i] = uint8_t(ctx.values.integer(0, 255));
      const double density = ctx.values.uniform(0.2, 1.0);
      for (int64_t bit = 0; bit < bits; ++bit) {
        uint8_t& byte = p.mask_bytes[size_t(start + bit / 8)];
        byte = uint8_t(ctx.values.coin(density) ? byte | (1u << (bit % 8)) : byte & ~(1u << (bit % 8)));
      }
      p.mask_ind.push_back(int32_t(p.mask_bytes.size()));
    }
    p.mask = HostTensor(DType::u8, {int64_t(p.mask_bytes.size())});
    for (size_t i = 0; i < p.mask_bytes.size(); ++i) p.mask.set_at(int64_t(i), p.mask_bytes[i]);
    p.mask_indptr = int32_host(p.mask_ind);
  }

  p.out = make_tensor(ctx, p.ot, {p.rows, p.hq, p.dvo});
  p.lse = make_tensor(ctx, DType::f32, {p.rows, p.hq});
  p.qo_indptr = int32_host(qo_ind);
  p.kv_indptr = int32_host(kv_ind);
  p.bsr_indptr = int32_host(p.bsr_ind);
  p.bsr_indices = int32_host(p.bsr_idx);
  if (s.chance(20)) {
    p.workspace = HostTensor(s.coin() ? DType::u8 : DType::f32, {s.range(0, 1 << 14)});
    p.workspace.poison();
  }

  // The legal call.
  AttnArgs& a = p.legal;
  a.api = api;
  a.shape.num_qo_heads = p.hq;
  a.shape.num_kv_heads = p.hkv;
  a.shape.head_dim_qk = p.dqk;
  a.shape.head_dim_vo = p.dvo == p.dqk && s.coin() ? 0 : p.dvo;
  a.shape.q_dtype = p.qt;
  if (p.kvt != p.qt || s.coin()) a.shape.kv_dtype = p.kvt;
  if (p.ot != p.qt || s.coin()) a.shape.o_dtype = p.ot;
  a.shape.variant = p.variant;
  const int64_t batch = api == AttentionApi::block_sparse ? int64_t(p.bsr_ind.size()) - 1 : int64_t(lens.size());
  a.shape.scheduler = random_scheduler(s, batch, p.rows, true);
  a.wrapper_layout = p.layout;
  if (!p.workspace.shape().empty()) a.workspace = p.workspace.view();
  a.q = p.q.view();
  a.out = p.out.view();
  if (p.want_lse) a.lse = p.lse.view();
  if (paged) {
    a.table = p.paged->table();
    a.page_size = p.page_size;
    a.cache = p.paged->cache();
    a.plan_page_table = true;
    a.run_paged = true;
    if (api == AttentionApi::decode)  // the mode matters where pages are shared; any batch takes each
      a.shared_prefix = s.pick({kvattn::SharedPrefix::automatic, kvattn::SharedPrefix::always,
                                kvattn::SharedPrefix::never});
  } else {
    a.k = p.k.view();
    a.v = p.v.view();
  }
  if (api == AttentionApi::prefill_ragged || api == AttentionApi::prefill_paged) a.qo_indptr = p.qo_indptr.view();
  if (api == AttentionApi::prefill_ragged) {
    a.kv_indptr = p.kv_indptr.view();
    a.plan_kv_indptr = true;
  }
  if (p.variant.custom_mask) {
    a.custom_mask = p.mask.view();
    a.mask_indptr = p.mask_indptr.view();
  }
  if (api == AttentionApi::block_sparse) {
    a.bsr = {p.bsr_indptr.view(), p.bsr_indices.view(), p.M, p.N, p.R, p.C};
  }
  ctx.note("scheduler: workers ", a.shape.scheduler.num_workers, " fixed_split ", a.shape.scheduler.fixed_split_size,
           a.shape.scheduler.disable_split_kv ? " no-split" : "", a.shape.scheduler.cuda_graph ? " graph" : "",
           p.workspace.shape().empty() ? "" : " workspace");
}

void track_all(Ctx& ctx, const AttnProblem& p) {
  for (const HostTensor* t : {&p.q, &p.k, &p.v, &p.out, &p.lse, &p.workspace, &p.qo_indptr, &p.kv_indptr, &p.mask,
                              &p.mask_indptr, &p.bsr_indptr, &p.bsr_indices})
    ctx.track(*t);
  if (p.paged)
    for (const HostTensor* t : {&p.paged->k, &p.paged->v, &p.paged->kv, &p.paged->indptr, &p.paged->indices,
                                &p.paged->last_page_len})
      ctx.track(*t);
}

// Fused RoPE widens the f32 allowance. The kernel forms each angle a = pos * f_t in f32 (powf, the
// division by rope_scale, the Llama 3.1 blend, the product): within 64 ulps of |a| (the bound
// ops_rope_test.cpp derives), plus a few ulps from cosf/sinf, so da <= 64 u |a| + 8 u (u = 2^-24).
// A rotation off by da moves a vector by at most da times its norm, so a logit moves by at most
// delta = |scale| * |q| * |k| * 2 da (q and k both rotated). As for the approximate tanh
// (compare.h, allow_approx_tanh): a weight moves by a factor within e^(+-2 delta), an output by
// (e^(2 delta) - 1) o_mag, the LSE by delta / ln 2.
ComputeTolerance tolerance_for(const AttnProblem& p) {
  ComputeTolerance t;
  if (!p.variant.rope) return t;
  double qn = 0, kn = 0, max_pos = 0;
  for (const RequestValues& r : p.reqs) {
    for (size_t i = 0; i + size_t(p.dqk) <= r.q.size(); i += size_t(p.dqk)) {
      double n = 0;
      for (int e = 0; e < p.dqk; ++e) n += r.q[i + size_t(e)] * r.q[i + size_t(e)];
      qn = std::max(qn, std::sqrt(n));
    }
    for (size_t i = 0; i + size_t(p.dqk) <= r.k.size(); i += size_t(p.dqk)) {
      double n = 0;
      for (int e = 0; e < p.dqk; ++e) n += r.k[i + size_t(e)] * r.k[i + size_t(e)];
      kn = std::max(kn, std::sqrt(n));
    }
    max_pos = std::max({max_pos, double(r.kv), std::abs(double(r.q_pos0))});
  }
  const Variant& v = p.variant;
  const double sm = v.sm_scale ? double(*v.sm_scale) : 1.0 / std::sqrt(double(p.dqk));
  const double scale = std::abs(sm * double(v.q_scale) * double(v.k_scale));
  const double f_max = 1.0 / double(v.rope->rope_scale);  // f_0 = theta^0 / rope_scale, the largest
  const double u = 0x1p-24;
  const double da = 64 * u * max_pos * f_max + 8 * u;
  const double delta = scale * qn * kn * 2 * da;
  t.accumulation += std::expm1(2 * delta);
  t.lse_abs += delta / std::log(2.0);
  return t;
}

// Checks out (and lse) of a legal run against the float64 reference. Tolerances: compare.h's,
// which hold for these inputs (|q|, |k| <= 3, head dims <= 64, f32 accumulation): inputs are
// compared as stored (the reference reads the decoded values, so no input dtype adds error),
// kAccumulation * o_mag for the f32 logits and sums, 2 unit roundoffs of the out dtype for its
// rounding, LSE within 2e-4 + 1e-6 |lse|, a row that sees no key exactly o = 0 and lse = -inf;
// fused RoPE widened as tolerance_for() derives.
void check_result(const AttnProblem& p) {
  std::vector<double> o_ref, mag_ref, lse_ref;
  for (size_t b = 0; b < p.reqs.size(); ++b) {
    const RequestValues& r = p.reqs[b];
    kvattn_test::ref::Request rr{r.qo, r.kv, p.hq, p.hkv, p.dqk, p.dvo, r.q.data(), r.k.data(), r.v.data(), r.q_pos0, {}};
    if (p.variant.custom_mask) rr.mask = kvattn_test::ref::custom_mask_bits(p.mask_bytes.data() + p.mask_ind[b], r.kv);
    if (p.api == AttentionApi::block_sparse) rr.mask = kvattn_test::ref::bsr_pattern(p.bsr_ind, p.bsr_idx, p.R, p.C);
    const auto res = kvattn_test::ref::attention(rr, p.variant);
    o_ref.insert(o_ref.end(), res.o.begin(), res.o.end());
    mag_ref.insert(mag_ref.end(), res.o_mag.begin(), res.o_mag.end());
    lse_ref.insert(lse_ref.end(), res.lse.begin(), res.lse.end());
  }
  ComputeTolerance tol = tolerance_for(p);
  // A cascade rounds each earlier level's state to the out dtype before the merge (as
  // tests/cascade_test.cpp argues): half its unit roundoff of o_mag per extra level.
  if (p.cascade_levels > 1) {
    const auto ot = kvattn_test::output_tolerance(p.ot);
    tol.accumulation += (p.cascade_levels - 1) * ot.rtol / 2;
    tol.output_abs += (p.cascade_levels - 1) * ot.atol;
  }
  if (auto r = kvattn_test::outputs_match(p.out, o_ref, mag_ref, tol); !r) fail("out differs from the reference: ", r.message());
  if (p.want_lse) {
    if (auto r = kvattn_test::lse_match(p.lse, lse_ref, tol); !r) fail("lse differs from the reference: ", r.message());
  } else {
    for (size_t i = 0; i < p.lse.raw_bytes().size(); ++i)
      if (p.lse.raw_bytes()[i] != HostTensor::kPoisonByte) fail("lse was written although not requested");
  }
}

// Which levels the decode plan chose (a shared prefix found: a cascade), for check_result.
void note_cascade(Ctx& ctx, AttnProblem& p, const Wrappers& w) {
  const kvattn::CascadeAttention* c = p.api == AttentionApi::decode ? w.decode->cascade() : nullptr;
  p.cascade_levels = c ? c->num_levels() : 0;
  if (c) ctx.note("ran as a cascade of " + std::to_string(p.cascade_levels) + " levels");
}

}  // namespace

void fuzz_attention(Ctx& ctx, AttentionApi api) {
  auto owned = std::make_unique<AttnProblem>();
  AttnProblem& p = *owned;
  p.api = api;
  generate(ctx, p);
  track_all(ctx, p);

  if (!ctx.corrupt) {
    std::vector<const HostTensor*> inputs = {&p.q, &p.k, &p.v, &p.qo_indptr, &p.kv_indptr, &p.mask,
                                             &p.mask_indptr, &p.bsr_indptr, &p.bsr_indices};
    if (p.paged)
      for (const HostTensor* t : {&p.paged->k, &p.paged->v, &p.paged->kv, &p.paged->indptr, &p.paged->indices,
                                  &p.paged->last_page_len})
        inputs.push_back(t);
    std::vector<std::vector<uint8_t>> before;
    for (const HostTensor* t : inputs) before.push_back(t->snapshot());
    Wrappers w(p.legal);
    expect_success(ctx, "plan()", [&] { do_plan(p.legal, w); });
    note_cascade(ctx, p, w);
    expect_success(ctx, "run()", [&] { do_run(p.legal, w); });
    for (size_t i = 0; i < inputs.size(); ++i)
      if (!inputs[i]->same_bytes(before[i])) fail("a legal run() changed input buffer #", i);
    check_result(p);
    if (ctx.src.chance(20)) {  // the same plan again on re-poisoned outputs: the same bytes
      const auto out1 = p.out.snapshot(), lse1 = p.lse.snapshot();
      p.out.poison();
      p.lse.poison();
      expect_success(ctx, "run() again", [&] { do_run(p.legal, w); });
      if (!p.out.same_bytes(out1) || !p.lse.same_bytes(lse1)) fail("a second run() of one plan gave other bytes");
      ctx.note("ran twice");
    }
    return;
  }

  const bool prior = ctx.src.coin();
  Wrappers w(p.legal);
  if (prior) {
    expect_success(ctx, "plan() before the corrupted call", [&] { do_plan(p.legal, w); });
    note_cascade(ctx, p, w);
    ctx.note("planned legally first");
  }
  AttnArgs bad = p.legal;
  std::vector<Corruption> options = attention_corruptions(ctx, p, bad, prior);
  bool reached_run = false;
  expect_rejection(ctx, [&] {
    ctx.apply_corruptions(options);
    if (prior) {
      do_plan(bad, w);
      reached_run = true;
      do_run(bad, w);
    } else {
      Wrappers fresh(bad);
      if (bad.plan_first) do_plan(bad, fresh);
      reached_run = true;
      do_run(bad, fresh);
    }
  });
  if (prior && !reached_run) {
    // plan() threw: the earlier plan must still be the wrapper's.
    expect_success(ctx, "run() on the earlier plan after a rejected plan()", [&] { do_run(p.legal, w); });
    check_result(p);
    ctx.note("earlier plan still runs correctly");
  }
}

}  // namespace kvattn_fuzz
