// CascadeAttention, plan() and run() on the CPU backend.
//
// Legal problems: 1-5 requests of 1-3 query rows; 1-3 levels over one shuffled page pool (page
// sizes 1-16, NHD/HND, split or 5-D combined caches): level 0 one or two groups of consecutive
// requests, each over pages of its own (a group may have none, or fewer keys than rows); with three
// levels a middle level of one group per request pair; the last level each request's own pages,
// at least as many keys as its rows. q f32/f16/bf16, KV also fp8, any out dtype; the variants a
// cascade takes: causal (the last level), soft-cap, sm_scale, q/k/v scales. An optional host
// workspace. The result is compared with the float64 reference of the flat problem (a request's
// keys: its levels' keys in level order), with compare.h's tolerances plus half a unit roundoff
// of the out dtype per extra level (each earlier level's state is rounded to it before the merge,
// tests/cascade_test.cpp).
//
// Corrupted problems: one to three of: a level's page-table arrays (dtype, length, device, null),
// its qo_indptr values (start, order, a total other than the last level's), kv_indices values
// (negative), last_page_len values (0 with pages, above the page size), no levels, a last-level
// group with fewer keys than rows, a variant a cascade does not take, and at run() q/out/lse of
// the wrong rows or dtype, out inside the workspace, a cache with too few pages. plan() or run()
// must throw kvattn::Error and change no buffer.
#include <algorithm>
#include <memory>
#include <numeric>

#include "fuzz/operations.h"
#include "reference/reference.h"
#include "support/compare.h"

namespace kvattn_fuzz {
namespace {

using kvattn::KVLayout;

struct Level {
  std::vector<int32_t> qo{0};           // rows per group (prefix sums)
  std::vector<int32_t> indptr{0}, indices, last;
  std::vector<int64_t> kv;              // keys per group
  HostTensor t_qo, t_indptr, t_indices, t_last;
};

struct CascadeProblem {
  int hq = 1, hkv = 1, d = 8, page_size = 1;
  DType qt = DType::f32, kvt = DType::f32, ot = DType::f32;
  KVLayout layout = KVLayout::NHD;
  bool combined = false, want_lse = true;
  kvattn::Variant variant;
  std::vector<int64_t> rows;  // query rows per request
  std::vector<Level> levels;
  HostTensor q, k, v, kv, out, lse, workspace;
  std::vector<std::vector<double>> keys, values;  // per request: the flat problem's [kv][Hkv][D]
  std::vector<double> qd;
};

// Group g of level l covers requests [first[g], first[g + 1]).
void add_group(CascadeProblem& p, Level& L, int64_t rows, int64_t kv, int32_t& next_page) {
  L.qo.push_back(L.qo.back() + int32_t(rows));
  L.kv.push_back(kv);
  const int64_t pages = (kv + p.page_size - 1) / p.page_size;
  for (int64_t i = 0; i < pages; ++i) L.indices.push_back(next_page++);
  L.indptr.push_back(int32_t(L.indices.size()));
  L.last.push_back(int32_t(pages == 0 ? 0 : kv - (pages - 1) * p.page_size));
}

void generate(Ctx& ctx, CascadeProblem& p) {
  Source& s = ctx.src;
  p.hkv = int(s.range(1, 2));
  p.hq = p.hkv * int(s.range(1, 4));
  p.d = int(s.pick<int64_t>({8, 16, 32}));
  p.qt = s.pick(kComputeDtypes);
  p.kvt = s.chance(40) ? p.qt : s.pick(kKVDtypes);
  p.ot = s.chance(50) ? p.qt : s.pick(kComputeDtypes);
  p.layout = s.coin() ? KVLayout::NHD : KVLayout::HND;
  p.page_size = int(s.range(1, 16));
  p.combined = s.chance(30);
  if (s.chance(40)) p.variant.causal = true;
  if (s.chance(25)) p.variant.logits_soft_cap = float(s.uniform(1.0, 50.0));
  if (s.chance(20)) p.variant.sm_scale = float(s.uniform(-0.5, 0.5));
  if (s.chance(kvattn::is_fp8(p.kvt) ? 60 : 15))
    p.variant = p.variant.with_scales(float(s.uniform(0.25, 2.0)), float(s.uniform(0.25, 2.0)),
                                      float(s.uniform(-2.0, 2.0)));
  p.want_lse = s.chance(70);

  const int B = int(s.range(1, 5));
  for (int b = 0; b < B; ++b) p.rows.push_back(s.range(1, 3));
  const int L = int(s.range(1, 3));
  p.levels.resize(size_t(L));
  // Pages are numbered as handed out, then the pool is shuffled (each level's groups own
  // disjoint pages).
  int32_t next = 0;
  auto rows_of = [&](int b0, int b1) {
    int64_t r = 0;
    for (int b = b0; b < b1; ++b) r += p.rows[size_t(b)];
    return r;
  };
  if (L >= 2) {  // level 0: one or two groups
    const int split = B > 1 && s.coin() ? int(s.range(1, B - 1)) : B;
    for (auto [b0, b1] : {std::pair{0, split}, std::pair{split, B}}) {
      if (b0 == b1) continue;
      add_group(p, p.levels[0], rows_of(b0, b1), s.chance(15) ? 0 : s.range(1, 48), next);
    }
  }
  if (L == 3)  // the middle level: one group per pair of requests
    for (int b0 = 0; b0 < B; b0 += 2)
      add_group(p, p.levels[1], rows_of(b0, std::min(B, b0 + 2)), s.chance(15) ? 0 : s.range(1, 24), next);
  for (int b = 0; b < B; ++b) add_group(p, p.levels[size_t(L - 1)], p.rows[size_t(b)], p.rows[size_t(b)] + s.range(0, 24), next);
  const int32_t used = next, spare = int32_t(s.range(0, 3));
  std::vector<int32_t> perm(size_t(used + spare));
  std::iota(perm.begin(), perm.end(), 0);
  for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[size_t(s.range(0, int64_t(i) - 1))]);
  for (Level& lv : p.levels)
    for (int32_t& id : lv.indices) id = perm[size_t(id)];
  const int64_t pages = used + spare;

