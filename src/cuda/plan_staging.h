// What the decode and prefill runners share when plan() moves a plan to the device: the pinned
// staging buffers of the one host-to-device copy, and the layout of the work list and merge table.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "kvattn/plan.h"

namespace kvattn::cuda {

// Overrides::plan_trace (KVATTN_PLAN_TRACE=1) prints how long each phase of a GPU plan() took, one
// line per plan on stderr after the last phase (printing inside a phase would be timed with it).
struct PhaseTrace {  // one per plan(): mark() after each phase
  static constexpr int kMaxPhases = 8;
  explicit PhaseTrace(bool enabled) : on(enabled) {}
  bool on = false;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now(), t = start;
  const char* names[kMaxPhases] = {};
  double us[kMaxPhases] = {};
  int n = 0;
  void mark(const char* what) {
    if (!on || n == kMaxPhases) return;
    const auto now = std::chrono::steady_clock::now();
    names[n] = what;
    us[n++] = std::chrono::duration<double, std::micro>(now - t).count();
    t = now;
  }
  ~PhaseTrace() {
    if (!on || n == 0) return;
    std::fprintf(stderr, "[plan]");
    for (int i = 0; i < n; ++i) std::fprintf(stderr, " %s %.1f", names[i], us[i]);
    std::fprintf(stderr, " (runner %.1f us)\n", std::chrono::duration<double, std::micro>(t - start).count());
  }
};

// Two pinned host buffers used in turn, so that a plan() waits only for the copy it made two
// plans ago (the previous plan's copy may still be in flight on the caller's stream).
class PlanStaging {
 public:
  PlanStaging() = default;
  ~PlanStaging();
  PlanStaging(const PlanStaging&) = delete;
  PlanStaging& operator=(const PlanStaging&) = delete;

  // A host buffer of at least `bytes` for this plan; waits for that buffer's earlier copy.
  char* acquire(int64_t bytes);
  // Copies the first `bytes` of the acquired buffer to `device_dst` on `stream`; then release()
  // on the same stream hands the buffer back until two plans later (two calls, so that
  // KVATTN_PLAN_TRACE times the copy and the event record apart).
  void copy(void* device_dst, int64_t bytes, cudaStream_t stream);
  void release(cudaStream_t stream);

 private:
  struct Buffer {
    void* host = nullptr;
    int64_t bytes = 0;
    cudaEvent_t copied = nullptr;  // the copy out of `host` has finished
  };
  Buffer buffers_[2];
  int next_ = 0;
};

// One CTA per item: the lists of workers [0, workers) interleaved round-robin, so the longest
// items start first; then inactive padding up to `capacity` items. Returns the active items.
// `active` is scratch.
int64_t stage_items_round_robin(const Plan& plan, int workers, int64_t capacity, WorkItem* items,
                                std::vector<int>& active);

// The merge table, then unused entries (request -1) up to `capacity`.
void stage_merges(const Plan& plan, MergeEntry* merges, int64_t capacity);

// The kernels' record of the first out-of-range page id (kernels/decode/params.cuh,
// report_bad_page): flag, position in kv_indices, value, num_pages. plan() stages it as zeros.
constexpr int64_t kPageErrorWords = 4;
// Waits for `stream`; throws kvattn::Error naming the recorded id (and clears the record, on the
// stream) when a run since the last plan() or check found one. `who`: "decode" or "prefill".
void check_page_error_record(int32_t* record, cudaStream_t stream, const char* who);

}  // namespace kvattn::cuda
