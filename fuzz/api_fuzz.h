// A fuzz target over kvattn's public API (docs/DESIGN.md, "API fuzzer"). Each call of fuzz_one()
// picks an operation (the three attention wrappers, the merges, the paged append, RoPE, the
// planner), builds a small random legal problem from `src` and either runs it and checks out and
// lse (or the cache, the rotated values, the plan) against an independent float64 reference, or
// corrupts it in one to three ways that are illegal by construction and requires kvattn::Error
// with every output and input byte-identical to before. Anything else (another exception, a
// corrupted call accepted, a wrong result, a rejected legal call) throws Failure, whose message
// holds the trace of what was built and done.
//
// Drivers: kvattn_fuzz (fuzz/main.cpp, a seeded PRNG for a bounded time; what CI runs) and
// kvattn_libfuzzer (fuzz/libfuzzer.cpp, LLVMFuzzerTestOneInput over the same function).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fuzz/harness.h"
#include "fuzz/source.h"

namespace kvattn_fuzz {

enum class Op : int {
  decode,
  prefill_ragged,
  prefill_paged,
  block_sparse,
  merge_state,
  merge_state_in_place,
  merge_states,
  append,
  rope,
  planner,
  cascade,
};
inline constexpr int kNumOps = 11;
const char* op_name(Op op);
std::optional<Op> parse_op(std::string_view name);

struct FuzzOptions {
  std::optional<Op> only;  // always this operation
  bool legal_only = false, corrupt_only = false;
  bool verbose = false;  // print every iteration's trace
};

struct Outcome {
  Op op;
  bool corrupted;
};

// One iteration. Throws Failure (message: what failed, then the iteration's trace).
Outcome fuzz_one(Source& src, const FuzzOptions& options = {});

// The trace of the iteration in progress, for a crash handler (empty outside fuzz_one).
std::string current_trace();

struct Stats {
  int64_t checked[kNumOps] = {}, rejected[kNumOps] = {};
  void add(const Outcome& o) { (o.corrupted ? rejected : checked)[int(o.op)]++; }
  int64_t total() const;
  std::string report() const;  // one line per operation
};

}  // namespace kvattn_fuzz
