// CascadeAttention against the float64 reference of attention over each request's concatenated
// page lists (the flat problem the cascade replaces): two and three levels, shared prefixes ending
// in partial pages, groups with more query rows than keys and groups without pages, prefill rows
// with the causal mask on the last level, GQA, fp8 K/V with scales, soft-cap, page sizes 1 and 16,
// both layouts, re-plans on one object; the same cases on the GPU (skipped without one); and the
// errors plan() and run() give. Tolerance: each earlier level's state is rounded to o_dtype before
// the f32 merge, and so is the running result in out after each merge; each extra level moves an
// output by at most u(o_dtype) * o_mag (the merged o is a convex combination of the levels' o, each
// bounded by its share of o_mag) plus half a subnormal spacing of o_dtype (compare.h's atol), on top
// of compare.h's allowances.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "core/shared_prefix.h"
#include "kvattn/cascade.h"
#include "reference/reference.h"
#include "support/compare.h"
#include "support/expect_error.h"
#include "support/gpu_skip.h"
#include "support/host_tensor.h"
#include "support/paged_kv.h"
#include "support/random.h"

namespace kvattn_test {
namespace {

using kvattn::DType;
using kvattn::KVLayout;

// Levels of groups of consecutive requests: (requests in the group, the group's KV tokens). The
// last level's groups are single requests (their own KV, which ends with their query rows).
using LevelSpec = std::vector<std::pair<int, int64_t>>;

struct CascadeCase {
  std::vector<int64_t> qo_lens;
  std::vector<LevelSpec> levels;
  int num_qo_heads = 4, num_kv_heads = 2, head_dim = 32;
  DType q_dtype = DType::bf16, kv_dtype = DType::bf16, o_dtype = DType::bf16;
  kvattn::Variant variant{};
  KVLayout layout = KVLayout::NHD;
  int page_size = 16;
  bool want_lse = true;
  bool on_gpu = false, device_ids = false;
};

// The case's inputs: one page pool that every level's page lists index (shuffled), q, and the
// decoded values the reference reads.
struct CascadeInputs {
  HostTensor k, v, q;
  std::vector<HostTensor> qo_indptr, indptr, indices, last_page_len;
  std::vector<std::vector<double>> keys, values;  // per request: [kv_total][Hkv][D], levels in order
  std::vector<double> qd;
  int64_t rows = 0;
};

int64_t pages_for(int64_t tokens, int page_size) { return (tokens + page_size - 1) / page_size; }

CascadeInputs make_inputs(const CascadeCase& c, Rng& rng) {
  const int P = c.page_size, H = c.num_kv_heads, D = c.head_dim;
  const int B = int(c.qo_lens.size());
  int64_t num_pages = 2;  // two unused pages
  for (const auto& level : c.levels)
    for (const auto& [n, kv] : level) num_pages += pages_for(kv, P);
  std::vector<int32_t> pool(static_cast<size_t>(num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  rng.shuffle(pool);
  CascadeInputs in;
  const std::vector<int64_t> shape = c.layout == KVLayout::NHD ? std::vector<int64_t>{num_pages, P, H, D}
                                                               : std::vector<int64_t>{num_pages, H, P, D};
  in.k = HostTensor(c.kv_dtype, shape);
  in.v = HostTensor(c.kv_dtype, shape);
  in.k.poison();  // slots no page list covers are NaN: reading one shows
  in.v.poison();
  in.keys.resize(size_t(B));
  in.values.resize(size_t(B));
  size_t next_page = 0;
  for (size_t l = 0; l < c.levels.size(); ++l) {
    std::vector<int32_t> qo{0}, ind{0}, idx, last;
    int request = 0;
    for (const auto& [n, kv] : c.levels[l]) {
      int64_t rows = 0;
      for (int r = request; r < request + n; ++r) rows += c.qo_lens[size_t(r)];
      qo.push_back(qo.back() + int32_t(rows));
      const int64_t np = pages_for(kv, P);
      for (int64_t p = 0; p < np; ++p) idx.push_back(pool[next_page++]);
      ind.push_back(int32_t(idx.size()));
      last.push_back(kv == 0 ? 0 : int32_t(kv - (np - 1) * P));
      for (int64_t t = 0; t < kv; ++t) {
        const int64_t page = idx[size_t(ind[ind.size() - 2] + t / P)], slot = t % P;
        for (int h = 0; h < H; ++h)
          for (int e = 0; e < D; ++e) {
            auto at = [&](HostTensor& x) {
              return c.layout == KVLayout::NHD ? x.offset({page, slot, h, e}) : x.offset({page, h, slot, e});
            };
            in.k.set_at(at(in.k), std::clamp(rng.normal(), -3.0, 3.0));
            in.v.set_at(at(in.v), rng.uniform(-1, 1));
            const double kd = in.k.get_at(at(in.k)), vd = in.v.get_at(at(in.v));
            for (int r = request; r < request + n; ++r) {
              in.keys[size_t(r)].push_back(kd);
              in.values[size_t(r)].push_back(vd);
            }
          }
      }
      request += n;
    }
    EXPECT_EQ(request, B) << "level " << l << " covers every request";
    in.rows = qo.back();
    in.qo_indptr.push_back(int32_tensor(qo));
    in.indptr.push_back(int32_tensor(ind));
    in.indices.push_back(int32_tensor(idx));
    in.last_page_len.push_back(int32_tensor(last));
  }
  // keys[r] was filled token by token with (h, e) innermost: [kv_total][H][D] as the reference reads.
  in.q = HostTensor(c.q_dtype, {in.rows, c.num_qo_heads, D});
  for (int64_t i = 0; i < in.q.numel(); ++i) {
    in.q.set_at(i, std::clamp(rng.normal(), -3.0, 3.0));
    in.qd.push_back(in.q.get_at(i));
  }
  return in;
}

kvattn::AttentionShape shape_of(const CascadeCase& c) {
  kvattn::AttentionShape s;
  s.num_qo_heads = c.num_qo_heads;
  s.num_kv_heads = c.num_kv_heads;
  s.head_dim_qk = c.head_dim;
  s.q_dtype = c.q_dtype;
  s.kv_dtype = c.kv_dtype;
  s.o_dtype = c.o_dtype;
  s.variant = c.variant;
  return s;
}

kvattn::CascadePlan make_plan(const CascadeCase& c, const CascadeInputs& in,
                              const std::vector<kvattn::TensorView>& indices) {
  kvattn::CascadePlan p;
  static_cast<kvattn::AttentionShape&>(p) = shape_of(c);
  p.page_size = c.page_size;
  for (size_t l = 0; l < c.levels.size(); ++l)
    p.levels.push_back({in.qo_indptr[l].view(), {in.indptr[l].view(), indices[l], in.last_page_len[l].view()}});
  return p;
}

struct Expected {
  std::vector<double> o, mag, lse;
};

Expected reference_of(const CascadeCase& c, const CascadeInputs& in) {
  Expected want;
  int64_t row = 0;
  for (size_t r = 0; r < c.qo_lens.size(); ++r) {
    ref::Request req;
    req.qo_len = c.qo_lens[r];
    req.kv_len = int64_t(in.keys[r].size()) / (c.num_kv_heads * c.head_dim);
    req.num_qo_heads = c.num_qo_heads;
    req.num_kv_heads = c.num_kv_heads;
    req.head_dim_qk = req.head_dim_vo = c.head_dim;
    req.q = in.qd.data() + row * c.num_qo_heads * c.head_dim;
    req.k = in.keys[r].data();
    req.v = in.values[r].data();
    req.q_pos0 = req.kv_len - req.qo_len;
    const ref::Result res = ref::attention(req, c.variant);
    want.o.insert(want.o.end(), res.o.begin(), res.o.end());
    want.mag.insert(want.mag.end(), res.o_mag.begin(), res.o_mag.end());
    want.lse.insert(want.lse.end(), res.lse.begin(), res.lse.end());
    row += req.qo_len;
  }
  return want;
}

ComputeTolerance tolerance_of(const CascadeCase& c) {
  ComputeTolerance ct;
  if (c.levels.size() > 1) {  // u(o_dtype) and half its subnormal spacing per extra level, see above
    ct.accumulation += double(c.levels.size() - 1) * output_tolerance(c.o_dtype).rtol / 2;
    ct.output_abs += double(c.levels.size() - 1) * output_tolerance(c.o_dtype).atol;
  }
  if (c.on_gpu && kvattn::is_fp8(c.kv_dtype)) ct.accumulation += std::ldexp(1.0, -8);  // fp8 P.V on the MMA path
  if (c.on_gpu) ct = allow_approx_tanh(ct, c.variant);
  return ct;
}

void run_case(const CascadeCase& c, Rng& rng, kvattn::CascadeAttention* reuse = nullptr) {
  SCOPED_TRACE(testing::Message() << c.qo_lens.size() << " requests, " << c.levels.size() << " levels, "
                                  << kvattn::dtype_name(c.q_dtype) << "/" << kvattn::dtype_name(c.kv_dtype)
                                  << ", page " << c.page_size << (c.on_gpu ? ", GPU" : ", CPU"));
  const CascadeInputs in = make_inputs(c, rng);
  const Expected want = reference_of(c, in);
  HostTensor out(c.o_dtype, {in.rows, c.num_qo_heads, c.head_dim});
  HostTensor lse(DType::f32, {in.rows, c.num_qo_heads});
  out.poison();
  lse.poison();
  std::vector<kvattn::TensorView> indices;
  for (const auto& t : in.indices) indices.push_back(t.view());
  if (!c.on_gpu) {
    std::unique_ptr<kvattn::CascadeAttention> own;
    kvattn::CascadeAttention& cascade = reuse ? *reuse : *(own = std::make_unique<kvattn::CascadeAttention>(
                                                               kvattn::TensorView{}, c.layout));
    cascade.plan(make_plan(c, in, indices));
    ASSERT_EQ(cascade.num_levels(), int(c.levels.size()));
    cascade.run(in.q.view(), kvattn::PagedKVCache::split(in.k.view(), in.v.view(), c.layout), out.view(),
                c.want_lse ? lse.view() : kvattn::TensorView{});
  } else {
#if KVATTN_WITH_CUDA
    DeviceMirror dq(in.q), dk(in.k), dv(in.v), dout(out), dlse(lse);
    std::vector<std::unique_ptr<DeviceMirror>> dind;
    if (c.device_ids) {
      indices.clear();
      for (const auto& t : in.indices) {
        dind.push_back(std::make_unique<DeviceMirror>(t));
        indices.push_back(dind.back()->view());
      }
    }
    DeviceBytes workspace(int64_t(64) << 20);
    kvattn::CascadeAttention cascade(workspace.view(), c.layout);
    cascade.plan(make_plan(c, in, indices));
    cascade.run(dq.view(), kvattn::PagedKVCache::split(dk.view(), dv.view(), c.layout), dout.view(),
                c.want_lse ? dlse.view() : kvattn::TensorView{});
    cascade.check_errors();
    dout.copy_back(out);
    dlse.copy_back(lse);
#endif
  }
  const ComputeTolerance ct = tolerance_of(c);
  EXPECT_TRUE(outputs_match(out, want.o, want.mag, ct));
  if (c.want_lse) EXPECT_TRUE(lse_match(lse, want.lse, ct));
}

// B decode requests sharing one prefix of `prefix` tokens, each with `own` tokens of its own.
CascadeCase shared_prefix(int B, int64_t prefix, int64_t own_lo, int64_t own_hi, Rng& rng) {
  CascadeCase c;
  c.qo_lens.assign(size_t(B), 1);
  c.levels = {{{B, prefix}}, {}};
  for (int b = 0; b < B; ++b) c.levels[1].push_back({1, rng.integer(own_lo, own_hi)});
  return c;
}

// System prompt (all), few-shot blocks (groups of requests), own tokens: three levels.
CascadeCase three_levels(const std::vector<int>& groups, Rng& rng, int64_t qo_hi = 1) {
  CascadeCase c;
  const int B = std::accumulate(groups.begin(), groups.end(), 0);
  c.levels.resize(3);
  c.levels[0] = {{B, rng.integer(20, 70)}};
  for (int n : groups) c.levels[1].push_back({n, rng.integer(5, 40)});
  for (int b = 0; b < B; ++b) {
    c.qo_lens.push_back(rng.integer(1, qo_hi));
    c.levels[2].push_back({1, c.qo_lens.back() + rng.integer(0, 30)});
  }
  return c;
}

TEST(Cascade, TwoLevelsSharedPrefix) {
  for (int page : {1, 16})
    for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
      KVATTN_CASE_RNG(rng);
      // The prefix ends in a partial page (37 tokens); own lengths cover partial and full pages.
      CascadeCase c = shared_prefix(6, 37, 1, 40, rng);
      c.page_size = page;
      c.layout = layout;
      run_case(c, rng);
    }
}

TEST(Cascade, ThreeLevels) {
  KVATTN_CASE_RNG(rng);
  CascadeCase c = three_levels({2, 3, 1}, rng);
  c.num_qo_heads = 8;
  run_case(c, rng);
}

TEST(Cascade, PrefillRowsCausalOnTheLastLevel) {
  for (bool causal : {false, true}) {
    KVATTN_CASE_RNG(rng);
    CascadeCase c = three_levels({3, 2}, rng, /*qo_hi=*/9);
    c.variant.causal = causal;
    c.q_dtype = c.o_dtype = c.kv_dtype = DType::f16;
    run_case(c, rng);
  }
}

TEST(Cascade, GroupsWithMoreRowsThanKeysAndWithoutPages) {
  KVATTN_CASE_RNG(rng);
  CascadeCase c;
  c.qo_lens = {1, 1, 1, 1, 1, 1, 1, 1, 3, 2};
  // Level 0: eight decode rows over 3 shared tokens (rows > keys: cut into chunks), then a group
  // without pages; level 1: a group of 4 rows over 2 tokens, one empty, one over 20 tokens.
  c.levels = {{{8, 3}, {2, 0}}, {{4, 2}, {2, 0}, {4, 20}}, {}};
  for (int64_t q : c.qo_lens) c.levels[2].push_back({1, q + rng.integer(0, 12)});
  c.variant.causal = true;
  c.page_size = 4;
  run_case(c, rng);
}

TEST(Cascade, DtypesGqaSoftCapAndScales) {
  struct Shape {
    DType q, kv, o;
    int hq, hkv, d;
  };
  for (const Shape s : {Shape{DType::bf16, DType::e4m3, DType::bf16, 32, 8, 128},
                        Shape{DType::f16, DType::e5m2, DType::f32, 8, 1, 64},
                        Shape{DType::f32, DType::f32, DType::f32, 4, 4, 16}}) {
    KVATTN_CASE_RNG(rng);
    CascadeCase c = shared_prefix(5, 50, 1, 24, rng);
    c.q_dtype = s.q, c.kv_dtype = s.kv, c.o_dtype = s.o;
    c.num_qo_heads = s.hq, c.num_kv_heads = s.hkv, c.head_dim = s.d;
    c.variant = kvattn::Variant{}.with_soft_cap(8.0f).with_sm_scale(0.07f);
    if (kvattn::is_fp8(s.kv)) c.variant = c.variant.with_scales(1.0f, 0.5f, 2.0f);
    c.want_lse = s.o != DType::f32;  // the cascade keeps its own lse when none is asked for
    run_case(c, rng);
  }
}

TEST(Cascade, OneLevelIsBatchPrefill) {
  KVATTN_CASE_RNG(rng);
  CascadeCase c;
  c.qo_lens = {3, 1, 5};
  c.levels = {{{1, 10}, {1, 1}, {1, 33}}};
  c.variant.causal = true;
  run_case(c, rng);
}

TEST(Cascade, ReplansOnOneObject) {
  kvattn::CascadeAttention cascade;
  for (int round = 0; round < 3; ++round) {
    KVATTN_CASE_RNG(rng);
    CascadeCase c = round == 1 ? three_levels({1, 4}, rng) : shared_prefix(int(rng.integer(1, 7)), 30, 1, 20, rng);
    run_case(c, rng, &cascade);
  }
}

// ---- errors -------------------------------------------------------------------------------------
struct ErrorFixture {
  Rng rng = case_rng();
  CascadeCase c;
  CascadeInputs in;
  std::vector<kvattn::TensorView> indices;
  ErrorFixture() {
    c = three_levels({2, 2}, rng);
    in = make_inputs(c, rng);
    for (const auto& t : in.indices) indices.push_back(t.view());
  }
  kvattn::CascadePlan plan() const { return make_plan(c, in, indices); }
};

TEST(Cascade, PlanErrorsNameTheLevelAndArgument) {
  ErrorFixture f;
  kvattn::CascadeAttention cascade;
  kvattn::CascadePlan p = f.plan();
  p.levels.clear();
  EXPECT_KVATTN_ERROR(cascade.plan(p), "CascadePlan.levels is empty");
  p = f.plan();
  const HostTensor short_qo = int32_tensor({0, 1, 3});  // level 1 covers 3 rows, not 4
  p.levels[1].qo_indptr = short_qo.view();
  EXPECT_KVATTN_ERROR(cascade.plan(p), "level 1: qo_indptr[2] = 3 but level 0 covers 4 query rows");
  p = f.plan();
  const HostTensor three = int32_tensor({0, 4});
  p.levels[1].qo_indptr = three.view();
  EXPECT_KVATTN_ERROR(cascade.plan(p), "level 1: qo_indptr has");
  for (const kvattn::Variant& v :
       {kvattn::Variant{}.with_window(8), kvattn::Variant{}.with_alibi(), kvattn::Variant{}.with_sigmoid(),
        kvattn::Variant{}.with_custom_mask()}) {
    p = f.plan();
    p.variant = v;
    EXPECT_KVATTN_ERROR(cascade.plan(p), "CascadeAttention does not support");
  }
  p = f.plan();
  p.page_size = 0;
  EXPECT_KVATTN_ERROR(cascade.plan(p), "level 0: page_size = 0 must be >= 1");
  // The last level keeps BatchPrefill's rule: a request's rows are its last positions.
  CascadeCase bad = f.c;
  bad.qo_lens[0] = 5;
  bad.levels[2][0].second = 2;
  const CascadeInputs bad_in = make_inputs(bad, f.rng);
  std::vector<kvattn::TensorView> bad_ids;
  for (const auto& t : bad_in.indices) bad_ids.push_back(t.view());
  EXPECT_KVATTN_ERROR(cascade.plan(make_plan(bad, bad_in, bad_ids)), "level 2: request 0 has qo_len = 5 > kv_len = 2");
  EXPECT_EQ(cascade.num_levels(), 0) << "no failed plan() leaves a plan behind";
  EXPECT_EQ(cascade.schedule(0), nullptr);
  // A rejected plan() keeps the previous plan (the API fuzzer found a re-plan whose last level
  // failed in its own wrapper dropping it, after the earlier levels had been re-planned).
  cascade.plan(f.plan());
  HostTensor out(DType::bf16, {f.in.rows, f.c.num_qo_heads, f.c.head_dim}), again = out;
  const auto kv = kvattn::PagedKVCache::split(f.in.k.view(), f.in.v.view(), KVLayout::NHD);
  cascade.run(f.in.q.view(), kv, out.view());
  EXPECT_KVATTN_ERROR(cascade.plan(make_plan(bad, bad_in, bad_ids)), "level 2: request 0 has qo_len = 5 > kv_len = 2");
  std::vector<int32_t> negative = as_int32(f.in.indices.back());
  negative.back() = -4;
  const HostTensor neg = int32_tensor(negative);
  kvattn::CascadePlan neg_plan = f.plan();
  neg_plan.levels.back().page_table.indices = neg.view();
  EXPECT_KVATTN_ERROR(cascade.plan(neg_plan), "level 2: kv_indices[");
  EXPECT_KVATTN_ERROR(cascade.plan(neg_plan), "is negative");
  ASSERT_EQ(cascade.num_levels(), 3);
  cascade.run(f.in.q.view(), kv, again.view());
  EXPECT_TRUE(again.same_bytes(out.snapshot())) << "the previous plan runs as before";
}

TEST(Cascade, RunErrorsWriteNothing) {
  ErrorFixture f;
  kvattn::CascadeAttention cascade;
  HostTensor out(DType::bf16, {f.in.rows, f.c.num_qo_heads, f.c.head_dim});
  const auto kv = kvattn::PagedKVCache::split(f.in.k.view(), f.in.v.view(), KVLayout::NHD);
  EXPECT_KVATTN_ERROR(cascade.run(f.in.q.view(), kv, out.view()), "CascadeAttention.run() was called before plan()");
  cascade.plan(f.plan());
  out.poison();
  const auto before = out.snapshot();
  // A cache with fewer pages than level 0 refers to: nothing may be written (not even the last
  // level's output, which runs first).
  const int64_t pages = f.in.k.shape()[0];
  HostTensor small_k(DType::bf16, {1, f.c.page_size, f.c.num_kv_heads, f.c.head_dim}),
      small_v(DType::bf16, {1, f.c.page_size, f.c.num_kv_heads, f.c.head_dim});
  ASSERT_GT(pages, 1);
  EXPECT_KVATTN_ERROR(cascade.run(f.in.q.view(), kvattn::PagedKVCache::split(small_k.view(), small_v.view(),
                                                                             KVLayout::NHD),
                                  out.view()),
                      "out of range [0, 1)");
  EXPECT_TRUE(out.same_bytes(before));
  HostTensor wrong(DType::f16, {f.in.rows, f.c.num_qo_heads, f.c.head_dim});
  EXPECT_KVATTN_ERROR(cascade.run(f.in.q.view(), kv, wrong.view()), "out has dtype f16");
  EXPECT_KVATTN_ERROR(cascade.schedule(3), "level = 3 is out of range [0, 3)");
  EXPECT_NE(cascade.schedule(2), nullptr);
  EXPECT_NO_THROW(cascade.check_errors());
  // A host workspace follows the flat wrappers' aliasing rule: out and lse share no byte with it
  // (the API fuzzer found BatchDecode's automatic cascade accepting an out inside its workspace).
  const int64_t out_bytes = int64_t(out.raw_bytes().size());
  HostTensor ws(DType::u8, {out_bytes + 4096});
  kvattn::CascadeAttention with_ws(ws.view());
  with_ws.plan(f.plan());
  const kvattn::TensorView inside(ws.raw_bytes().data() + 64, DType::bf16, {f.in.rows, f.c.num_qo_heads, f.c.head_dim});
  EXPECT_KVATTN_ERROR(with_ws.run(f.in.q.view(), kv, inside), "out (");
  EXPECT_KVATTN_ERROR(with_ws.run(f.in.q.view(), kv, inside), "overlaps the workspace");
  EXPECT_NO_THROW(with_ws.run(f.in.q.view(), kv, out.view()));
}

// ---- automatic shared prefixes in BatchDecode ---------------------------------------------------
// The flat page table of a cascade case (each request: its level-0 group's pages, then its own):
// what a radix-tree server hands BatchDecode. Level 0's kv lengths must be whole pages.
struct FlatTable {
  HostTensor indptr, indices, last_page_len;
};
FlatTable flat_table(const CascadeCase& c, const CascadeInputs& in) {
  std::vector<int32_t> ind{0}, idx, last;
  const size_t L = c.levels.size();
  std::vector<std::vector<int32_t>> lind, lidx;
  for (size_t l = 0; l < L; ++l) lind.push_back(as_int32(in.indptr[l])), lidx.push_back(as_int32(in.indices[l]));
  const auto own_last = as_int32(in.last_page_len[L - 1]);
  for (size_t r = 0; r < c.qo_lens.size(); ++r) {
    for (size_t l = 0; l < L; ++l) {
      size_t g = 0;  // request r's group in level l
      for (int seen = 0; seen + c.levels[l][g].first <= int(r); ++g) seen += c.levels[l][g].first;
      idx.insert(idx.end(), lidx[l].begin() + lind[l][g], lidx[l].begin() + lind[l][g + 1]);
    }
    ind.push_back(int32_t(idx.size()));
    last.push_back(own_last[r]);
  }
  return {int32_tensor(ind), int32_tensor(idx), int32_tensor(last)};
}

// Decode rows of requests in runs sharing `prefix` tokens (0: a run of requests sharing nothing).
CascadeCase decode_runs(const std::vector<std::pair<int, int64_t>>& runs, Rng& rng, int page_size = 16) {
  CascadeCase c;
  c.page_size = page_size;
  c.levels.resize(2);
  for (const auto& [n, prefix] : runs) {
    c.levels[0].push_back({n, prefix});
    for (int m = 0; m < n; ++m) {
      c.qo_lens.push_back(1);
      c.levels[1].push_back({1, rng.integer(1, 3 * page_size)});
    }
  }
  return c;
}

void run_decode_with_shared_prefixes(const CascadeCase& c, Rng& rng, kvattn::SharedPrefix mode,
                                     std::string_view want_family, int want_groups = -1, int want_levels = 2) {
  const CascadeInputs in = make_inputs(c, rng);
  const FlatTable flat = flat_table(c, in);
  const Expected want = reference_of(c, in);
  kvattn::BatchDecodePlan p;
  static_cast<kvattn::AttentionShape&>(p) = shape_of(c);
  p.page_size = c.page_size;
  p.shared_prefix = mode;
  HostTensor out(c.o_dtype, {in.rows, c.num_qo_heads, c.head_dim}), lse(DType::f32, {in.rows, c.num_qo_heads});
  out.poison();
  lse.poison();
  std::string family;
  int groups = -1;
  auto inspect = [&](const kvattn::BatchDecode& d) {
    family = std::string(d.kernel_family());
    if (const kvattn::CascadeAttention* cascade = d.cascade()) {
      EXPECT_EQ(cascade->num_levels(), want_levels);
      EXPECT_EQ(d.schedule(), cascade->schedule(cascade->num_levels() - 1)) << "schedule() is the own-KV level's";
      groups = int(cascade->schedule(0)->batch_size());
    }
  };
  if (!c.on_gpu) {
    kvattn::BatchDecode decode;
    p.page_table = {flat.indptr.view(), flat.indices.view(), flat.last_page_len.view()};
    decode.plan(p);
    inspect(decode);
    decode.run(in.q.view(), kvattn::PagedKVCache::split(in.k.view(), in.v.view(), c.layout), out.view(), lse.view());
  } else {
#if KVATTN_WITH_CUDA
    DeviceMirror dq(in.q), dk(in.k), dv(in.v), dout(out), dlse(lse);
    DeviceBytes workspace(int64_t(64) << 20);
    kvattn::BatchDecode decode(workspace.view(), c.layout);
    p.page_table = {flat.indptr.view(), flat.indices.view(), flat.last_page_len.view()};
    decode.plan(p);
    inspect(decode);
    decode.run(dq.view(), kvattn::PagedKVCache::split(dk.view(), dv.view(), c.layout), dout.view(), dlse.view());
    decode.check_errors();
    dout.copy_back(out);
    dlse.copy_back(lse);
#endif
  }
  if (!want_family.empty()) EXPECT_EQ(family, want_family);
  if (want_groups >= 0) EXPECT_EQ(groups, want_groups) << "level-0 groups (chunks of runs included)";
  const ComputeTolerance ct = tolerance_of(c);
  EXPECT_TRUE(outputs_match(out, want.o, want.mag, ct));
  EXPECT_TRUE(lse_match(lse, want.lse, ct));
}

TEST(SharedPrefix, FindsRunsOfConsecutiveRequests) {
  using kvattn::detail::find_shared_prefixes;
  // Requests 0-2 share pages 7, 8, 9 (request 2 only 7, 8), request 3 shares nothing, 4-5 share
  // 20, 21 but 5 owns nothing else (only pages - 1 may be shared), 6 repeats request 0's first
  // page but is not next to it.
  const std::vector<int32_t> indptr{0, 4, 8, 11, 13, 16, 18, 21};
  const std::vector<int32_t> indices{7, 8, 9, 1, 7, 8, 9, 2, 7, 8, 3, 4, 5, 20, 21, 6, 20, 21, 7, 8, 9};
  auto groups = find_shared_prefixes(indptr, indices, 1);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].first, 0);
  EXPECT_EQ(groups[0].count, 3);
  EXPECT_EQ(groups[0].shared_pages, 2);
  EXPECT_EQ(groups[1].first, 4);
  EXPECT_EQ(groups[1].count, 2);
  EXPECT_EQ(groups[1].shared_pages, 1);
  // A threshold of 3 pages: request 2 leaves the first run (0-1 share 3), the second run is too short.
  groups = find_shared_prefixes(indptr, indices, 3);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].count, 2);
  EXPECT_EQ(groups[0].shared_pages, 3);
  EXPECT_TRUE(find_shared_prefixes(std::vector<int32_t>{0}, std::vector<int32_t>{}, 1).empty());
}

