// Fresh random inputs on every run, replayable: one base seed per process (random, or the value of
// the environment variable KVATTN_TEST_SEED), printed at start-up and in the trace of every case
// that uses it; each case's stream is derived from the base seed, the test's name and a counter,
// so KVATTN_TEST_SEED=<base> --gtest_filter=<test> replays a failure exactly.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace kvattn_test {

uint64_t base_seed();

class Rng {
 public:
  explicit Rng(uint64_t seed) : seed_(seed), gen_(seed) {}
  uint64_t seed() const { return seed_; }
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(gen_); }
  double normal(double mean = 0, double stddev = 1) {
    return std::normal_distribution<double>(mean, stddev)(gen_);
  }
  // Uniform integer in [lo, hi] (both ends included).
  int64_t integer(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen_);
  }
  bool coin(double p_true = 0.5) { return uniform(0, 1) < p_true; }
  template <class T>
  void shuffle(std::vector<T>& v) { std::shuffle(v.begin(), v.end(), gen_); }
  std::mt19937_64& engine() { return gen_; }

 private:
  uint64_t seed_;
  std::mt19937_64 gen_;
};

// The Rng of the next case of the running test (a fresh stream per call) and a line naming the
// seeds, for SCOPED_TRACE.
Rng case_rng();
std::string seed_note(const Rng& rng);

}  // namespace kvattn_test

// Declares `rng` for this case and adds the replay line to every failure message in scope.
#define KVATTN_CASE_RNG(rng)                   \
  ::kvattn_test::Rng rng = ::kvattn_test::case_rng(); \
  SCOPED_TRACE(::kvattn_test::seed_note(rng))
