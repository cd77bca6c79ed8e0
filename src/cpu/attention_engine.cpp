#include "cpu/attention_engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/convert.h"
#include "cpu/thread_pool.h"
#include "cpu/engine_kernels.h"
#include "kernels/variants/builtin.cuh"

namespace kvattn::cpu {
namespace {
using Builtin = kernels::BuiltinVariant<kernels::kDynamicFeatures>;
constexpr VariantKernels kBuiltinKernels = variant_kernels<Builtin>();
const VariantKernels& kernels_of(const EngineProblem& p) { return p.user_kernels ? *p.user_kernels : kBuiltinKernels; }
}  // namespace

void compute_unit(const EngineProblem& p, const WorkUnit& u, const UnitState& st) { kernels_of(p).compute_unit(p, u, st); }
void store_unit(const EngineProblem& p, const WorkUnit& u, const UnitState& st) { kernels_of(p).store_unit(p, u, st); }
bool uses_softmax(const EngineProblem& p) { return kernels_of(p).use_softmax(p.variant); }

void run_unsplit(const EngineProblem& p) {
  std::vector<WorkUnit> units;
  for (size_t b = 0; b < p.requests.size(); ++b) {
    const EngineRequest& r = p.requests[b];
    for (int64_t q0 = 0; q0 < r.qo_len; q0 += kQueryTile)
      for (int h = 0; h < p.num_kv_heads; ++h)
        units.push_back({int32_t(b), h, q0, std::min(r.qo_len, q0 + kQueryTile), 0, r.kv_len});
  }
  const int group = p.num_qo_heads / p.num_kv_heads;
  ThreadPool::global().parallel_for(int64_t(units.size()), [&](int64_t i, int) {
    thread_local std::vector<float> o, lse;
    const WorkUnit& u = units[size_t(i)];
    int64_t nq = (u.q_end - u.q_begin) * group;
    o.resize(size_t(nq * p.head_dim_vo));
    lse.resize(size_t(nq));
    UnitState st{o.data(), lse.data()};
    compute_unit(p, u, st);
    store_unit(p, u, st);
  });
}

}  // namespace kvattn::cpu
