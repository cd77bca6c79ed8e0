// Overrides of the kernel choices for one scope, as the KVATTN_* variable `name` would set them:
// tests that force a kernel (KVATTN_DECODE_KERNEL=transposed, ...) build an Overrides this way
// instead of changing the environment. On top of the overrides active when it is made (an outer
// ScopedOverride, else the environment's, so that a test binary run under KVATTN_* variables, as
// scripts/gpu-check does, keeps them where the test does not set its own).
#pragma once

#include "core/overrides.h"

namespace kvattn_test {

// The overrides a plan() made now would use: the innermost scope's, else the environment's.
inline kvattn::detail::Overrides current_overrides() {
  const kvattn::detail::Overrides* scoped = kvattn::detail::scoped_overrides();
  return scoped ? *scoped : kvattn::detail::Overrides::from_environment();
}

// The active overrides (or the environment's) with `name` set from `value` (nullptr: cleared).
// Throws kvattn::Error for a bad value, naming the variable.
inline kvattn::detail::Overrides override_from(const char* name, const char* value) {
  const kvattn::detail::Overrides* scoped = kvattn::detail::scoped_overrides();
  kvattn::detail::Overrides o = scoped ? *scoped : kvattn::detail::Overrides::from_environment();
  kvattn::detail::set_override(o, name, value);
  return o;
}

class ScopedOverride {
 public:
  ScopedOverride(const char* name, const char* value) : scope_(override_from(name, value)) {}
  explicit ScopedOverride(kvattn::detail::Overrides o) : scope_(std::move(o)) {}

 private:
  kvattn::detail::OverridesScope scope_;
};

}  // namespace kvattn_test
