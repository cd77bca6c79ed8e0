// Element-by-element comparison of a kernel's output with the float64 reference. Every element is
// checked; a failure reports how many elements are off, the worst one (index, got, expected,
// allowed) and any element that was never written (still the 0xff poison) or written outside the
// view.
//
// Tolerances (why these numbers):
//  * Inputs are compared exactly as stored: the reference reads the decoded q/k/v values, so an
//    input dtype (f16, bf16, fp8) adds no error of its own.
//  * The kernel accumulates in f32. The logit s has an error of a few f32 ulps of
//    sum_e |q_e k_e| * scale (<= ~1e-5 for the |q|, |k| <= 2 and head dims <= 512 used here); a
//    softmax/sigmoid weight inherits it as a relative error, and the weighted sum adds its own
//    rounding. So the error of an output before rounding is bounded by kAccumulation * o_mag,
//    o_mag = sum_j |w_j v_j| (reference.h): kAccumulation = 1e-4 leaves a 10x margin while any
//    layout, mask or scaling mistake moves an output by O(o_mag).
//  * The output is rounded once to out dtype, round-to-nearest-even: a relative error of at most
//    the unit roundoff u = 2^-24 (f32), 2^-11 (f16), 2^-8 (bf16), plus half the subnormal spacing
//    in absolute terms; we allow 2u (rounding of the f32 v_scale product and the rounding of an
//    already slightly-off value).
//  * LSE (f32, base 2): exp2/log2 in f32 and the logit error above give |error| <~ 2e-5 for
//    the magnitudes here; we allow 2e-4 + 1e-6 |lse|. A fully masked row must be exactly -inf.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "kvattn/dtype.h"
#include "kvattn/variant.h"
#include "support/host_tensor.h"

namespace kvattn_test {

inline constexpr double kAccumulation = 1e-4;
inline constexpr double kLseAbs = 2e-4, kLseRel = 1e-6;

// The f32-computation allowances above; a case whose f32 error is larger for a stated reason
// (RoPE angles at positions in the thousands) widens them.
struct ComputeTolerance {
  double accumulation = kAccumulation;  // times o_mag
  double lse_abs = kLseAbs;
  // Absolute, on every output element, besides the out dtype's own floor: intermediate states
  // stored in the out dtype (a cascade's earlier levels) round to its subnormal spacing too.
  double output_abs = 0.0;
};

// Soft-cap through tanh.approx.f32, which the GPU prefill kernels' long shape takes by default
// (cuda::choose_prefill; KVATTN_PREFILL_TANH=exact|approx forces one form everywhere). With
// a relative error of at most e in tanh, a logit y = c tanh(x / c) moves by at most delta = c e
// (|tanh| <= 1):
//  * each weight by a factor within e^(+-delta) (softmax) or within that of its sigmoid, so a
//    normalised weight moves by a factor within e^(+-2 delta) and an output by at most
//    (e^(2 delta) - 1) o_mag on top of the f32 allowance;
//  * the LSE, 1-Lipschitz in the logits, by at most delta nats = delta log2(e) in base 2.
// e: the PTX ISA's bound, 2^-10.987 (cap 30: 3.0% of o_mag and 0.021 in the LSE; cap 5: 0.49% and
// 0.0035), or the measured one, kTanhApproxMeasured.
inline constexpr double kTanhApproxPtx = 0x1.0p-11 * 1.00905;  // 2^-10.987
// The largest relative error of MUFU.TANH over every f32 input measured exhaustively (N. Juffa,
// NVIDIA developer forums, "Hardware-accelerated tanh() on Turing", 2021: 1.113e-5), rounded up
// to 2^-16 = 1.53e-5. The test that holds the kernels to it keeps the approx-only code paths
// (the cap folded into the softmax's FFMA, the tile in quarters, hd 64's two stages) under a bound
// 22x tighter than the documented one.
inline constexpr double kTanhApproxMeasured = 0x1.0p-16;
// Whether tanh.approx can have run: `long_shape_default` says the case may take the long prefill
// shape (which defaults to it); KVATTN_PREFILL_TANH then decides.
bool approx_tanh_may_run(bool long_shape_default);
// t widened for logits that may move by up to delta (nats) each, as above.
ComputeTolerance allow_logit_error(ComputeTolerance t, double delta);
// t widened as above when the variant has soft-cap; unchanged otherwise.
ComputeTolerance allow_approx_tanh(ComputeTolerance t, const kvattn::Variant& variant,
                                   double rel_error = kTanhApproxPtx);

struct OutputTolerance {
  double rtol;  // relative, from the output rounding
  double atol;  // absolute floor (subnormal spacing of the out dtype)
};
OutputTolerance output_tolerance(kvattn::DType out);

// out: [rows, H, D]; ref and mag dense [rows][H][D].
::testing::AssertionResult outputs_match(const HostTensor& out, const std::vector<double>& ref,
                                         const std::vector<double>& mag,
                                         ComputeTolerance ct = {});
// lse: [rows, H] f32; ref dense [rows][H] (-inf for rows that see nothing).
::testing::AssertionResult lse_match(const HostTensor& lse, const std::vector<double>& ref,
                                     ComputeTolerance ct = {});
// Every byte of the tensor outside its logical elements is still poison.
::testing::AssertionResult padding_untouched(const HostTensor& t, const char* name);

}  // namespace kvattn_test