  std::ostringstream os;
  os << "CascadeAttention: heads " << p.hq << "/" << p.hkv << " dim " << p.d << " q " << dtype_str(p.qt) << " kv "
     << dtype_str(p.kvt) << " out " << dtype_str(p.ot) << " variant " << p.variant.describe()
     << (p.want_lse ? " lse" : " no-lse") << " page " << p.page_size << " " << kvattn::kv_layout_name(p.layout)
     << (p.combined ? " combined" : " split") << " rows [";
  for (int64_t r : p.rows) os << r << " ";
  os << "] levels";
  for (const Level& lv : p.levels) {
    os << " {";
    for (size_t g = 0; g < lv.kv.size(); ++g) os << "(" << lv.qo[g + 1] - lv.qo[g] << "," << lv.kv[g] << ")";
    os << "}";
  }
  ctx.note(os.str());

  // The cache and the flat problem's keys.
  const std::vector<int64_t> shape = p.layout == KVLayout::NHD ? std::vector<int64_t>{pages, p.page_size, p.hkv, p.d}
                                                               : std::vector<int64_t>{pages, p.hkv, p.page_size, p.d};
  if (p.combined) {
    auto s5 = shape;
    s5.insert(s5.begin() + 1, 2);
    p.kv = HostTensor(p.kvt, s5);
    p.kv.poison();
  } else {
    p.k = make_tensor(ctx, p.kvt, shape);
    p.v = make_tensor(ctx, p.kvt, shape);
    p.k.poison();
    p.v.poison();
  }
  auto offset = [&](bool is_v, int32_t page, int64_t slot, int h, int e) {
    const int64_t a = p.layout == KVLayout::NHD ? slot : h, c = p.layout == KVLayout::NHD ? h : slot;
    return p.combined ? p.kv.offset({page, is_v ? 1 : 0, a, c, e}) : (is_v ? p.v : p.k).offset({page, a, c, e});
  };
  auto store = [&](bool is_v, int32_t page, int64_t slot, int h, int e, double x) {
    HostTensor& t = p.combined ? p.kv : (is_v ? p.v : p.k);
    const int64_t off = offset(is_v, page, slot, h, e);
    t.set_at(off, x);
    return t.get_at(off);
  };
  // Each group's keys once, then every request's flat list.
  std::vector<std::vector<std::vector<double>>> gk(p.levels.size()), gv(p.levels.size());
  for (size_t l = 0; l < p.levels.size(); ++l) {
    Level& lv = p.levels[l];
    for (size_t g = 0; g < lv.kv.size(); ++g) {
      std::vector<double> kk, vv;
      for (int64_t t = 0; t < lv.kv[g]; ++t) {
        const int32_t page = lv.indices[size_t(lv.indptr[g] + t / p.page_size)];
        for (int h = 0; h < p.hkv; ++h)
          for (int e = 0; e < p.d; ++e) {
            kk.push_back(store(false, page, t % p.page_size, h, e, std::clamp(ctx.values.normal(), -3.0, 3.0)));
            vv.push_back(store(true, page, t % p.page_size, h, e, ctx.values.uniform(-1, 1)));
          }
      }
      gk[l].push_back(std::move(kk));
      gv[l].push_back(std::move(vv));
    }
    lv.t_qo = int32_host(lv.qo);
    lv.t_indptr = int32_host(lv.indptr);
    lv.t_indices = int32_host(lv.indices);
    lv.t_last = int32_host(lv.last);
  }
  p.keys.assign(size_t(B), {});
  p.values.assign(size_t(B), {});
  for (size_t l = 0; l < p.levels.size(); ++l) {
    const Level& lv = p.levels[l];
    int64_t row = 0;
    size_t g = 0;
    for (int b = 0; b < B; ++b) {
      while (row >= lv.qo[g + 1]) ++g;
      p.keys[size_t(b)].insert(p.keys[size_t(b)].end(), gk[l][g].begin(), gk[l][g].end());
      p.values[size_t(b)].insert(p.values[size_t(b)].end(), gv[l][g].begin(), gv[l][g].end());
      row += p.rows[size_t(b)];
    }
  }
  const int64_t total_rows = rows_of(0, B);
  p.q = make_tensor(ctx, p.qt, {total_rows, p.hq, p.d});
  for (int64_t r = 0; r < total_rows; ++r)
    for (int h = 0; h < p.hq; ++h)
      for (int e = 0; e < p.d; ++e) {
        const int64_t off = p.q.offset({r, h, e});
        p.q.set_at(off, std::clamp(ctx.values.normal(), -3.0, 3.0));
        p.qd.push_back(p.q.get_at(off));
      }
  p.out = make_tensor(ctx, p.ot, {total_rows, p.hq, p.d});
  p.lse = make_tensor(ctx, DType::f32, {total_rows, p.hq});
  p.out.poison();
  p.lse.poison();
  if (s.chance(30)) {
    p.workspace = HostTensor(DType::u8, {s.range(1, 1 << 16)});
    p.workspace.poison();
  }
}

// The arguments of one plan() + run(); corruptions rewrite a copy.
struct CascadeArgs {
  kvattn::CascadePlan plan;
  TensorView q, out, lse, workspace;
  kvattn::PagedKVCache cache;
  bool no_levels = false;  // plan() gets no levels (a flag: other corruptions hold references into plan.levels)
};

CascadeArgs legal_args(CascadeProblem& p) {
  CascadeArgs a;
  a.plan.num_qo_heads = p.hq;
  a.plan.num_kv_heads = p.hkv;
  a.plan.head_dim_qk = p.d;
  a.plan.q_dtype = p.qt;
  a.plan.kv_dtype = p.kvt;
  a.plan.o_dtype = p.ot;
  a.plan.variant = p.variant;
  a.plan.page_size = p.page_size;
  for (Level& lv : p.levels)
    a.plan.levels.push_back({lv.t_qo.view(), {lv.t_indptr.view(), lv.t_indices.view(), lv.t_last.view()}});
  a.q = p.q.view();
  a.out = p.out.view();
  if (p.want_lse) a.lse = p.lse.view();
  if (!p.workspace.shape().empty()) a.workspace = p.workspace.view();
  a.cache = p.combined ? kvattn::PagedKVCache::combined(p.kv.view(), p.layout)
                       : kvattn::PagedKVCache::split(p.k.view(), p.v.view(), p.layout);
  return a;
}

void check_result(const CascadeProblem& p) {
  std::vector<double> o_ref, mag_ref, lse_ref;
  int64_t row = 0;
  for (size_t b = 0; b < p.rows.size(); ++b) {
    const int64_t qo = p.rows[b], kv = int64_t(p.keys[b].size()) / (p.hkv * p.d);
    kvattn_test::ref::Request rr{qo, kv, p.hq, p.hkv, p.d, p.d, p.qd.data() + row * p.hq * p.d,
                                 p.keys[b].data(), p.values[b].data(), kv - qo, {}};
    const auto res = kvattn_test::ref::attention(rr, p.variant);
    o_ref.insert(o_ref.end(), res.o.begin(), res.o.end());
    mag_ref.insert(mag_ref.end(), res.o_mag.begin(), res.o_mag.end());
    lse_ref.insert(lse_ref.end(), res.lse.begin(), res.lse.end());
    row += qo;
  }
  kvattn_test::ComputeTolerance tol;
  // Each earlier level's state, and the running merge in out, are rounded to the out dtype: a unit
  // roundoff of o_mag and half a subnormal spacing per extra level (tests/cascade_test.cpp).
  if (p.levels.size() > 1) {
    const auto ot = kvattn_test::output_tolerance(p.ot);
    tol.accumulation += double(p.levels.size() - 1) * ot.rtol / 2;
    tol.output_abs += double(p.levels.size() - 1) * ot.atol;
  }
  if (auto r = kvattn_test::outputs_match(p.out, o_ref, mag_ref, tol); !r) fail("out differs from the reference: ", r.message());
  if (p.want_lse) {
    if (auto r = kvattn_test::lse_match(p.lse, lse_ref, tol); !r) fail("lse differs from the reference: ", r.message());
  } else {
    for (uint8_t byte : p.lse.raw_bytes())
      if (byte != HostTensor::kPoisonByte) fail("lse was written although not requested");
  }
}

std::vector<Corruption> corruptions(Ctx& ctx, CascadeProblem& p, CascadeArgs& a) {
  std::vector<Corruption> out;
  Source& s = ctx.src;
  const size_t L = a.plan.levels.size();
  const size_t l = size_t(s.range(0, int64_t(L) - 1));
  const std::string lvl = "level " + std::to_string(l) + " ";
  kvattn::CascadeLevel& level = a.plan.levels[l];
  index_array_corruptions(ctx, out, lvl + "kv_indptr", level.page_table.indptr, true, lvl + "indptr");
  index_array_corruptions(ctx, out, lvl + "kv_last_page_len", level.page_table.last_page_len, true, lvl + "last");
  indptr_corruptions(ctx, out, lvl + "qo_indptr", level.qo_indptr, lvl + "qo");
  const std::vector<int32_t> qo = int32_values(level.qo_indptr), last = int32_values(level.page_table.last_page_len);
  const std::vector<int32_t> ind = int32_values(level.page_table.indptr), ids = int32_values(level.page_table.indices);
  if (L > 1)
    out.push_back({"a qo_indptr whose total differs from the other levels'", lvl + "qo", [&ctx, &level, qo] {
                     auto q2 = qo;
                     q2.back() += 1;
                     replace_int32(ctx, level.qo_indptr, q2);
                   }});
  if (!ids.empty())
    out.push_back({"a negative page id", lvl + "indices", [&ctx, &level, ids, &s] {
                     auto i2 = ids;
                     i2[size_t(s.range(0, int64_t(i2.size()) - 1))] = -int32_t(s.range(1, 5));
                     replace_int32(ctx, level.page_table.indices, i2);
                   }});
  for (size_t g = 0; g + 1 < ind.size(); ++g)
    if (ind[g + 1] > ind[g]) {
      out.push_back({"last_page_len 0 for a group with pages", lvl + "last", [&ctx, &level, last, g] {
                       auto l2 = last;
                       l2[g] = 0;
                       replace_int32(ctx, level.page_table.last_page_len, l2);
                     }});
      out.push_back({"last_page_len above the page size", lvl + "last", [&ctx, &level, last, g, &p] {
                       auto l2 = last;
                       l2[g] = p.page_size + 1;
                       replace_int32(ctx, level.page_table.last_page_len, l2);
                     }});
      break;
    }
  out.push_back({"no levels", "levels", [&a] { a.no_levels = true; }});
  out.push_back({"a variant a cascade does not take", "variant", [&a, &s] {
                   switch (s.range(0, 3)) {
                     case 0: a.plan.variant.window_left = 4; break;
                     case 1: a.plan.variant.alibi = true; break;
                     case 2: a.plan.variant.sigmoid = true; break;
                     default: a.plan.variant.rope = kvattn::RopeConfig{}; break;
                   }
                 }});
  // The last level's first group: fewer keys than rows (its rows are its last positions).
  {
    const kvattn::CascadeLevel& own = a.plan.levels.back();
    const auto own_ind = int32_values(own.page_table.indptr), own_qo = int32_values(own.qo_indptr);
    if (own_qo[1] - own_qo[0] > 1 && own_ind[1] - own_ind[0] == 1)
      out.push_back({"a last-level group with fewer keys than rows", "level " + std::to_string(L - 1) + " last",
                     [&ctx, &a, own_ind, own_qo] {
                       auto l2 = int32_values(a.plan.levels.back().page_table.last_page_len);
                       l2[0] = std::min<int32_t>(l2[0], own_qo[1] - own_qo[0] - 1);
                       if (l2[0] < 1) l2[0] = 1;
                       replace_int32(ctx, a.plan.levels.back().page_table.last_page_len, l2);
                     }});
  }
  // run()
  const int64_t rows = p.q.shape()[0];
  out.push_back({"q with another number of rows", "q", [&a, rows] { a.q = with_size(a.q, 0, rows + 1); }});
  out.push_back({"out of another dtype", "out", [&a, &p] {
                   a.out = with_dtype(a.out, p.ot == DType::f32 ? DType::f16 : DType::f32);
                 }});
  if (a.lse.defined())
    out.push_back({"lse with another number of rows", "lse", [&a, rows] { a.lse = with_size(a.lse, 0, rows - 1 > 0 ? rows - 1 : 2); }});
  if (a.workspace.defined() && int64_t(p.workspace.raw_bytes().size()) >= int64_t(p.out.raw_bytes().size()))
    out.push_back({"out inside the workspace", "out", [&a, &p] {
                     a.out = kvattn::TensorView(a.workspace.data(), p.ot, {p.q.shape()[0], p.hq, p.d});
                   }});
  return out;
}

void do_plan(const CascadeArgs& a, kvattn::CascadeAttention& c) {
  if (!a.no_levels) return c.plan(a.plan);
  kvattn::CascadePlan none = a.plan;
  none.levels.clear();
  c.plan(none);
}
void do_run(const CascadeArgs& a, const kvattn::CascadeAttention& c) { c.run(a.q, a.cache, a.out, a.lse); }

}  // namespace

