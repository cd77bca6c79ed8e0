// kvattn's experiment and tracing knobs (KVATTN_DECODE_*, KVATTN_PREFILL_*, KVATTN_PLAN_TRACE...)
// are environment variables that tests change at run time, so plan() reads them every time. Each
// getenv scans the whole environment (87 variables on the device host, ~0.2 us a call, about ten
// calls a decode plan), so plan() takes a KnobScope: one pass collects the KVATTN_* entries, and
// knob() inside the scope reads those. Outside any scope knob() is getenv.
#pragma once

namespace kvattn::detail {

class KnobScope {
 public:
  KnobScope();
  ~KnobScope();
  KnobScope(const KnobScope&) = delete;
  KnobScope& operator=(const KnobScope&) = delete;

 private:
  friend const char* knob(const char* name);
  static constexpr int kMaxKnobs = 64;
  const char* entries_[kMaxKnobs];  // "KVATTN_X=value" strings of the environment
  int count_ = 0;
  bool overflow_ = false;            // more than kMaxKnobs: knob() falls back to getenv
  const KnobScope* outer_ = nullptr;  // nested scopes read the outermost one's entries
};

// The value of environment variable `name` (a KVATTN_* name), or nullptr.
const char* knob(const char* name);

}  // namespace kvattn::detail
