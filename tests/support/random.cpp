#include "support/random.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>

namespace kvattn_test {

uint64_t base_seed() {
  static const uint64_t seed = [] {
    uint64_t s;
    if (const char* env = std::getenv("KVATTN_TEST_SEED")) {
      s = std::strtoull(env, nullptr, 0);
    } else {
      std::random_device rd;
      s = (uint64_t(rd()) << 32) ^ rd();
    }
    std::printf("kvattn tests: KVATTN_TEST_SEED=%llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

namespace {
uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

Rng case_rng() {
  static std::map<std::string, uint64_t> counters;
  std::string name = "?";
  if (auto* info = ::testing::UnitTest::GetInstance()->current_test_info())
    name = std::string(info->test_suite_name()) + "." + info->name();
  uint64_t n = counters[name]++;
  uint64_t h = std::hash<std::string>{}(name);
  return Rng(mix(mix(base_seed() ^ h) + n));
}

std::string seed_note(const Rng& rng) {
  return "replay: KVATTN_TEST_SEED=" + std::to_string(base_seed()) +
         " (this case's stream seed " + std::to_string(rng.seed()) + ")";
}

// Print the base seed before the first test, so that it appears even when nothing fails.
static const bool kSeedPrinted = (base_seed(), true);

}  // namespace kvattn_test