void fuzz_cascade(Ctx& ctx) {
  auto owned = std::make_unique<CascadeProblem>();
  CascadeProblem& p = *owned;
  generate(ctx, p);
  for (const HostTensor* t : {&p.q, &p.k, &p.v, &p.kv, &p.out, &p.lse, &p.workspace}) ctx.track(*t);
  for (const Level& lv : p.levels)
    for (const HostTensor* t : {&lv.t_qo, &lv.t_indptr, &lv.t_indices, &lv.t_last}) ctx.track(*t);
  CascadeArgs legal = legal_args(p);
  kvattn::CascadeAttention cascade(legal.workspace, p.layout);
  if (!ctx.corrupt) {
    expect_success(ctx, "plan()", [&] { do_plan(legal, cascade); });
    expect_success(ctx, "run()", [&] { do_run(legal, cascade); });
    check_result(p);
    return;
  }
  const bool prior = ctx.src.coin();
  if (prior) {
    expect_success(ctx, "plan() before the corrupted call", [&] { do_plan(legal, cascade); });
    ctx.note("planned legally first");
  }
  CascadeArgs bad = legal;
  std::vector<Corruption> options = corruptions(ctx, p, bad);
  bool reached_run = false;
  expect_rejection(ctx, [&] {
    ctx.apply_corruptions(options);
    do_plan(bad, cascade);
    reached_run = true;
    do_run(bad, cascade);
  });
  if (prior && !reached_run) {  // plan() threw: the earlier plan must still be the object's
    expect_success(ctx, "run() on the earlier plan after a rejected plan()", [&] { do_run(legal, cascade); });
    check_result(p);
    ctx.note("earlier plan still runs correctly");
  }
}

}  // namespace kvattn_fuzz
