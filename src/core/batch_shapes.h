// Deterministic batch-length generators for the planner's tools: `kvattn plan`, the scheduling
// simulation, the planner tests and benchmarks. Portable: a fixed generator (splitmix64) and
// hand-written distributions, so a seed gives the same lengths on every platform.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvattn::detail {

struct SplitMix64 {
  uint64_t state;
  explicit SplitMix64(uint64_t seed) : state(seed) {}
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi] (inclusive).
  int64_t uniform(int64_t lo, int64_t hi) { return lo + int64_t(next() % uint64_t(hi - lo + 1)); }
  double unit() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

// n lengths uniform in [lo, hi].
std::vector<int32_t> uniform_lengths(int n, int32_t lo, int32_t hi, uint64_t seed);
// n lengths following Zipf's law by rank: the i-th longest (i = 1..n) is proportional to
// 1 / i^exponent, scaled so that the mean is `mean` (each at least 1), then shuffled by `seed`.
std::vector<int32_t> zipf_lengths(int n, double mean, double exponent, uint64_t seed);
// One request of long_len followed by n_short requests of short_len.
std::vector<int32_t> one_long_lengths(int32_t long_len, int n_short, int32_t short_len);

// Parses a distribution spec (the syntax of `kvattn plan --dist`):
//   uniform:N:LO:HI   zipf:N:MEAN[:EXPONENT]   long:LONG:N_SHORT:SHORT   (exponent default 1)
// Throws kvattn::Error naming the spec on a bad one.
std::vector<int32_t> lengths_from_spec(const std::string& spec, uint64_t seed);

}  // namespace kvattn::detail