TEST(SharedPrefix, FindsNestedRuns) {
  // Requests 0-3 share pages 1, 2; past them 0-1 share 3 and 2-3 share 5; request 4 shares nothing.
  const std::vector<int32_t> indptr{0, 4, 8, 12, 16, 18};
  const std::vector<int32_t> indices{1, 2, 3, 10, 1, 2, 3, 11, 1, 2, 5, 12, 1, 2, 5, 13, 7, 8};
  const auto levels = kvattn::detail::find_shared_prefix_levels(indptr, indices, 1);
  ASSERT_EQ(levels.size(), 2u);
  ASSERT_EQ(levels[0].size(), 1u);
  EXPECT_EQ(levels[0][0].count, 4);
  EXPECT_EQ(levels[0][0].shared_pages, 2);
  ASSERT_EQ(levels[1].size(), 2u);
  EXPECT_EQ(levels[1][0].first, 0);
  EXPECT_EQ(levels[1][1].first, 2);
  EXPECT_EQ(levels[1][1].count, 2);
  EXPECT_EQ(levels[1][1].skip_pages, 2);
  EXPECT_EQ(levels[1][1].shared_pages, 1);
  EXPECT_EQ(kvattn::detail::find_shared_prefix_levels(indptr, indices, 2).size(), 1u) << "level 1 shares 1 page";
}

