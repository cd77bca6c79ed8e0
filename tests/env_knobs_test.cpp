// detail::knob: inside a KnobScope it answers from one pass over the environment made when the
// (outermost) scope began, so a change of the environment inside the scope does not show; outside
// any scope, and when the environment holds more KVATTN_* variables than a scope keeps, it is
// getenv. Names match whole, not by prefix.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/env_knobs.h"
#include "support/scoped_env.h"

namespace kvattn_test {
namespace {

using kvattn::detail::knob;
using kvattn::detail::KnobScope;

std::string value(const char* name) {
  const char* v = knob(name);
  return v ? v : "(unset)";
}

TEST(EnvKnobs, ScopeSnapshotsTheKVATTNVariables) {
  ScopedEnv a("KVATTN_TEST_KNOB", "on");
  ScopedEnv b("KVATTN_TEST_KNOB_LONGER", "2");
  ScopedEnv unset("KVATTN_TEST_KNOB_UNSET", nullptr);
  {
    KnobScope scope;
    EXPECT_EQ(value("KVATTN_TEST_KNOB"), "on");
    EXPECT_EQ(value("KVATTN_TEST_KNOB_LONGER"), "2");
    EXPECT_EQ(value("KVATTN_TEST_KNO"), "(unset)");  // a prefix of a set name is not that name
    EXPECT_EQ(value("KVATTN_TEST_KNOB_UNSET"), "(unset)");
    // Changes inside the scope do not show: the snapshot was taken when it began.
    ScopedEnv changed("KVATTN_TEST_KNOB", "off");
    ScopedEnv added("KVATTN_TEST_KNOB_UNSET", "1");
    EXPECT_EQ(value("KVATTN_TEST_KNOB"), "on");
    EXPECT_EQ(value("KVATTN_TEST_KNOB_UNSET"), "(unset)");
    {
      KnobScope nested;  // reads the outer scope's snapshot, not the environment now
      EXPECT_EQ(value("KVATTN_TEST_KNOB"), "on");
      EXPECT_EQ(value("KVATTN_TEST_KNOB_UNSET"), "(unset)");
    }
    EXPECT_EQ(value("KVATTN_TEST_KNOB_LONGER"), "2");
  }
  // Outside a scope: the environment as it is now; a new scope sees a change made before it.
  ScopedEnv changed("KVATTN_TEST_KNOB", "off");
  EXPECT_EQ(value("KVATTN_TEST_KNOB"), "off");
  KnobScope again;
  EXPECT_EQ(value("KVATTN_TEST_KNOB"), "off");
}

TEST(EnvKnobs, TooManyVariablesFallBackToGetenv) {
  std::vector<std::string> names;  // outlives the ScopedEnvs, which keep pointers to them
  for (int i = 0; i < 80; ++i) names.push_back("KVATTN_TEST_MANY_" + std::to_string(i));
  std::vector<std::unique_ptr<ScopedEnv>> many;
  for (const auto& n : names) many.push_back(std::make_unique<ScopedEnv>(n.c_str(), "x"));
  ScopedEnv a("KVATTN_TEST_KNOB", "on");
  KnobScope scope;
  EXPECT_EQ(value("KVATTN_TEST_MANY_79"), "x");
  // Past the snapshot's capacity every lookup is getenv, so a change does show.
  ScopedEnv changed("KVATTN_TEST_KNOB", "off");
  EXPECT_EQ(value("KVATTN_TEST_KNOB"), "off");
}

}  // namespace
}  // namespace kvattn_test
