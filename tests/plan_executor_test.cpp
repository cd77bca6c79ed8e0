// The CPU backend executing planner schedules (src/cpu/plan_executor.cpp through the wrappers'
// run()): split-KV plans against unsplit plans and a float64 reference written here (a plain
// double softmax), for paged decode, ragged prefill/append and block-sparse attention, with causal,
// sliding-window, soft-cap and sigmoid variants; and bitwise determinism across repeated runs and
// re-plans. All tensors are f32, so the only differences are f32 rounding. Seeds are fixed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kvattn/kvattn.h"
#include "support/host_tensor.h"
#include "support/paged_kv.h"
#include "support/random.h"

namespace {

using kvattn::DType;
using kvattn_test::HostTensor;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The three schedules every case runs: no split, a small fixed split (many chunks, chunk
// boundaries inside pages and blocks), and the planner's own choice for many workers (which
// splits only where its cost model says it pays: long KV ranges).
struct Schedule {
  const char* name;
  kvattn::SchedulerOptions options;
};
std::vector<Schedule> schedules() {
  kvattn::SchedulerOptions unsplit, fixed, searched;
  unsplit.disable_split_kv = true;
  fixed.fixed_split_size = 7;
  searched.num_workers = 48;
  return {{"unsplit", unsplit}, {"fixed split 7", fixed}, {"searched, 48 workers", searched}};
}

// ---- the float64 reference ----------------------------------------------------------------------
struct RefVariant {
  bool causal = false;
  int window = -1;
  double soft_cap = 0;
  bool sigmoid = false;
  double sigmoid_bias = 0;
};

// One request: q [qo][Hq][D], k/v [kv][Hkv][D], positions q_pos0 + i and kv_pos[j]; `allowed`
// (optional) is an extra mask (block-sparse). Returns o [qo][Hq][D] and lse [qo][Hq] (base 2).
struct RefOut {
  std::vector<double> o, lse;
};
RefOut reference(const std::vector<double>& q, const std::vector<double>& k,
                 const std::vector<double>& v, int64_t qo, int64_t kv, int hq, int hkv, int d,
                 int64_t q_pos0, const std::vector<int64_t>& kv_pos, const RefVariant& var,
                 const std::vector<char>* allowed = nullptr) {
  RefOut r;
  r.o.assign(size_t(qo * hq * d), 0.0);
  r.lse.assign(size_t(qo * hq), kNegInf);
  const double scale = 1.0 / std::sqrt(double(d));
  for (int64_t i = 0; i < qo; ++i) {
    const int64_t p = q_pos0 + i;
    for (int h = 0; h < hq; ++h) {
      const int kh = h / (hq / hkv);
      std::vector<double> s;
      std::vector<int64_t> js;
      for (int64_t j = 0; j < kv; ++j) {
        if (var.causal && kv_pos[size_t(j)] > p) continue;
        if (var.window >= 0 && kv_pos[size_t(j)] < p - var.window) continue;
        if (allowed && !(*allowed)[size_t(i * kv + j)]) continue;
        double dot = 0;
        for (int e = 0; e < d; ++e)
          dot += q[size_t((i * hq + h) * d + e)] * k[size_t((j * hkv + kh) * d + e)];
        double x = scale * dot;
        if (var.soft_cap > 0) x = var.soft_cap * std::tanh(x / var.soft_cap);
        s.push_back(x);
        js.push_back(j);
      }
      double* o = &r.o[size_t((i * hq + h) * d)];
      if (var.sigmoid) {
        for (size_t t = 0; t < s.size(); ++t) {
          const double w = 1.0 / (1.0 + std::exp(-(s[t] + var.sigmoid_bias)));
          for (int e = 0; e < d; ++e) o[e] += w * v[size_t((js[t] * hkv + kh) * d + e)];
        }
        continue;
      }
      if (s.empty()) continue;
      const double m = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (size_t t = 0; t < s.size(); ++t) {
        const double w = std::exp(s[t] - m);
        sum += w;
        for (int e = 0; e < d; ++e) o[e] += w * v[size_t((js[t] * hkv + kh) * d + e)];
      }
      for (int e = 0; e < d; ++e) o[e] /= sum;
      r.lse[size_t(i * hq + h)] = (m + std::log(sum)) / std::log(2.0);
    }
  }
  return r;
}

// ---- comparisons --------------------------------------------------------------------------------
// |got - want| <= atol + rtol |want| for every output element, and the lse (when present).
void expect_close(const HostTensor& out, const HostTensor* lse, const std::vector<double>& o_ref,
                  const std::vector<double>& lse_ref, double atol, const std::string& what) {
  double worst = 0;
  int64_t bad = 0;
  std::string first;
  out.for_each([&](int64_t off, const std::vector<int64_t>& i) {
    const size_t lin = size_t((i[0] * out.shape()[1] + i[1]) * out.shape()[2] + i[2]);
    const double got = out.get_at(off), want = o_ref[lin];
    const double err = std::fabs(got - want);
    worst = std::max(worst, err);
    if (!(err <= atol + atol * std::fabs(want))) {
      if (bad++ == 0)
        first =
            kvattn_test::index_str(i) + ": " + std::to_string(got) + " vs " + std::to_string(want);
    }
  });
  EXPECT_EQ(bad, 0) << what << ": " << bad << " output elements off, first " << first
                    << "; worst error " << worst;
  if (!lse) return;
  int64_t lse_bad = 0;
  lse->for_each([&](int64_t off, const std::vector<int64_t>& i) {
    const double got = lse->get_at(off), want = lse_ref[size_t(i[0] * lse->shape()[1] + i[1])];
    const bool ok = want == kNegInf ? got == kNegInf : std::fabs(got - want) <= atol * 4;
    if (!ok && lse_bad++ == 0)
      ADD_FAILURE() << what << ": lse " << kvattn_test::index_str(i) << " = " << got << " vs "
                    << want;
  });
}

std::vector<uint8_t> bytes_of(const HostTensor& t) { return t.snapshot(); }

// ---- ragged prefill / append
// ----------------------------------------------------------------------
struct RaggedCase {
  std::vector<int32_t> qo_lens, kv_lens;
  RefVariant ref;
  kvattn::Variant variant;
};

void run_ragged(const RaggedCase& c, uint64_t seed) {
  const int hq = 8, hkv = 2, d = 64;
  kvattn_test::Rng rng(seed);
  const size_t B = c.kv_lens.size();
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0};
  for (size_t b = 0; b < B; ++b) {
    qo_indptr.push_back(qo_indptr.back() + c.qo_lens[b]);
    kv_indptr.push_back(kv_indptr.back() + c.kv_lens[b]);
  }
  const int64_t nq = qo_indptr.back(), nkv = kv_indptr.back();
  HostTensor q(DType::f32, {nq, hq, d}), k(DType::f32, {nkv, hkv, d}), v(DType::f32, {nkv, hkv, d});
  std::vector<double> qd, kd, vd;
  auto fill = [&](HostTensor& t, std::vector<double>& dst) {
    t.for_each([&](int64_t off, const std::vector<int64_t>&) {
      t.set_at(off, rng.uniform(-1, 1));
      dst.push_back(t.get_at(off));
    });
  };
  fill(q, qd);
  fill(k, kd);
  fill(v, vd);
  // The reference, request by request.
  std::vector<double> o_ref, lse_ref;
  for (size_t b = 0; b < B; ++b) {
    const int64_t qo = c.qo_lens[b], kv = c.kv_lens[b];
    std::vector<double> qb(qd.begin() + qo_indptr[b] * hq * d,
                           qd.begin() + qo_indptr[b + 1] * hq * d);
    std::vector<double> kb(kd.begin() + kv_indptr[b] * hkv * d,
                           kd.begin() + kv_indptr[b + 1] * hkv * d);
    std::vector<double> vb(vd.begin() + kv_indptr[b] * hkv * d,
                           vd.begin() + kv_indptr[b + 1] * hkv * d);
    std::vector<int64_t> pos(static_cast<size_t>(kv));
    for (int64_t j = 0; j < kv; ++j) pos[size_t(j)] = j;
    RefOut r = reference(qb, kb, vb, qo, kv, hq, hkv, d, kv - qo, pos, c.ref);
    o_ref.insert(o_ref.end(), r.o.begin(), r.o.end());
    lse_ref.insert(lse_ref.end(), r.lse.begin(), r.lse.end());
  }
  HostTensor qo_t = kvattn_test::int32_tensor(qo_indptr),
             kv_t = kvattn_test::int32_tensor(kv_indptr);
  const bool want_lse = !c.variant.sigmoid;
  std::vector<uint8_t> unsplit_out;
  for (const Schedule& sch : schedules()) {
    SCOPED_TRACE(sch.name);
    kvattn::BatchPrefillPlan params;
    params.num_qo_heads = hq;
    params.num_kv_heads = hkv;
    params.head_dim_qk = d;
    params.q_dtype = DType::f32;
    params.variant = c.variant;
    params.scheduler = sch.options;
    params.qo_indptr = qo_t.view();
    params.kv_indptr = kv_t.view();
    kvattn::BatchPrefill prefill;
    prefill.plan(params);
    ASSERT_NE(prefill.schedule(), nullptr);
    const kvattn::Plan& plan = *prefill.schedule();
    if (sch.options.fixed_split_size > 0) EXPECT_GT(plan.num_merges(), 0) << "nothing was split";
    HostTensor out(DType::f32, {nq, hq, d}), lse(DType::f32, {nq, hq});
    out.poison();
    lse.poison();
    prefill.run(q.view(), k.view(), v.view(), out.view(),
                want_lse ? lse.view() : kvattn::TensorView{});
    expect_close(out, want_lse ? &lse : nullptr, o_ref, lse_ref, 2e-5, "vs float64 reference");
    // Bitwise determinism: repeated runs, and a fresh plan of the same inputs.
    const auto first = bytes_of(out), first_lse = bytes_of(lse);
    for (int rep = 0; rep < 3; ++rep) {
      out.poison();
      prefill.run(q.view(), k.view(), v.view(), out.view(),
                  want_lse ? lse.view() : kvattn::TensorView{});
      ASSERT_TRUE(out.same_bytes(first)) << "run " << rep + 2 << " differs from run 1";
      if (want_lse) ASSERT_TRUE(lse.same_bytes(first_lse));
    }
    kvattn::BatchPrefill again;
    again.plan(params);
    out.poison();
    again.run(q.view(), k.view(), v.view(), out.view(),
              want_lse ? lse.view() : kvattn::TensorView{});
    ASSERT_TRUE(out.same_bytes(first)) << "a re-plan of the same inputs changed the output";
    // Split against unsplit: f32 rounding only.
    if (sch.options.disable_split_kv) {
      unsplit_out = first;
    } else {
      HostTensor unsplit(DType::f32, {nq, hq, d});
      unsplit.raw_bytes() = unsplit_out;
      std::vector<double> u;
      unsplit.for_each(
          [&](int64_t off, const std::vector<int64_t>&) { u.push_back(unsplit.get_at(off)); });
      expect_close(out, nullptr, u, {}, 2e-6, "split vs unsplit");
    }
  }
}

TEST(PlanExecutor, RaggedPrefillCausalSplitMatchesUnsplitAndReference) {
  // Appends (qo < kv), a full prefill (qo == kv), a request with nothing at all, a decode row.
  RaggedCase c{{5, 40, 0, 1, 17}, {130, 40, 0, 77, 300}, {}, kvattn::variants::causal()};
  c.ref.causal = true;
  run_ragged(c, 101);
}

TEST(PlanExecutor, RaggedPrefillSlidingWindowAndSoftCap) {
  RaggedCase c{
      {9, 33, 2}, {200, 33, 64}, {}, kvattn::variants::sliding_window(20).with_soft_cap(5)};
  c.ref.causal = true;
  c.ref.window = 20;
  c.ref.soft_cap = 5;
  run_ragged(c, 102);
}

TEST(PlanExecutor, RaggedPrefillNoMask) {
  RaggedCase c{{3, 12}, {150, 90}, {}, kvattn::variants::plain()};
  run_ragged(c, 103);
}

TEST(PlanExecutor, SigmoidPartialsMergeByAddition) {
  RaggedCase c{{4, 1, 6}, {120, 250, 6}, {}, kvattn::variants::sigmoid(-1.5f).with_causal()};
  c.ref.causal = true;
  c.ref.sigmoid = true;
  c.ref.sigmoid_bias = -1.5;
  run_ragged(c, 104);
}

// ---- paged decode
// ---------------------------------------------------------------------------------
void run_decode(const std::vector<int64_t>& kv_lens, const kvattn::Variant& variant,
                const RefVariant& ref, int page_size, uint64_t seed) {
  const int hq = 8, hkv = 2, d = 64;
  kvattn_test::Rng rng(seed);
  kvattn_test::PagedKVSpec spec;
  spec.kv_lens = kv_lens;
  spec.page_size = page_size;
  spec.num_kv_heads = hkv;
  spec.head_dim_qk = spec.head_dim_vo = d;
  kvattn_test::PagedKV cache(spec, rng);
  const int64_t B = int64_t(kv_lens.size());
  HostTensor q(DType::f32, {B, hq, d});
  std::vector<double> qd;
  q.for_each([&](int64_t off, const std::vector<int64_t>&) {
    q.set_at(off, rng.uniform(-1, 1));
    qd.push_back(q.get_at(off));
  });
  std::vector<double> o_ref, lse_ref;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t kv = kv_lens[size_t(b)];
    std::vector<double> kb(size_t(kv * hkv * d)), vb(size_t(kv * hkv * d));
    for (int64_t t = 0; t < kv; ++t)
      for (int h = 0; h < hkv; ++h)
        for (int e = 0; e < d; ++e) {
          kb[size_t((t * hkv + h) * d + e)] = cache.set_k(size_t(b), t, h, e, rng.uniform(-1, 1));
          vb[size_t((t * hkv + h) * d + e)] = cache.set_v(size_t(b), t, h, e, rng.uniform(-1, 1));
        }
    std::vector<double> qb(qd.begin() + b * hq * d, qd.begin() + (b + 1) * hq * d);
    std::vector<int64_t> pos(static_cast<size_t>(kv));
    for (int64_t j = 0; j < kv; ++j) pos[size_t(j)] = j;
    RefOut r = reference(qb, kb, vb, 1, kv, hq, hkv, d, kv - 1, pos, ref);
    o_ref.insert(o_ref.end(), r.o.begin(), r.o.end());
    lse_ref.insert(lse_ref.end(), r.lse.begin(), r.lse.end());
  }
  std::vector<uint8_t> unsplit_out;
  for (const Schedule& sch : schedules()) {
    SCOPED_TRACE(sch.name);
    kvattn::BatchDecodePlan params;
    params.num_qo_heads = hq;
    params.num_kv_heads = hkv;
    params.head_dim_qk = d;
    params.q_dtype = DType::f32;
    params.variant = variant;
    params.scheduler = sch.options;
    params.page_table = cache.table();
    params.page_size = page_size;
    kvattn::BatchDecode decode;
    decode.plan(params);
    ASSERT_NE(decode.schedule(), nullptr);
    // Decode with one long request on 48 workers: the planner splits it too.
    if (!sch.options.disable_split_kv) EXPECT_GT(decode.schedule()->num_merges(), 0);
    HostTensor out(DType::f32, {B, hq, d}), lse(DType::f32, {B, hq});
    out.poison();
    lse.poison();
    decode.run(q.view(), cache.cache(), out.view(), lse.view());
    expect_close(out, &lse, o_ref, lse_ref, 2e-5, "vs float64 reference");
    const auto first = bytes_of(out);
    for (int rep = 0; rep < 3; ++rep) {
      out.poison();
      decode.run(q.view(), cache.cache(), out.view(), lse.view());
      ASSERT_TRUE(out.same_bytes(first)) << "run " << rep + 2 << " differs from run 1";
    }
    if (sch.options.disable_split_kv) {
      unsplit_out = first;
    } else {
      HostTensor unsplit(DType::f32, {B, hq, d});
      unsplit.raw_bytes() = unsplit_out;
      std::vector<double> u;
      unsplit.for_each(
          [&](int64_t off, const std::vector<int64_t>&) { u.push_back(unsplit.get_at(off)); });
      expect_close(out, nullptr, u, {}, 2e-6, "split vs unsplit");
    }
  }
}