TEST(SharedPrefix, CostModelChoosesAsMeasured) {
  // kvattn bench cascade on the H200 (docs/PERFORMANCE.md): 32 x (1024 + 77) ran faster flat, the
  // long prefixes several times faster as a cascade.
  struct Row {
    int batch;
    int64_t prefix, own;
    bool cascade;
  };
  for (const Row r : {Row{32, 1024, 77, false}, Row{64, 4096, 512, true}, Row{128, 32768, 256, true},
                      Row{256, 2048, 128, true}, Row{4, 256, 512, false}}) {
    const std::vector<int64_t> kv(size_t(r.batch), r.prefix + r.own);
    const std::vector<std::vector<kvattn::detail::SharedPrefixGroup>> levels{{{0, r.batch, int32_t(r.prefix / 16)}}};
    const auto cost = kvattn::detail::cascade_cost({.kv_len = kv}, levels);
    EXPECT_EQ(cost.cascade_wins(), r.cascade) << r.batch << " x (" << r.prefix << " + " << r.own << "): flat "
                                              << cost.flat_us << " us, cascade " << cost.cascade_us << " us";
    EXPECT_EQ(cost.cascade_tokens, cost.flat_tokens - (r.batch - 1) * r.prefix);
  }
}

TEST(SharedPrefix, BatchDecodeRunsTheCascadeAndMatchesFlat) {
  {  // forced: two runs and a stretch of unshared requests between them
    KVATTN_CASE_RNG(rng);
    CascadeCase c = decode_runs({{3, 160}, {2, 0}, {4, 304}}, rng);
    c.num_qo_heads = 8;
    run_decode_with_shared_prefixes(c, rng, kvattn::SharedPrefix::always, "cascade", 3);
  }
  {  // never: flat, same answer
    KVATTN_CASE_RNG(rng);
    CascadeCase c = decode_runs({{3, 160}, {2, 0}}, rng);
    run_decode_with_shared_prefixes(c, rng, kvattn::SharedPrefix::never, "cpu");
  }
  {  // automatic: a small prefix stays flat, a long one under many requests becomes a cascade
    KVATTN_CASE_RNG(rng);
    CascadeCase c = decode_runs({{3, 160}}, rng);
    run_decode_with_shared_prefixes(c, rng, kvattn::SharedPrefix::automatic, "cpu");
    CascadeCase big = decode_runs({{32, 2048}}, rng);
    big.num_qo_heads = big.num_kv_heads = 8, big.head_dim = 64;  // f32: 4 KB of K/V per token
    big.q_dtype = big.kv_dtype = big.o_dtype = DType::f32;
    run_decode_with_shared_prefixes(big, rng, kvattn::SharedPrefix::automatic, "cascade", 1);
  }
  {  // nested: a system prompt for all, few-shot blocks for some (one request without), own pages
    KVATTN_CASE_RNG(rng);
    CascadeCase c;
    c.levels = {{{6, 160}}, {{2, 128}, {1, 0}, {3, 144}}, {}};
    for (int r = 0; r < 6; ++r) {
      c.qo_lens.push_back(1);
      c.levels[2].push_back({1, rng.integer(1, 40)});
    }
    run_decode_with_shared_prefixes(c, rng, kvattn::SharedPrefix::always, "cascade", 1, 3);
  }
  {  // a sliding window reads positions: always flat
    KVATTN_CASE_RNG(rng);
    CascadeCase c = decode_runs({{3, 160}}, rng);
    c.variant = kvattn::Variant{}.with_window(50);
    run_decode_with_shared_prefixes(c, rng, kvattn::SharedPrefix::always, "cpu");
  }
  {  // page 1, fp8 K/V with scales, soft-cap
    KVATTN_CASE_RNG(rng);
    CascadeCase c = decode_runs({{5, 200}, {1, 0}, {2, 130}}, rng, 1);
    c.kv_dtype = DType::e4m3;
    c.variant = kvattn::Variant{}.with_soft_cap(20.0f).with_scales(1.0f, 0.5f, 2.0f);
    run_decode_with_shared_prefixes(c, rng, kvattn::SharedPrefix::always, "cascade", 3);
  }
}

