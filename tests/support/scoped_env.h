// Sets an environment variable for one scope and restores what was there: tests that force a
// kernel choice (KVATTN_DECODE_KERNEL, ...) must not leak it into the tests after them, and the
// whole binary may itself run under such a variable (scripts/gpu-check).
#pragma once

#include <cstdlib>
#include <string>

namespace kvattn_test {

class ScopedEnv {
 public:
  // value nullptr: unset for the scope.
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name_)) saved_ = old, had_ = true;
    if (value) ::setenv(name_, value, 1);
    else ::unsetenv(name_);
  }
  ~ScopedEnv() {
    if (had_) ::setenv(name_, saved_.c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string saved_;
  bool had_ = false;
};

}  // namespace kvattn_test
