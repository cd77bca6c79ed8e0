// Where the fuzzer's choices come from: a seeded PRNG (the timed driver, kvattn_fuzz) or the bytes
// of a libFuzzer input (kvattn_libfuzzer). Every structural decision of an iteration (operation,
// shapes, dtypes, variant, corruption) is one call here, so a libFuzzer input is a compact recipe
// that mutations change meaningfully; tensor values come from a PRNG seeded by one draw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

namespace kvattn_fuzz {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class Source {
 public:
  // PRNG mode: an endless stream from `seed`.
  explicit Source(uint64_t seed) : state_(seed) {}
  // Byte mode: integers are read from the front of `data`; once it is used up every draw returns
  // its lower bound (so a short input is a small, simple problem).
  Source(const uint8_t* data, size_t size) : data_(data), size_(size), bytes_(true) {}

  // Uniform in [lo, hi] (both included); lo when hi <= lo.
  int64_t range(int64_t lo, int64_t hi) {
    if (hi <= lo) return lo;
    const uint64_t span = uint64_t(hi) - uint64_t(lo);  // hi - lo, without signed overflow
    uint64_t v;
    if (bytes_) {
      v = 0;
      for (uint64_t s = span; s != 0 && pos_ < size_; s >>= 8) v = (v << 8) | data_[pos_++];
    } else {
      v = next64();
    }
    const uint64_t r = span == UINT64_MAX ? v : v % (span + 1);
    return int64_t(uint64_t(lo) + r);
  }
  // True with probability percent / 100.
  bool chance(int percent) { return range(0, 99) < percent; }
  bool coin() { return range(0, 1) == 1; }
  // A double in [lo, hi] on a grid of 2^20 steps.
  double uniform(double lo, double hi) { return lo + (hi - lo) * double(range(0, 1 << 20)) / double(1 << 20); }
  uint64_t u64() { return uint64_t(range(INT64_MIN, INT64_MAX)); }
  template <class T>
  T pick(std::initializer_list<T> options) {
    return options.begin()[range(0, int64_t(options.size()) - 1)];
  }
  template <class T>
  const T& pick(const std::vector<T>& options) {
    return options[size_t(range(0, int64_t(options.size()) - 1))];
  }
  bool from_bytes() const { return bytes_; }

 private:
  uint64_t next64() {  // SplitMix64
    const uint64_t x = state_;
    state_ += 0x9e3779b97f4a7c15ull;
    return splitmix64(x);
  }
  uint64_t state_ = 0;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0, pos_ = 0;
  bool bytes_ = false;
};

}  // namespace kvattn_fuzz