TEST(PlanExecutor, PagedDecodeSplitMatchesUnsplitAndReference) {
  // One long request among short ones, an empty one (o = 0, lse = -inf), partial last pages.
  run_decode({700, 3, 0, 129, 16, 45}, kvattn::variants::plain(), {}, 16, 201);
}

TEST(PlanExecutor, PagedDecodeSlidingWindow) {
  RefVariant ref;
  ref.causal = true;
  ref.window = 100;
  run_decode({500, 64, 101, 7}, kvattn::variants::sliding_window(100), ref, 8, 202);
}

// ---- block-sparse -------------------------------------------------------------------------------
TEST(PlanExecutor, BlockSparseSplitMatchesUnsplitAndReference) {
  const int hq = 4, hkv = 2, d = 32;
  const int64_t M = 24, N = 96, R = 4, C = 8;
  kvattn_test::Rng rng(301);
  std::vector<int32_t> indptr{0}, indices;
  for (int64_t br = 0; br < M / R; ++br) {
    std::vector<int32_t> cols;
    for (int32_t j = 0; j < N / C; ++j)
      if (br == 2 ? false : rng.coin(0.6)) cols.push_back(j);  // block row 2 is empty
    rng.shuffle(cols);
    indices.insert(indices.end(), cols.begin(), cols.end());
    indptr.push_back(int32_t(indices.size()));
  }
  HostTensor q(DType::f32, {M, hq, d}), k(DType::f32, {N, hkv, d}), v(DType::f32, {N, hkv, d});
  std::vector<double> qd, kd, vd;
  auto fill = [&](HostTensor& t, std::vector<double>& dst) {
    t.for_each([&](int64_t off, const std::vector<int64_t>&) {
      t.set_at(off, rng.uniform(-1, 1));
      dst.push_back(t.get_at(off));
    });
  };
  fill(q, qd);
  fill(k, kd);
  fill(v, vd);
  // Reference: the whole M x N problem with the block mask (query i at i + N - M, key j at j).
  std::vector<char> allowed(size_t(M * N), 0);
  for (int64_t br = 0; br < M / R; ++br)
    for (int32_t x = indptr[size_t(br)]; x < indptr[size_t(br) + 1]; ++x)
      for (int64_t i = br * R; i < (br + 1) * R; ++i)
        for (int64_t j = indices[size_t(x)] * C; j < (indices[size_t(x)] + 1) * C; ++j)
          allowed[size_t(i * N + j)] = 1;
  std::vector<int64_t> pos(static_cast<size_t>(N));
  for (int64_t j = 0; j < N; ++j) pos[size_t(j)] = j;
  RefOut r = reference(qd, kd, vd, M, N, hq, hkv, d, N - M, pos, {}, &allowed);

  HostTensor ind_t = kvattn_test::int32_tensor(indptr), idx_t = kvattn_test::int32_tensor(indices);
  std::vector<uint8_t> unsplit_out;
  for (const Schedule& sch : schedules()) {
    SCOPED_TRACE(sch.name);
    kvattn::BlockSparsePlan params;
    params.num_qo_heads = hq;
    params.num_kv_heads = hkv;
    params.head_dim_qk = d;
    params.q_dtype = DType::f32;
    params.scheduler = sch.options;
    params.bsr = {ind_t.view(), idx_t.view(), M, N, R, C};
    kvattn::BlockSparseAttention bsa;
    bsa.plan(params);
    ASSERT_NE(bsa.schedule(), nullptr);
    if (sch.options.fixed_split_size > 0) EXPECT_GT(bsa.schedule()->num_merges(), 0);
    HostTensor out(DType::f32, {M, hq, d}), lse(DType::f32, {M, hq});
    out.poison();
    lse.poison();
    bsa.run(q.view(), k.view(), v.view(), out.view(), lse.view());
    expect_close(out, &lse, r.o, r.lse, 2e-5, "vs float64 reference");
    const auto first = bytes_of(out);
    out.poison();
    bsa.run(q.view(), k.view(), v.view(), out.view(), lse.view());
    ASSERT_TRUE(out.same_bytes(first)) << "a second run differs from the first";
    if (sch.options.disable_split_kv) {
      unsplit_out = first;
    } else {
      HostTensor unsplit(DType::f32, {M, hq, d});
      unsplit.raw_bytes() = unsplit_out;
      std::vector<double> u;
      unsplit.for_each(
          [&](int64_t off, const std::vector<int64_t>&) { u.push_back(unsplit.get_at(off)); });
      expect_close(out, nullptr, u, {}, 2e-6, "split vs unsplit");
    }
  }
}

