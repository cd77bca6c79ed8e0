// Checks that a call throws kvattn::Error whose message contains a given text.
#pragma once

#include <gtest/gtest.h>

#include <string_view>

#include "kvattn/error.h"

namespace kvattn_test {

template <class F>
::testing::AssertionResult throws_error(F&& f, std::string_view needle) {
  try {
    f();
  } catch (const kvattn::Error& e) {
    if (std::string_view(e.what()).find(needle) != std::string_view::npos)
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "the error message\n  \"" << e.what()
                                         << "\"\ndoes not contain\n  \"" << needle << "\"";
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-kvattn exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw (expected \"" << needle << "\")";
}

}  // namespace kvattn_test

#define EXPECT_KVATTN_ERROR(statement, needle) \
  EXPECT_TRUE(::kvattn_test::throws_error([&] { statement; }, needle))
