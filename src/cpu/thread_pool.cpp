#include "cpu/thread_pool.h"

#include "core/overrides.h"

#include <atomic>
#include <cstdlib>
#include <exception>

#include "kvattn/version.h"

namespace kvattn::cpu {

struct ThreadPool::Shared {
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
};

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads < 1) num_threads = 1;
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {
void drain(std::atomic<int64_t>& next, int64_t n, const std::function<void(int64_t, int)>& fn,
           int thread, std::exception_ptr& error, std::mutex& error_mutex) {
  for (int64_t i; (i = next.fetch_add(1)) < n;) {
    try {
      fn(i, thread);
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(n);  // stop handing out work
    }
  }
}
}  // namespace

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  std::lock_guard call_lock(call_mutex_);
  Shared shared;
  if (workers_.empty() || n == 1) {
    drain(shared.next, n, fn, 0, shared.error, shared.error_mutex);
  } else {
    {
      std::lock_guard lock(mutex_);
      job_ = &fn;
      job_size_ = n;
      shared_ = &shared;
      active_ = int(workers_.size());
      ++generation_;
    }
    wake_.notify_all();
    drain(shared.next, n, fn, 0, shared.error, shared.error_mutex);
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return active_ == 0; });
    job_ = nullptr;
    shared_ = nullptr;
  }
  if (shared.error) std::rethrow_exception(shared.error);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int)>* job;
    Shared* shared;
    int64_t n;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      shared = shared_;
      n = job_size_;
    }
    drain(shared->next, n, *job, index, shared->error, shared->error_mutex);
    {
      std::lock_guard lock(mutex_);
      --active_;
    }
    done_.notify_one();
  }
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool(cpu_num_threads());
  return pool;
}

}  // namespace kvattn::cpu

int kvattn::cpu_num_threads() {
  if (const auto n = kvattn::detail::num_threads_setting()) return *n;
  unsigned hw = std::thread::hardware_concurrency();
  return hw ? int(hw) : 1;
}