// The caller's host workspace holds the partial states when it is large enough; results do not
// depend on where they live.
TEST(PlanExecutor, UsesTheHostWorkspaceForPartials) {
  const int hq = 4, hkv = 1, d = 32;
  std::vector<int32_t> qo_indptr{0, 1, 2}, kv_indptr{0, 900, 1000};
  kvattn_test::Rng rng(401);
  HostTensor q(DType::f32, {2, hq, d}), k(DType::f32, {1000, hkv, d}),
      v(DType::f32, {1000, hkv, d});
  for (HostTensor* t : {&q, &k, &v})
    t->for_each(
        [&](int64_t off, const std::vector<int64_t>&) { t->set_at(off, rng.uniform(-1, 1)); });
  HostTensor qo_t = kvattn_test::int32_tensor(qo_indptr),
             kv_t = kvattn_test::int32_tensor(kv_indptr);
  kvattn::BatchPrefillPlan params;
  params.num_qo_heads = hq;
  params.num_kv_heads = hkv;
  params.head_dim_qk = d;
  params.q_dtype = DType::f32;
  params.qo_indptr = qo_t.view();
  params.kv_indptr = kv_t.view();
  params.scheduler.fixed_split_size = 64;
  HostTensor ws(DType::u8, {1 << 20});
  ws.poison();
  kvattn::BatchPrefill with_ws(ws.view()), without;
  with_ws.plan(params);
  without.plan(params);
  ASSERT_GT(with_ws.schedule()->num_merges(), 0);
  HostTensor a(DType::f32, {2, hq, d}), b(DType::f32, {2, hq, d});
  with_ws.run(q.view(), k.view(), v.view(), a.view());
  without.run(q.view(), k.view(), v.view(), b.view());
  EXPECT_TRUE(a.same_bytes(b.snapshot()));
  EXPECT_FALSE(ws.same_bytes(std::vector<uint8_t>(ws.raw_bytes().size(), 0xff)))
      << "the workspace was not used for the partial states";
}

