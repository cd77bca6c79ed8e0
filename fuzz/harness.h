// What every operation's fuzzer shares: the per-iteration context (choices, tensor values, the
// trace printed on failure, the buffers a call may touch), the two expectations (a legal call
// succeeds; a corrupted call throws kvattn::Error and leaves every byte of every buffer as it
// was), and the corruptions any tensor argument admits.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz/source.h"
#include "kvattn/kvattn.h"
#include "support/host_tensor.h"
#include "support/random.h"

namespace kvattn_fuzz {

using kvattn::DType;
using kvattn::TensorView;
using kvattn_test::HostTensor;

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// A check of the harness failed: a wrong result, a corruption accepted, an exception other than
// kvattn::Error, a buffer changed by a rejected call.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... P>
std::string cat(P&&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
template <class... P>
[[noreturn]] void fail(P&&... parts) {
  throw Failure(cat(parts...));
}

// One corruption: illegal by construction whatever else was corrupted, as long as no other
// corruption of the same iteration has the same target (the argument or field it changes; "a+b"
// for one that changes two). A corruption that reads an argument's values shares its target with
// those that change the argument's structure (length, dtype, strides, data pointer).
struct Corruption {
  std::string name;
  std::string target;
  std::function<void()> apply;  // may throw kvattn::Error itself (a view constructor rejecting)
};

// One iteration's state.
class Ctx {
 public:
  Ctx(Source& src, bool force_legal, bool force_corrupt);

  Source& src;
  kvattn_test::Rng values;         // tensor contents (seeded by one draw of src)
  bool corrupt;                    // this iteration corrupts its call
  std::vector<std::string> trace;  // what was built and done (printed on failure)
  std::string corruption_names;    // "; "-joined names of the corruptions applied

  template <class... P>
  void note(P&&... parts) {
    trace.push_back(cat(parts...));
  }
  // Registers a buffer that calls may read or write (snapshots compare them all).
  void track(const HostTensor& t) { buffers_.push_back(&t); }
  // A buffer owned by the iteration (corruptions make new index arrays), tracked.
  HostTensor& keep(HostTensor t);
  std::vector<std::vector<uint8_t>> snapshot() const;
  // The first tracked buffer whose bytes differ from `snap`, or -1.
  int64_t first_changed(const std::vector<std::vector<uint8_t>>& snap) const;

  // Picks one to three of `options` with distinct targets and applies them (in that order).
  void apply_corruptions(std::vector<Corruption>& options);

 private:
  std::vector<const HostTensor*> buffers_;
  std::deque<HostTensor> pool_;
};

// A legal call: anything thrown is a failure (a kvattn::Error rejects a legal input).
template <class F>
void expect_success(Ctx& ctx, const char* what, F&& call) {
  try {
    call();
  } catch (const kvattn::Error& e) {
    fail(what, " rejected a legal call: kvattn::Error: ", e.what());
  } catch (const Failure&) {
    throw;
  } catch (const std::exception& e) {
    fail(what, " threw a non-kvattn exception on a legal call: ", e.what());
  } catch (...) {
    fail(what, " threw something that is not a std::exception on a legal call");
  }
  (void)ctx;
}

// A corrupted call: it must throw kvattn::Error, and every tracked buffer must be byte-identical
// to before. `call` applies the corruptions and makes the call (a view constructor may reject).
template <class F>
void expect_rejection(Ctx& ctx, F&& call) {
  const auto snap = ctx.snapshot();
  bool rejected = false;
  try {
    call();
  } catch (const kvattn::Error& e) {
    rejected = true;
    ctx.note("rejected: ", e.what());
    if (std::string(e.what()).empty()) fail("kvattn::Error with an empty message");
  } catch (const Failure&) {
    throw;
  } catch (const std::exception& e) {
    fail("a corrupted call (", ctx.corruption_names, ") threw a non-kvattn exception: ", e.what());
  } catch (...) {
    fail("a corrupted call (", ctx.corruption_names, ") threw something that is not a std::exception");
  }
  if (!rejected) fail("a corrupted call was accepted: ", ctx.corruption_names);
  const int64_t changed = ctx.first_changed(snap);
  if (changed >= 0)
    fail("a rejected call (", ctx.corruption_names, ") changed tracked buffer #", changed);
}

// ---- tensors ------------------------------------------------------------------------------------
// A poisoned host tensor, contiguous or (at random) padded in every dim but the last.
HostTensor make_tensor(Ctx& ctx, DType t, std::vector<int64_t> shape, bool allow_strided = true);
HostTensor int32_host(const std::vector<int32_t>& values);
std::vector<int32_t> int32_values(const TensorView& v);  // a contiguous int32 view's elements
const char* dtype_str(DType t);
std::string shape_str(const TensorView& v);

// Views derived from v (same data unless said otherwise).
TensorView view_with(const TensorView& v, const void* data, DType dtype, std::vector<int64_t> shape,
                     std::vector<int64_t> strides, kvattn::Device dev);
TensorView with_dtype(const TensorView& v, DType t);
TensorView with_device(const TensorView& v, kvattn::Device d);
TensorView with_data(const TensorView& v, const void* data);
TensorView with_size(const TensorView& v, int dim, int64_t size);
TensorView with_stride(const TensorView& v, int dim, int64_t stride);
TensorView with_extra_dim(const TensorView& v);  // a trailing dim of 1
// Whether b is exactly a (kvattn/ops.h's in-place aliasing): same pointer, dtype, device, shape,
// and strides along every dim of size > 1.
bool exact_alias(const TensorView& a, const TensorView& b);

// What is legal for a tensor argument; the generic corruptions break one of these rules.
struct TensorRules {
  std::vector<DType> dtypes;   // legal dtypes (any other is illegal)
  bool head_contiguous = true; // the last dim needs stride 1
  std::vector<int> exact_dims; // dims whose size the other arguments fix
  bool output = false;         // distinct memory per element (a zero stride is illegal)
  // Targets (Corruption::target) of the corruptions: of all of them (default: the name), and of
  // the size and dtype ones apart (default: target). A size or dtype that is legal relative to
  // another argument (equal to it) must share a target with that argument's corruptions, or two
  // corruptions could agree again (q_dtype and q's dtype changed alike).
  std::string target = "", dims_target = "", dtype_target = "";
};
// Appends the corruptions of tensor argument `name` (held at `slot`, which the corruption
// rewrites): wrong ndim, wrong dtype, non-contiguous head dim, a fixed size +-1, null data with
// elements, on cuda:0 (a single tensor on another device is always a mismatch), zero stride
// (outputs). None is offered for an undefined view.
void tensor_corruptions(Ctx& ctx, std::vector<Corruption>& out, const std::string& name, TensorView& slot,
                        const TensorRules& rules);
// The same for a 1-D int32 host array: dtype, ndim, stride 2 (when > 1 element), cuda:0, null,
// and (exact_length) a length +-1.
void index_array_corruptions(Ctx& ctx, std::vector<Corruption>& out, const std::string& name,
                             TensorView& slot, bool exact_length, std::string target = "");
// Value corruptions of an indptr-like array (held in `slot`, replaced by a new array):
// indptr[0] != 0, a decrease, a last entry past `bound` when bound >= 0 (an array it indexes).
void indptr_corruptions(Ctx& ctx, std::vector<Corruption>& out, const std::string& name, TensorView& slot,
                        std::string target = "");
// `slot` replaced by a fresh int32 array of `values` (owned by ctx).
void replace_int32(Ctx& ctx, TensorView& slot, const std::vector<int32_t>& values);

inline const std::vector<DType> kAllDtypes = {DType::f32, DType::f16, DType::bf16, DType::e4m3,
                                              DType::e5m2, DType::i32, DType::u8};
inline const std::vector<DType> kComputeDtypes = {DType::f32, DType::f16, DType::bf16};
inline const std::vector<DType> kKVDtypes = {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2};

// A float value that no validation accepts where a finite one is needed.
inline double non_finite(Source& src) { return src.pick({kNaN, kInf, -kInf}); }

}  // namespace kvattn_fuzz
