// What the GPU benchmarks (bench decode, prefill, cascade) share: picking cases by id, and, with
// the CUDA backend, an owning device buffer and the CUDA error check.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "kvattn/error.h"

#if KVATTN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/runtime.h"
#endif

namespace kvattn_cli {

// The cases whose ids are in `ids` (all of them when `ids` is empty), in the table's order; an id
// that names no case is an error that says where to look (`--list`).
template <class Case>
std::vector<Case> pick_cases(std::vector<Case> all, const std::vector<std::string>& ids, bool quick) {
  if (ids.empty()) return all;
  for (const auto& id : ids)
    if (std::none_of(all.begin(), all.end(), [&](const Case& c) { return c.id == id; }))
      throw kvattn::Error("--cases: no case '" + id + "'" + (quick ? " with --quick" : "") + " (see --list)");
  std::vector<Case> picked;
  for (auto& c : all)
    if (std::find(ids.begin(), ids.end(), c.id) != ids.end()) picked.push_back(std::move(c));
  return picked;
}

#if KVATTN_WITH_CUDA
inline void cuda_ok(cudaError_t e, const char* what) { kvattn::cuda::check(e, what); }

// n elements of T on the current device (at least one byte), freed with the buffer.
template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  explicit DeviceBuffer(size_t n) {
    cuda_ok(cudaMalloc(reinterpret_cast<void**>(&ptr), std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// Host time of plan(): 200 calls, each followed by `step` (the caller's run and a synchronisation,
// as in a serving loop; not timed), after 3 warm-up calls (the first ones allocate the pinned
// staging buffers and wait behind the benchmark's setup, which a serving loop pays once): their
// median and 90th percentile in microseconds. (Before 10cb283: the median of 20 plans back to
// back, which moved by up to 7 us between two runs of one binary on the device host.)
// first_us: the first warm-up call (the process's first plan() of the case compiles its kernels
// or loads them from the disk cache).
struct PlanTimes {
  double median_us = 0, p90_us = 0, first_us = 0;
};
template <class Plan, class Step>
PlanTimes time_plans(Plan&& plan, Step&& step) {
  double first_us = 0;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    plan();
    if (i == 0) first_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  cuda_ok(cudaDeviceSynchronize(), "warm-up plans");
  std::vector<double> us;
  for (int i = 0; i < 200; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    plan();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    step();
  }
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[us.size() * 9 / 10], first_us};
}

// Median of `iters` calls of run(copy) (copy = i % copies: the caller rotates cache copies so that
// each call reads from a cold L2), each between two CUDA events on the default stream, after 3
// warm-up calls. Returns milliseconds; the device is idle afterwards.
template <class Run>
double median_ms(Run&& run, int copies, int iters) {
  for (int i = 0; i < 3; ++i) run(i % copies);
  cuda_ok(cudaDeviceSynchronize(), "warm-up");
  std::vector<cudaEvent_t> ev(static_cast<size_t>(2 * iters));
  for (auto& e : ev) cuda_ok(cudaEventCreate(&e), "cudaEventCreate");
  for (int i = 0; i < iters; ++i) {
    cuda_ok(cudaEventRecord(ev[size_t(2 * i)]), "cudaEventRecord");
    run(i % copies);
    cuda_ok(cudaEventRecord(ev[size_t(2 * i + 1)]), "cudaEventRecord");
  }
  cuda_ok(cudaDeviceSynchronize(), "timed runs");
  std::vector<float> ms(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i)
    cuda_ok(cudaEventElapsedTime(&ms[size_t(i)], ev[size_t(2 * i)], ev[size_t(2 * i + 1)]), "cudaEventElapsedTime");
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}
#endif

}  // namespace kvattn_cli
