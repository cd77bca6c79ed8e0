// detail::knob: inside a KnobScope it answers from one pass over the environment made when the
// (outermost) scope began; outside any scope it is getenv. Names match whole, not by prefix.
#include <gtest/gtest.h>

#include <string>

#include "core/env_knobs.h"
#include "support/scoped_env.h"

namespace kvattn_test {
namespace {

using kvattn::detail::knob;
using kvattn::detail::KnobScope;

TEST(EnvKnobs, ScopeSnapshotsTheKVATTNVariables) {
  ScopedEnv a("KVATTN_TEST_KNOB", "on");
  ScopedEnv b("KVATTN_TEST_KNOB_LONGER", "2");
  ScopedEnv unset("KVATTN_TEST_KNOB_UNSET", nullptr);
  {
    KnobScope scope;
    ASSERT_NE(knob("KVATTN_TEST_KNOB"), nullptr);
    EXPECT_EQ(std::string(knob("KVATTN_TEST_KNOB")), "on");
    EXPECT_EQ(std::string(knob("KVATTN_TEST_KNOB_LONGER")), "2");
    EXPECT_EQ(knob("KVATTN_TEST_KNO"), nullptr);  // a prefix of a set name is not that name
    EXPECT_EQ(knob("KVATTN_TEST_KNOB_UNSET"), nullptr);
    {
      KnobScope nested;  // reads the outer scope's snapshot
      EXPECT_EQ(std::string(knob("KVATTN_TEST_KNOB")), "on");
    }
    EXPECT_EQ(std::string(knob("KVATTN_TEST_KNOB_LONGER")), "2");
  }
  // Outside a scope: the environment as it is now.
  ScopedEnv changed("KVATTN_TEST_KNOB", "off");
  EXPECT_EQ(std::string(knob("KVATTN_TEST_KNOB")), "off");
  KnobScope again;  // a new scope sees the change
  EXPECT_EQ(std::string(knob("KVATTN_TEST_KNOB")), "off");
}

}  // namespace
}  // namespace kvattn_test