// Deterministic modes (fixed_split_size, disable_split_kv): a request's output is bitwise the same
// whatever the rest of the batch and the number of workers, as serving frameworks' batch-invariant
// modes need.
TEST(PlanExecutor, FixedSplitAndNoSplitAreBatchInvariant) {
  const int hq = 4, hkv = 2, d = 32;
  kvattn_test::Rng rng(501);
  // The request under test: 6 new tokens on a 400-token cache; others around it in the big batch.
  const std::vector<int32_t> qo_lens{3, 6, 1, 20}, kv_lens{90, 406, 700, 20};
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0};
  for (size_t b = 0; b < qo_lens.size(); ++b) {
    qo_indptr.push_back(qo_indptr.back() + qo_lens[b]);
    kv_indptr.push_back(kv_indptr.back() + kv_lens[b]);
  }
  HostTensor q(DType::f32, {qo_indptr.back(), hq, d}), k(DType::f32, {kv_indptr.back(), hkv, d}),
      v(DType::f32, {kv_indptr.back(), hkv, d});
  for (HostTensor* t : {&q, &k, &v})
    t->for_each(
        [&](int64_t off, const std::vector<int64_t>&) { t->set_at(off, rng.uniform(-1, 1)); });
  // Request 1 alone: views into the same q, k, v rows.
  const int64_t q0 = qo_indptr[1], k0 = kv_indptr[1];
  auto rows = [](const HostTensor& t, int64_t begin, int64_t n) {
    const kvattn::TensorView view = t.view();
    const int64_t shape[3] = {n, view.size(1), view.size(2)};
    return kvattn::TensorView(static_cast<const float*>(view.data()) + begin * view.stride(0),
                              view.dtype(), 3, shape, view.strides());
  };
  std::vector<int32_t> one_qo{0, 6}, one_kv{0, 406};
  HostTensor all_qo = kvattn_test::int32_tensor(qo_indptr),
             all_kv = kvattn_test::int32_tensor(kv_indptr);
  HostTensor sq = kvattn_test::int32_tensor(one_qo), skv = kvattn_test::int32_tensor(one_kv);
  for (bool fixed : {true, false}) {
    SCOPED_TRACE(fixed ? "fixed_split_size 64" : "disable_split_kv");
    std::vector<uint8_t> reference_bytes;
    for (int workers : {1, 3, 64}) {
      for (bool alone : {false, true}) {
        kvattn::BatchPrefillPlan params;
        params.num_qo_heads = hq;
        params.num_kv_heads = hkv;
        params.head_dim_qk = d;
        params.q_dtype = DType::f32;
        params.variant = kvattn::variants::causal();
        params.scheduler.num_workers = workers;
        params.scheduler.fixed_split_size = fixed ? 64 : 0;
        params.scheduler.disable_split_kv = !fixed;
        params.qo_indptr = alone ? sq.view() : all_qo.view();
        params.kv_indptr = alone ? skv.view() : all_kv.view();
        kvattn::BatchPrefill prefill;
        prefill.plan(params);
        HostTensor out(DType::f32, {alone ? 6 : qo_indptr.back(), hq, d});
        out.poison();
        if (alone)
          prefill.run(rows(q, q0, 6), rows(k, k0, 406), rows(v, k0, 406), out.view());
        else
          prefill.run(q.view(), k.view(), v.view(), out.view());
        // The 6 x hq x d floats of request 1.
        std::vector<uint8_t> got(size_t(6 * hq * d * 4));
        const int64_t first = alone ? 0 : q0;
        std::memcpy(got.data(), static_cast<const char*>(out.view().data()) + first * hq * d * 4,
                    got.size());
        if (reference_bytes.empty()) reference_bytes = got;
        EXPECT_EQ(got, reference_bytes)
            << "workers " << workers << (alone ? ", alone" : ", in the batch");
      }
    }
  }
}

}  // namespace
