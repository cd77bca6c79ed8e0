#include "demo_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvattn_cli {

ReferenceRow attention_reference(const ReferenceQuery& r) {
  const int64_t hq = r.q->shape()[1], d = r.q->shape()[2];
  const int64_t hkv = r.k->shape()[1], dv = r.v->shape()[2];
  std::vector<double> q(static_cast<size_t>(d));
  for (int64_t e = 0; e < d; ++e) q[size_t(e)] = r.q->get((r.q_row * hq + r.qo_head) * d + e);

  int64_t visible = r.causal ? std::min(r.kv_len, r.q_pos + 1) : r.kv_len;
  visible = std::max<int64_t>(visible, 0);
  std::vector<double> s(static_cast<size_t>(visible));
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t t = 0; t < visible; ++t) {
    int64_t base = ((r.kv_row0 + t) * hkv + r.kv_head) * d;
    double dot = 0;
    for (int64_t e = 0; e < d; ++e) dot += q[size_t(e)] * r.k->get(base + e);
    s[size_t(t)] = dot * r.sm_scale;
    m = std::max(m, s[size_t(t)]);
  }
  ReferenceRow out;
  out.o.assign(size_t(dv), 0.0);
  if (visible == 0) {  // nothing visible: kvattn writes zeros and lse = -inf
    out.lse = -std::numeric_limits<double>::infinity();
    return out;
  }
  double denom = 0;
  for (int64_t t = 0; t < visible; ++t) {
    double w = std::exp(s[size_t(t)] - m);
    denom += w;
    int64_t base = ((r.kv_row0 + t) * hkv + r.kv_head) * dv;
    for (int64_t e = 0; e < dv; ++e) out.o[size_t(e)] += w * r.v->get(base + e);
  }
  for (double& x : out.o) x /= denom;
  out.lse = (m + std::log(denom)) / std::log(2.0);
  return out;
}

void compare(double got, double want, double atol, double rtol, Comparison& c) {
  double err = std::fabs(got - want);
  if (!(err <= atol + rtol * std::fabs(want))) c.ok = false;  // NaN fails too
  if (std::isnan(err)) err = std::numeric_limits<double>::infinity();
  c.max_abs_error = std::max(c.max_abs_error, err);
}

}  // namespace kvattn_cli
