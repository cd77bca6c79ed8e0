#include "core/batch_shapes.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "kvattn/error.h"

namespace kvattn::detail {

std::vector<int32_t> uniform_lengths(int n, int32_t lo, int32_t hi, uint64_t seed) {
  KVATTN_CHECK(n >= 0, "uniform lengths: n = ", n, " must be >= 0");
  KVATTN_CHECK(0 <= lo && lo <= hi, "uniform lengths: need 0 <= lo <= hi, got [", lo, ", ", hi,
               "]");
  SplitMix64 rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = int32_t(rng.uniform(lo, hi));
  return v;
}

std::vector<int32_t> zipf_lengths(int n, double mean, double exponent, uint64_t seed) {
  KVATTN_CHECK(n >= 0, "zipf lengths: n = ", n, " must be >= 0");
  KVATTN_CHECK(mean >= 1, "zipf lengths: mean = ", mean, " must be >= 1");
  KVATTN_CHECK(exponent >= 0, "zipf lengths: exponent = ", exponent, " must be >= 0");
  double sum = 0;
  for (int i = 1; i <= n; ++i) sum += std::pow(double(i), -exponent);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 1; i <= n; ++i) {
    double len = mean * n * std::pow(double(i), -exponent) / sum;
    v[size_t(i - 1)] = int32_t(std::max(1.0, std::min(2.0e9, std::round(len))));
  }
  SplitMix64 rng(seed);
  for (int i = n - 1; i > 0; --i) std::swap(v[size_t(i)], v[size_t(rng.uniform(0, i))]);
  return v;
}

std::vector<int32_t> one_long_lengths(int32_t long_len, int n_short, int32_t short_len) {
  KVATTN_CHECK(long_len >= 0 && short_len >= 0 && n_short >= 0,
               "one-long-many-short lengths must be >= 0 (long = ", long_len,
               ", short = ", short_len, ", count = ", n_short, ")");
  std::vector<int32_t> v(size_t(n_short) + 1, short_len);
  v[0] = long_len;
  return v;
}

std::vector<int32_t> lengths_from_spec(const std::string& spec, uint64_t seed) {
  std::vector<std::string> parts;
  std::stringstream ss(spec);
  for (std::string part; std::getline(ss, part, ':');) parts.push_back(part);
  auto num = [&](size_t i) -> double {
    try {
      size_t used = 0;
      double x = std::stod(parts.at(i), &used);
      if (used != parts[i].size()) throw std::invalid_argument("trailing");
      return x;
    } catch (const std::exception&) {
      throw Error("distribution '" + spec + "': field " + std::to_string(i) + " ('" +
                  (i < parts.size() ? parts[i] : std::string()) + "') is not a number");
    }
  };
  const std::string kind = parts.empty() ? "" : parts[0];
  if (kind == "uniform" && parts.size() == 4)
    return uniform_lengths(int(num(1)), int32_t(num(2)), int32_t(num(3)), seed);
  if (kind == "zipf" && (parts.size() == 3 || parts.size() == 4))
    return zipf_lengths(int(num(1)), num(2), parts.size() == 4 ? num(3) : 1.0, seed);
  if (kind == "long" && parts.size() == 4)
    return one_long_lengths(int32_t(num(1)), int(num(2)), int32_t(num(3)));
  throw Error("distribution '" + spec +
              "' is not one of uniform:N:LO:HI, zipf:N:MEAN[:EXPONENT], long:LONG:N_SHORT:SHORT");
}

}  // namespace kvattn::detail
