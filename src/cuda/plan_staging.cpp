#include "cuda/plan_staging.h"

#include <algorithm>
#include <cstring>

#include "cuda/runtime.h"
#include "kvattn/error.h"

namespace kvattn::cuda {

PlanStaging::~PlanStaging() {
  for (Buffer& b : buffers_) {
    if (b.copied) cudaEventDestroy(b.copied);
    if (b.host) cudaFreeHost(b.host);
  }
}

char* PlanStaging::acquire(int64_t bytes) {
  Buffer& b = buffers_[next_];
  if (b.copied) check(cudaEventSynchronize(b.copied), "waiting for an earlier plan's copy");
  if (bytes > b.bytes) {
    if (b.host) check(cudaFreeHost(b.host), "freeing a plan staging buffer");
    b.host = nullptr;
    b.bytes = 0;
    const int64_t want = std::max<int64_t>(bytes * 5 / 4, int64_t(1) << 16);  // room to grow
    check(cudaMallocHost(&b.host, size_t(want)), "allocating a plan staging buffer");
    b.bytes = want;
  }
  if (!b.copied) check(cudaEventCreateWithFlags(&b.copied, cudaEventDisableTiming), "creating an event");
  return static_cast<char*>(b.host);
}

void PlanStaging::copy(void* device_dst, int64_t bytes, cudaStream_t stream) {
  check(cudaMemcpyAsync(device_dst, buffers_[next_].host, size_t(bytes), cudaMemcpyHostToDevice, stream),
        "copying the plan");
}

void PlanStaging::release(cudaStream_t stream) {
  check(cudaEventRecord(buffers_[next_].copied, stream), "recording the plan's copy");
  next_ ^= 1;
}

int64_t stage_items_round_robin(const Plan& plan, int workers, int64_t capacity, WorkItem* items,
                                std::vector<int>& active) {
  int64_t pos = 0;
  active.clear();
  for (int w = 0; w < workers; ++w)
    if (!plan.worker_items(w).empty()) active.push_back(w);
  for (size_t i = 0; !active.empty(); ++i) {  // O(items): exhausted workers drop out
    size_t kept = 0;
    for (int w : active) {
      auto list = plan.worker_items(w);
      items[pos++] = list[i];
      if (i + 1 < list.size()) active[kept++] = w;
    }
    active.resize(kept);
  }
  for (int64_t i = pos; i < capacity; ++i) items[i] = WorkItem{};  // inactive padding
  return pos;
}

void stage_merges(const Plan& plan, MergeEntry* merges, int64_t capacity) {
  if (!plan.merges().empty()) std::memcpy(merges, plan.merges().data(), plan.merges().size_bytes());
  for (int64_t i = plan.num_merges(); i < capacity; ++i) merges[i] = MergeEntry{-1, 0, 0, 0, 0, 0};
}

void check_page_error_record(int32_t* record, cudaStream_t stream, const char* who) {
  int32_t rec[kPageErrorWords] = {};
  check(cudaMemcpyAsync(rec, record, sizeof(rec), cudaMemcpyDeviceToHost, stream), "reading the page-id error record");
  check(cudaStreamSynchronize(stream), "waiting for the runs");
  if (rec[0] == 0) return;
  check(cudaMemsetAsync(record, 0, sizeof(rec), stream), "clearing the page-id error record");
  check(cudaStreamSynchronize(stream), "clearing the page-id error record");
  detail::throw_error("kv_indices[", rec[1], "] = ", rec[2], " is out of range [0, ", rec[3], ") (found by a ", who,
                      " run on the device; the rows that read it came out NaN)");
}

}  // namespace kvattn::cuda
