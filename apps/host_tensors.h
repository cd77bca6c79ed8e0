// Helpers shared by the kvattn command-line tool: owning host buffers of a kvattn dtype with a
// deterministic random fill, page-table builders, and wall-clock timing. Nothing here is part of
// the library's API; the tool uses only the public headers (include/kvattn).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "kvattn/kvattn.h"

namespace kvattn_cli {

// ---- random numbers -----------------------------------------------------------------------------
// SplitMix64: tiny, fast, and the same sequence on every platform and standard library (the
// distributions of <random> are not), so a --seed reproduces the same inputs everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return double(next_u64() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [lo, hi] (inclusive).
  int64_t uniform_int(int64_t lo, int64_t hi) {
    return lo + int64_t(next_u64() % uint64_t(hi - lo + 1));
  }
  // An independent stream derived from this one (for filling tensors in a fixed order).
  Rng fork() { return Rng(next_u64()); }

 private:
  uint64_t state_;
};

// ---- scalar conversions (written here so the tool depends only on the public API) ------------
float bf16_to_float(uint16_t h);
uint16_t float_to_bf16(float f);  // round to nearest even
float f16_to_float(uint16_t h);
uint16_t float_to_f16(float f);   // round to nearest even

// ---- owning host tensors ------------------------------------------------------------------------
// A contiguous, 64-byte aligned host buffer of one dtype (f32, f16, bf16, i32 or u8) and a shape.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(kvattn::DType dtype, std::vector<int64_t> shape);

  kvattn::DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return size_t(numel_) * kvattn::dtype_size(dtype_); }
  void* data() { return data_.get(); }
  const void* data() const { return data_.get(); }
  template <class T>
  T* data_as() { return static_cast<T*>(data()); }
  template <class T>
  const T* data_as() const { return static_cast<const T*>(data()); }

  // A contiguous view of the whole buffer (on the CPU).
  kvattn::TensorView view() const;

  // Element i (flat index) as a double, and set from a double (rounded to the dtype).
  double get(int64_t i) const;
  void set(int64_t i, double value);

  // Every element uniform in [lo, hi), rounded to the dtype.
  void fill_uniform(Rng& rng, double lo, double hi);
  void fill(double value);

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  kvattn::DType dtype_ = kvattn::DType::f32;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  std::unique_ptr<std::byte[], Free> data_;
};

// An int32 host tensor holding `values` (indptr, indices, lengths...).
HostTensor int32_tensor(const std::vector<int32_t>& values);

// ---- page tables --------------------------------------------------------------------------------
// Host-side page bookkeeping: every request owns a list of pages (its capacity), taken from a
// pool of `num_pages`; page_table(lengths) describes the first ceil(length / page_size) of them.
struct PageAssignment {
  int page_size = 0;
  int64_t num_pages = 0;                   // pages in the pool (the cache's first dimension)
  std::vector<std::vector<int32_t>> pages;  // per request, in token order

  // Pages that no request owns (the demo poisons them).
  std::vector<int32_t> unowned_pages() const;
  // Page and slot of token t of request b.
  int32_t page_of(int64_t b, int64_t t) const { return pages[size_t(b)][size_t(t / page_size)]; }
  int32_t slot_of(int64_t t) const { return int32_t(t % page_size); }
};

// Gives request b enough pages for capacity[b] tokens. With `scatter`, the pool has `spare`
// extra pages (as a fraction of the pages needed) and pages are handed out in random order, as
// in a long-running server; without it they are consecutive (0, 1, 2, ...).
PageAssignment assign_pages(const std::vector<int64_t>& capacity, int page_size, Rng& rng,
                            bool scatter = true, double spare = 0.25);

// The int32 arrays of a page table plus the views kvattn takes.
struct HostPageTable {
  HostTensor indptr, indices, last_page_len;
  kvattn::PageTable view() const { return {indptr.view(), indices.view(), last_page_len.view()}; }
};

// The page table of requests with the given lengths (each <= its capacity in `pages`).
HostPageTable make_page_table(const PageAssignment& pages, const std::vector<int64_t>& lengths);

// ---- timing -------------------------------------------------------------------------------------
struct Timing {
  std::vector<double> seconds;  // every timed run, in order
  double median = 0, min = 0, max = 0;
};

// Median, min and max of the given run times.
Timing summarize(std::vector<double> seconds);

// Runs fn `warmup` times untimed, then `reps` times timed (wall clock, std::chrono::steady_clock).
template <class F>
Timing time_runs(F&& fn, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> s;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    auto t1 = std::chrono::steady_clock::now();
    s.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  return summarize(std::move(s));
}

// ---- formatting ---------------------------------------------------------------------------------
std::string format_seconds(double s);                       // "812 us", "41.3 ms", "1.20 s"
std::string format_rate(double per_second, const char* unit);  // "12.4 GFLOP/s", "3.10 GB/s"
std::string format_count(int64_t n);                        // "12,345"

}  // namespace kvattn_cli
