#include "support/child_process.h"

#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <random>
#include <vector>

extern char** environ;

namespace kvattn_test {

namespace fs = std::filesystem;

TempDir::TempDir(const std::string& prefix) {
  path = fs::temp_directory_path() /
         (prefix + "-" + std::to_string(getpid()) + "-" + std::to_string(std::random_device{}()));
  fs::create_directories(path);
}

TempDir::~TempDir() { fs::remove_all(path); }

void run_copies_of_this_binary(int copies, const std::string& gtest_filter, const std::string& env_assignment) {
  std::string env = env_assignment;
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e) envp.push_back(*e);
  envp.push_back(env.data());
  envp.push_back(nullptr);
  std::string exe = fs::read_symlink("/proc/self/exe");
  std::string filter = "--gtest_filter=" + gtest_filter, brief = "--gtest_brief=1";
  char* argv[] = {exe.data(), filter.data(), brief.data(), nullptr};
  std::vector<pid_t> pids(static_cast<size_t>(copies));
  for (pid_t& pid : pids) ASSERT_EQ(posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()), 0);
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
}

}  // namespace kvattn_test
