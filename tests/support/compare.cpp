#include "support/compare.h"

#include "support/scoped_override.h"

#include <cmath>
#include <cstdlib>
#include <string>
#include <sstream>

namespace kvattn_test {

bool approx_tanh_may_run(bool long_shape_default) {
  const auto form = current_overrides().prefill_tanh;  // a test's ScopedOverride, else the environment
  return form == kvattn::detail::TanhForm::approx || (long_shape_default && form != kvattn::detail::TanhForm::exact);
}

ComputeTolerance allow_approx_tanh(ComputeTolerance t, const kvattn::Variant& variant, double rel_error) {
  if (variant.logits_soft_cap <= 0.0f) return t;
  return allow_logit_error(t, double(variant.logits_soft_cap) * rel_error);
}

ComputeTolerance allow_logit_error(ComputeTolerance t, double delta) {
  t.accumulation += std::expm1(2.0 * delta);
  t.lse_abs += delta / std::log(2.0);
  return t;
}

OutputTolerance output_tolerance(kvattn::DType out) {
  switch (out) {
    case kvattn::DType::f32: return {2 * std::ldexp(1.0, -24), std::ldexp(1.0, -149)};
    case kvattn::DType::f16: return {2 * std::ldexp(1.0, -11), std::ldexp(1.0, -25)};
    case kvattn::DType::bf16: return {2 * std::ldexp(1.0, -8), std::ldexp(1.0, -133)};
    default: return {0, 0};
  }
}

::testing::AssertionResult outputs_match(const HostTensor& out, const std::vector<double>& ref,
                                         const std::vector<double>& mag, ComputeTolerance ct) {
  const OutputTolerance tol = output_tolerance(out.dtype());
  int64_t bad = 0, unwritten = 0, n = 0;
  double worst_ratio = -1;
  std::ostringstream worst, first_unwritten;
  out.for_each([&](int64_t off, const std::vector<int64_t>& idx) {
    const size_t i = size_t(n++);
    const double got = out.get_at(off);
    if (out.is_poison_at(off)) {
      if (unwritten++ == 0) first_unwritten << index_str(idx);
      return;
    }
    const double allowed = tol.rtol * std::abs(ref[i]) + tol.atol + ct.output_abs + ct.accumulation * mag[i];
    const double err = std::abs(got - ref[i]);
    const bool ok = err <= allowed;  // false for NaN
    if (!ok) ++bad;
    const double ratio = std::isnan(err) ? INFINITY : err / allowed;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst.str("");
      worst << "at " << index_str(idx) << ": got " << got << ", expected " << ref[i]
            << ", |error| " << err << " > allowed " << allowed << " (o_mag " << mag[i] << ")";
    }
  });
  if (n != int64_t(ref.size()))
    return ::testing::AssertionFailure() << "reference has " << ref.size() << " elements, output "
                                         << n;
  std::string where;
  const int64_t dirty = out.count_dirty_padding(&where);
  if (bad == 0 && unwritten == 0 && dirty == 0) return ::testing::AssertionSuccess();
  auto f = ::testing::AssertionFailure();
  f << "output " << out.view().describe() << ": ";
  if (unwritten) f << unwritten << " elements never written (first " << first_unwritten.str() << "); ";
  if (bad) f << bad << " of " << n << " elements out of tolerance, worst " << worst.str() << "; ";
  if (dirty) f << dirty << " bytes written outside the view (first " << where << ")";
  return f;
}

::testing::AssertionResult lse_match(const HostTensor& lse, const std::vector<double>& ref,
                                     ComputeTolerance ct) {
  int64_t bad = 0, n = 0;
  double worst_err = -1;
  std::ostringstream worst;
  lse.for_each([&](int64_t off, const std::vector<int64_t>& idx) {
    const double want = ref[size_t(n++)];
    const double got = lse.get_at(off);
    bool ok;
    double err;
    if (std::isinf(want)) {
      ok = got == want;
      err = ok ? 0 : INFINITY;
    } else {
      err = std::abs(got - want);
      ok = err <= ct.lse_abs + kLseRel * std::abs(want);
    }
    if (!ok) ++bad;
    if (!ok && (err > worst_err || std::isnan(err))) {
      worst_err = std::isnan(err) ? INFINITY : err;
      worst.str("");
      worst << "at " << index_str(idx) << ": got " << got << ", expected " << want;
    }
  });
  std::string where;
  const int64_t dirty = lse.count_dirty_padding(&where);
  if (bad == 0 && dirty == 0) return ::testing::AssertionSuccess();
  auto f = ::testing::AssertionFailure();
  f << "lse " << lse.view().describe() << ": ";
  if (bad) f << bad << " of " << n << " elements wrong, worst " << worst.str() << "; ";
  if (dirty) f << dirty << " bytes written outside the view (first " << where << ")";
  return f;
}

::testing::AssertionResult padding_untouched(const HostTensor& t, const char* name) {
  std::string where;
  const int64_t dirty = t.count_dirty_padding(&where);
  if (dirty == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << name << ": " << dirty
                                       << " bytes outside the view changed (first " << where << ")";
}

}  // namespace kvattn_test
