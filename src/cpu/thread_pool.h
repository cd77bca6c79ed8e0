// A fixed pool of worker threads for the CPU backend. parallel_for hands out indices dynamically
// (an atomic counter), so uneven work items balance themselves; the calling thread works too.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvattn::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return int(workers_.size()) + 1; }
  // Runs fn(i, thread_index) for i in [0, n). Exceptions from fn are rethrown here (the first one).
  void parallel_for(int64_t n, const std::function<void(int64_t, int)>& fn);

  // The process-wide pool: KVATTN_NUM_THREADS threads, else the hardware's concurrency.
  static ThreadPool& global();

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int)>* job_ = nullptr;
  int64_t job_size_ = 0;
  uint64_t generation_ = 0;
  int active_ = 0;
  bool stop_ = false;
  struct Shared;
  Shared* shared_ = nullptr;
  std::mutex call_mutex_;  // one parallel_for at a time
};

}  // namespace kvattn::cpu
