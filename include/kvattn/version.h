#pragma once
namespace kvattn {
inline constexpr const char* kVersion = "0.1.0";
// Number of worker threads of the CPU backend (KVATTN_NUM_THREADS, else hardware concurrency).
int cpu_num_threads();
}  // namespace kvattn
