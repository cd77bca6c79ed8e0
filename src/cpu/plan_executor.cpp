#include "cpu/plan_executor.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/convert.h"
#include "cpu/thread_pool.h"
#include "kvattn/error.h"

namespace kvattn::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Partial slot s: o at o + s * rows * dvo ([row][group head][dvo], as compute_unit writes it),
// lse at lse + s * rows, with rows = the plan's partial_slot_rows().
struct Partials {
  float* o = nullptr;
  float* lse = nullptr;
  int64_t rows = 0;
  int dvo = 0;
  UnitState slot(int32_t s) const { return {o + int64_t(s) * rows * dvo, lse + int64_t(s) * rows}; }
};

WorkUnit unit_of(int32_t request, int32_t kv_head, int32_t q_begin, int32_t q_end, int32_t kv_begin,
                 int32_t kv_end) {
  return {request, kv_head, q_begin, q_end, kv_begin, kv_end};
}

// Folds the partial states of one merge entry into `state` (SEMANTICS.md, "Merging attention
// states"), slot by slot in KV order, as cpu::merge does: a running maximum m of the LSEs, a
// denominator d = sum 2^(lse_i - m) and acc = sum o_i 2^(lse_i - m); o = acc / d and
// lse = m + log2(d). A slot with lse = -inf contributes nothing; all -inf gives o = 0, lse = -inf.
// Sigmoid attention has no softmax: the partial sums add.
void merge_entry(const EngineProblem& p, const MergeEntry& m, const Partials& parts,
                 const UnitState& state) {
  const bool softmax = uses_softmax(p);
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int dvo = parts.dvo;
  const int64_t nq = int64_t(m.q_end - m.q_begin) * group;
  for (int64_t qi = 0; qi < nq; ++qi) {
    float* acc = state.o + qi * dvo;
    std::fill(acc, acc + dvo, 0.0f);
    if (!softmax) {
      for (int32_t s = m.slot_begin; s < m.slot_begin + m.num_slots; ++s) {
        const float* o = parts.slot(s).o + qi * dvo;
        for (int e = 0; e < dvo; ++e) acc[e] += o[e];
      }
      state.lse[qi] = kNegInf;
      continue;
    }
    float mx = kNegInf, d = 0.0f;
    for (int32_t s = m.slot_begin; s < m.slot_begin + m.num_slots; ++s) {
      const UnitState in = parts.slot(s);
      const float lse = in.lse[qi];
      if (lse == kNegInf) continue;
      const float m_new = std::max(mx, lse);
      const float scale_old = std::exp2(mx - m_new);  // 0 while nothing has been accumulated
      const float w = std::exp2(lse - m_new);
      const float* o = in.o + qi * dvo;
      if (scale_old == 1.0f) {
        for (int e = 0; e < dvo; ++e) acc[e] += w * o[e];
      } else {
        for (int e = 0; e < dvo; ++e) acc[e] = acc[e] * scale_old + w * o[e];
      }
      d = d * scale_old + w;
      mx = m_new;
    }
    float lse_out = kNegInf;
    if (d > 0.0f) {
      const float inv = 1.0f / d;
      if (inv != 1.0f)
        for (int e = 0; e < dvo; ++e) acc[e] *= inv;
      lse_out = mx + std::log2(d);
    } else if (d != d) {  // NaN in an input: propagate
      std::fill(acc, acc + dvo, d);
      lse_out = d;
    }
    state.lse[qi] = lse_out;
  }
}

}  // namespace

int64_t plan_scratch_floats(const Plan& plan, int head_dim_vo) {
  return plan.num_partial_slots() * plan.partial_slot_rows() * (int64_t(head_dim_vo) + 1);
}

void run_plan(const EngineProblem& p, const Plan& plan, std::span<float> scratch) {
  KVATTN_CHECK(!plan.slice_zero_only(), "the CPU executor runs every worker's list: plan without slice_zero_only");
  KVATTN_CHECK(plan.batch_size() == int64_t(p.requests.size()) &&
                   plan.num_kv_heads() == p.num_kv_heads &&
                   plan.group_size() == p.num_qo_heads / p.num_kv_heads,
               "internal: the plan (", plan.batch_size(), " requests, ", plan.num_kv_heads(),
               " KV heads) does not match the problem (", p.requests.size(), " requests, ",
               p.num_kv_heads, " KV heads)");
  const int dvo = p.head_dim_vo;
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int64_t need = plan_scratch_floats(plan, dvo);
  std::vector<float> own;
  if (int64_t(scratch.size()) < need) {
    own.resize(size_t(need));
    scratch = own;
  }
  Partials parts;
  parts.rows = plan.partial_slot_rows();
  parts.dvo = dvo;
  parts.o = scratch.data();
  parts.lse = scratch.data() + plan.num_partial_slots() * parts.rows * dvo;

  // Phase 1: every worker's items, in its order. Items of unsplit rows write the output.
  ThreadPool::global().parallel_for(plan.num_workers(), [&](int64_t w, int) {
    thread_local std::vector<float> o, lse;
    for (const WorkItem& it : plan.worker_items(int(w))) {
      const WorkUnit u =
          unit_of(it.request, it.kv_head, it.q_begin, it.q_end, it.kv_begin, it.kv_end);
      if (it.partial_slot >= 0) {
        compute_unit(p, u, parts.slot(it.partial_slot));
        continue;
      }
      const int64_t nq = int64_t(it.q_end - it.q_begin) * group;
      o.resize(size_t(nq * dvo));
      lse.resize(size_t(nq));
      const UnitState st{o.data(), lse.data()};
      compute_unit(p, u, st);
      store_unit(p, u, st);
    }
  });

  // Phase 2: fold the split rows' partial states, one merge entry per index.
  auto merges = plan.merges();
  ThreadPool::global().parallel_for(int64_t(merges.size()), [&](int64_t e, int) {
    thread_local std::vector<float> o, lse;
    const MergeEntry& m = merges[size_t(e)];
    const int64_t nq = int64_t(m.q_end - m.q_begin) * group;
    o.resize(size_t(nq * dvo));
    lse.resize(size_t(nq));
    const UnitState st{o.data(), lse.data()};
    merge_entry(p, m, parts, st);
    store_unit(p, unit_of(m.request, m.kv_head, m.q_begin, m.q_end, 0, 0), st);
  });
}

}  // namespace kvattn::cpu
