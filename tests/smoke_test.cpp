#include <gtest/gtest.h>
#include "kvattn/kvattn.h"
TEST(Smoke, Version) { EXPECT_STREQ(kvattn::kVersion, "0.1.0"); }
