#include "core/env_knobs.h"

#include <cstdlib>
#include <cstring>

extern char** environ;  // POSIX

namespace kvattn::detail {
namespace {
thread_local const KnobScope* active_scope = nullptr;
constexpr char kPrefix[] = "KVATTN_";
constexpr size_t kPrefixLen = sizeof(kPrefix) - 1;
}  // namespace

KnobScope::KnobScope() : outer_(active_scope) {
  if (!outer_)
    for (char** e = environ; e && *e; ++e) {
      if ((*e)[0] != 'K' || std::strncmp(*e, kPrefix, kPrefixLen) != 0) continue;
      if (count_ == kMaxKnobs) {
        overflow_ = true;
        break;
      }
      entries_[count_++] = *e;
    }
  active_scope = this;
}

KnobScope::~KnobScope() { active_scope = outer_; }

const char* knob(const char* name) {
  const KnobScope* s = active_scope;
  while (s && s->outer_) s = s->outer_;
  if (!s || s->overflow_) return std::getenv(name);
  const size_t n = std::strlen(name);
  for (int i = 0; i < s->count_; ++i)
    if (std::strncmp(s->entries_[i], name, n) == 0 && s->entries_[i][n] == '=') return s->entries_[i] + n + 1;
  return nullptr;
}

}  // namespace kvattn::detail
