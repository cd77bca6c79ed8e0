// Tests that need several processes at once (a disk cache shared between them): copies of this
// test binary, each running one helper test, and a fresh directory for them to share.
#pragma once

#include <filesystem>
#include <string>

namespace kvattn_test {

// A fresh, empty directory under the system's temporary one, removed afterwards.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "kvattn-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// Starts `copies` processes of this test binary at once, each with `env_assignment` ("NAME=value")
// added to the environment and running only the test `gtest_filter` names; waits for all of them
// and expects each to exit with status 0.
void run_copies_of_this_binary(int copies, const std::string& gtest_filter, const std::string& env_assignment);

}  // namespace kvattn_test