// ---- the same on the GPU ------------------------------------------------------------------------
TEST(GpuCascade, MatchesTheReference) {
  SKIP_WITHOUT_GPU();
  for (int variant = 0; variant < 4; ++variant) {
    KVATTN_CASE_RNG(rng);
    CascadeCase c = variant % 2 ? three_levels({2, 3, 1}, rng, variant == 3 ? 6 : 1)
                                : shared_prefix(7, 300, 1, 90, rng);
    c.on_gpu = true;
    c.num_qo_heads = 32, c.num_kv_heads = 8, c.head_dim = 128;
    c.device_ids = variant == 2;
    c.variant.causal = variant == 3;
    c.layout = variant == 1 ? KVLayout::HND : KVLayout::NHD;
    if (variant == 2) c.kv_dtype = DType::e4m3, c.variant = c.variant.with_scales(1.0f, 0.5f, 2.0f);
    if (variant == 1) c.variant = c.variant.with_soft_cap(30.0f);
    run_case(c, rng);
  }
}

TEST(GpuSharedPrefix, BatchDecodeRunsTheCascadeAndMatchesFlat) {
  SKIP_WITHOUT_GPU();
  for (kvattn::SharedPrefix mode : {kvattn::SharedPrefix::always, kvattn::SharedPrefix::automatic}) {
    KVATTN_CASE_RNG(rng);
    CascadeCase c = decode_runs({{40, 4096}, {3, 0}, {6, 512}}, rng);
    c.on_gpu = true;
    c.num_qo_heads = 32, c.num_kv_heads = 8, c.head_dim = 128;
    run_decode_with_shared_prefixes(c, rng, mode, mode == kvattn::SharedPrefix::always ? "cascade" : "");
  }
}

TEST(GpuCascade, ChunkedAndEmptyGroupsAndReplans) {
  SKIP_WITHOUT_GPU();
  KVATTN_CASE_RNG(rng);
  CascadeCase c;
  c.on_gpu = true;
  c.qo_lens = {1, 1, 1, 1, 1, 1, 1, 1, 3, 2};
  c.levels = {{{8, 3}, {2, 0}}, {{4, 2}, {2, 0}, {4, 20}}, {}};
  for (int64_t q : c.qo_lens) c.levels[2].push_back({1, q + rng.integer(0, 12)});
  c.variant.causal = true;
  c.page_size = 1;
  run_case(c, rng);
  c.want_lse = false;
  c.page_size = 16;
  run_case(c, rng);
}

}  // namespace
}  // namespace kvattn_test
