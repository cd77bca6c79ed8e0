// `kvattn demo`: one serving step of a Llama-3-8B-shaped batch, run with no arguments.
//
// A continuous-batching step: most requests decode one token, some append a chunk of their prompt
// (chunked prefill), a few start a fresh prompt. Their KV lives in one paged cache (bf16, NHD,
// page 16, K and V in one 5-D tensor, pages handed out in random order; free pages and unwritten
// slots are NaN). The step runs, in a server's order,
//   1. append_paged_kv_cache: every request's new tokens' K/V into the cache;
//   2. BatchDecode: the decoding requests' one query each over their whole KV (new token included);
//   3. BatchPrefill (paged, causal, bottom-right): the appending and prefilling requests' new
//      queries over their whole KV;
// all on the GPU when there is one (cuda:0; CUDA events time each phase), else on the CPU backend
// on a smaller batch (steady clock). Each phase is timed (median of --reps runs after one warm-up
// run; the warm-up includes the JIT's compile or cache load and is reported apart) and checked on
// the host: the append bit for bit, the attention on sampled (request, row, head) rows against a
// float64 reference computed from the requests' tokens in logical order (demo_reference.cpp), so
// the page table, the append and the attention are all checked. Every K/V value is a pure function
// of (seed, request, token, K or V, head) (KvValues), so the reference regenerates what it needs.
//
// The text says where each phase ran from the device of the tensors it was given (the library runs
// a call where its tensors are); nothing is reported for a device that did not run it. Exit status
// 1 when a check fails. The CUDA runtime is used here only for memory, copies and events; every
// CUDA call is checked.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "demo_reference.h"
#include "host_tensors.h"
#include "kvattn/kvattn.h"

#if KVATTN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvattn_cli {
namespace {

using kvattn::DType;
using kvattn::TensorView;

// Llama-3-8B attention.
constexpr int kNumQoHeads = 32;
constexpr int kNumKvHeads = 8;
constexpr int kHeadDim = 128;
constexpr int kPageSize = 16;
constexpr DType kDType = DType::bf16;
constexpr double kBytes = 2.0;  // bytes per bf16 element
constexpr int64_t kRowElems = int64_t(kNumKvHeads) * kHeadDim;  // one token's K (or V), all heads
constexpr int64_t kPageElems = 2 * kPageSize * kRowElems;       // one page of the 5-D cache

// bf16 inputs rounded once, f32 accumulation, bf16 output: the output's own rounding is 2^-9
// relative (~0.002 for |o| ~ 1); 1e-2 absolute plus 1e-2 relative leaves room for f32
// accumulation over thousands of keys while still catching a wrong page or a missed mask, which
// move outputs by O(0.1). LSE is f32 (no output rounding), so it gets a tighter bound.
constexpr double kOutAtol = 1e-2, kOutRtol = 1e-2;
constexpr double kLseAtol = 1e-3, kLseRtol = 1e-4;

// Inputs uniform in [-sqrt(3), sqrt(3)): unit variance, so logits q.k / sqrt(D) have unit variance.
const double kInputBound = std::sqrt(3.0);

// ---- the batch ----------------------------------------------------------------------------------
// The request mix. "full" is a few hundred requests for a GPU; "small" the same mix, smaller, so
// the CPU backend finishes in seconds.
struct StepShape {
  int decode = 0, append = 0, prefill = 0;  // requests of each kind
  int64_t long_len = 0;                     // cached tokens of decode request 0 (0: none longer)
  int64_t min_len = 0, max_len = 0;         // cached tokens of the others (log-uniform)
  int64_t chunk_min = 0, chunk_max = 0;     // new tokens of an appending request (uniform)
  int64_t prompt_min = 0, prompt_max = 0;   // new tokens of a fresh prefill (uniform)
};
constexpr StepShape kFullShape{256, 32, 4, 32768, 128, 8192, 64, 512, 512, 4096};
constexpr StepShape kSmallShape{24, 3, 1, 2048, 32, 512, 16, 64, 64, 192};

enum class Kind { decode, append, prefill };
const char* kind_name(Kind k) {
  return k == Kind::decode ? "decode" : k == Kind::append ? "append" : "prefill";
}

struct Request {
  Kind kind = Kind::decode;
  int64_t cached = 0;  // tokens in the cache before the step
  int64_t fresh = 0;   // tokens this step adds (1 for decode)
  int64_t kv_len() const { return cached + fresh; }
};

struct DemoOptions {
  uint64_t seed = 2025;
  std::string backend = "auto";  // auto | cpu | cuda
  std::string size = "auto";     // auto | small | full
  int decode = -1, append = -1, prefill = -1;  // -1: from --size
  int64_t long_len = -1, max_len = -1;         // -1: from --size
  int threads = 0;  // 0: the library's default (KVATTN_NUM_THREADS, else all cores)
  int reps = 0;     // 0: 20 on the GPU, 3 on the CPU
  int samples = 256;
  bool json = false;
};

// Every K and V value is a function of (seed, request, token, K or V, kv head, element): the
// cache, the appended rows and the reference all draw from here, in any order and any thread.
class KvValues {
 public:
  explicit KvValues(uint64_t seed) : seed_(seed) {}
  // The kHeadDim bf16 values of (request b, token t, K (kv = 0) or V (1), kv head h).
  void row(int64_t b, int64_t t, int kv, int h, uint16_t* dst) const {
    Rng r(mix(mix(mix(seed_ ^ uint64_t(b)) ^ uint64_t(t)) ^ uint64_t(kv * 64 + h)));
    for (int e = 0; e < kHeadDim; ++e) dst[e] = float_to_bf16(float(r.uniform(-kInputBound, kInputBound)));
  }

 private:
  static uint64_t mix(uint64_t z) {  // SplitMix64's step
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t seed_;
};

// fn(i) for i in [0, n) on all cores (setup and checks only; the library runs its own threads).
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 32);
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t i; (i = next.fetch_add(1)) < n;) fn(i);
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < std::min(threads, n); ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

struct Step {
  std::vector<Request> req;  // decoding requests first, then appending, then prefilling
  PageAssignment pages;      // enough pages for every request's kv_len
  HostTensor cache;          // [pages, 2, page_size, Hkv, D], the host copy
  KvValues values{0};
  std::vector<int> ids(Kind k) const {
    std::vector<int> out;
    for (size_t i = 0; i < req.size(); ++i)
      if (req[i].kind == k) out.push_back(int(i));
    return out;
  }
  uint16_t* slot(int64_t page, int kv, int64_t s, int h) {
    return cache.data_as<uint16_t>() + ((page * 2 + kv) * kPageSize + s) * kRowElems + int64_t(h) * kHeadDim;
  }
};

// Log-uniform in [lo, hi]: as many requests of a few hundred tokens as of a few thousand.
int64_t log_uniform(Rng& rng, int64_t lo, int64_t hi) {
  const double x = std::exp(rng.uniform(std::log(double(lo)), std::log(double(hi) + 1.0)));
  return std::clamp<int64_t>(int64_t(x), lo, hi);
}

Step make_step(const StepShape& sh, uint64_t seed, Rng& rng) {
  Step s;
  s.values = KvValues(seed);
  for (int i = 0; i < sh.decode; ++i)
    s.req.push_back({Kind::decode, i == 0 && sh.long_len > 0 ? sh.long_len : log_uniform(rng, sh.min_len, sh.max_len), 1});
  for (int i = 0; i < sh.append; ++i)
    s.req.push_back({Kind::append, log_uniform(rng, sh.min_len, sh.max_len), rng.uniform_int(sh.chunk_min, sh.chunk_max)});
  for (int i = 0; i < sh.prefill; ++i)
    s.req.push_back({Kind::prefill, 0, rng.uniform_int(sh.prompt_min, sh.prompt_max)});
  std::vector<int64_t> capacity;
  for (const Request& r : s.req) capacity.push_back(r.kv_len());
  s.pages = assign_pages(capacity, kPageSize, rng, /*scatter=*/true, /*spare=*/0.25);

  // Every slot starts NaN: free pages, and the slots the append is about to fill, so that a page
  // the table does not list, a slot past kv_len or a missed append shows up in the checks.
  s.cache = HostTensor(kDType, {s.pages.num_pages, 2, kPageSize, kNumKvHeads, kHeadDim});
  const uint16_t nan_bits = float_to_bf16(std::numeric_limits<float>::quiet_NaN());
  parallel_for(s.pages.num_pages, [&](int64_t p) {
    std::fill_n(s.cache.data_as<uint16_t>() + p * kPageElems, kPageElems, nan_bits);
  });
  // The tokens already cached (the earlier steps of each request), page by page.
  std::vector<std::pair<int, int64_t>> tasks;  // (request, page index within the request)
  for (size_t b = 0; b < s.req.size(); ++b)
    for (int64_t j = 0; j * kPageSize < s.req[b].cached; ++j) tasks.push_back({int(b), j});
  parallel_for(int64_t(tasks.size()), [&](int64_t i) {
    const auto [b, j] = tasks[size_t(i)];
    const int64_t end = std::min<int64_t>((j + 1) * kPageSize, s.req[size_t(b)].cached);
    for (int64_t t = j * kPageSize; t < end; ++t)
      for (int kv = 0; kv < 2; ++kv)
        for (int h = 0; h < kNumKvHeads; ++h)
          s.values.row(b, t, kv, h, s.slot(s.pages.page_of(b, t), kv, s.pages.slot_of(t), h));
  });
  return s;
}

// The page table of the given requests at their kv_len (after the append).
HostPageTable page_table_of(const Step& s, const std::vector<int>& ids) {
  PageAssignment sub;
  sub.page_size = kPageSize;
  sub.num_pages = s.pages.num_pages;
  std::vector<int64_t> lengths;
  for (int b : ids) {
    sub.pages.push_back(s.pages.pages[size_t(b)]);
    lengths.push_back(s.req[size_t(b)].kv_len());
  }
  return make_page_table(sub, lengths);
}

kvattn::AttentionShape attention_shape(bool causal) {
  kvattn::AttentionShape a;
  a.num_qo_heads = kNumQoHeads;
  a.num_kv_heads = kNumKvHeads;
  a.head_dim_qk = kHeadDim;
  a.head_dim_vo = kHeadDim;
  a.q_dtype = kDType;
  a.kv_dtype = kDType;
  a.o_dtype = kDType;
  a.variant = causal ? kvattn::variants::causal() : kvattn::variants::plain();
  return a;
}

// ---- where the step runs ------------------------------------------------------------------------
struct PhaseTiming {
  Timing timing;       // the timed runs
  double first_s = 0;  // the warm-up run (includes the JIT's compile or load of its kernels)
};

#if KVATTN_WITH_CUDA
void cuda_check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess)
    throw kvattn::Error("CUDA error in " + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
#endif

// The tensors of the step where it runs: on the CPU the host tensors themselves; on the GPU
// (cuda:0) device copies, made with cudaMalloc and cudaMemcpy and freed with the Placement.
class Placement {
 public:
  static Placement cpu(int threads) {
    Placement p;
    p.cpu_where_ = p.where_ = cpu_text(threads);
    return p;
  }
#if KVATTN_WITH_CUDA
  static Placement gpu(int device, int threads) {
    Placement p;
    p.cpu_where_ = cpu_text(threads);
    p.gpu_ = true;
    p.device_ = device;
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    cudaDeviceProp prop{};
    cuda_check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    p.device_name_ = prop.name;
    p.where_ = "GPU cuda:" + std::to_string(device) + " (" + p.device_name_ + ")";
    p.device_detail_ = p.device_name_ + ", sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
                       std::to_string(prop.multiProcessorCount) + " SMs, " +
                       std::to_string(int64_t(prop.totalGlobalMem >> 30)) + " GiB";
    return p;
  }
#endif
  bool on_gpu() const { return gpu_; }
  const std::string& where() const { return where_; }
  // Where a call on tensors of device d runs (the library runs a call where its tensors are).
  std::string describe(const kvattn::Device& d) const {
    if (d.is_cpu()) return cpu_where_;
    return gpu_ && d == kvattn::Device::cuda(device_) ? where_ : "GPU " + d.str();
  }
  const std::string& device_name() const { return device_name_; }
  const std::string& device_detail() const { return device_detail_; }

  // A view of h where the step runs (on the GPU: a new device copy of h).
  TensorView place(const HostTensor& h) {
    const TensorView v = h.view();
    if (!gpu_) return v;
    void* d = allocate(h.nbytes());
#if KVATTN_WITH_CUDA
    cuda_check(cudaMemcpy(d, h.data(), h.nbytes(), cudaMemcpyHostToDevice), "cudaMemcpy to the GPU");
#endif
    return TensorView(d, v.dtype(), v.ndim(), v.shape(), v.strides(), kvattn::Device::cuda(device_));
  }
  // Copies `bytes` bytes at `offset` of a placed view back into its host tensor (no-op on the CPU).
  void fetch(const TensorView& placed, HostTensor& h, size_t offset = 0, size_t bytes = SIZE_MAX) const {
    if (!gpu_) return;
    bytes = std::min(bytes, h.nbytes() - offset);
#if KVATTN_WITH_CUDA
    cuda_check(cudaMemcpy(static_cast<char*>(h.data()) + offset, static_cast<const char*>(placed.data()) + offset,
                          bytes, cudaMemcpyDeviceToHost),
               "cudaMemcpy from the GPU");
#endif
  }
  // The workspace of a plan/run wrapper: none on the CPU, `bytes` of device memory on the GPU.
  TensorView workspace(int64_t bytes) {
    if (!gpu_) return {};
    return TensorView(allocate(size_t(bytes)), DType::u8, {bytes}, kvattn::Device::cuda(device_));
  }

  // One warm-up run, then `reps` timed runs: CUDA events on the default stream on the GPU (where
  // every call of the step is issued), the steady clock on the CPU.
  template <class F>
  PhaseTiming time(F&& fn, int reps) {
    PhaseTiming t;
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    sync("the warm-up run");
    t.first_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!gpu_) {
      t.timing = time_runs(fn, 0, reps);
      return t;
    }
#if KVATTN_WITH_CUDA
    struct Events {
      std::vector<cudaEvent_t> ev;
      ~Events() {
        for (cudaEvent_t e : ev) cudaEventDestroy(e);
      }
    } events;
    for (int i = 0; i < 2 * reps; ++i) {
      cudaEvent_t e = nullptr;
      cuda_check(cudaEventCreate(&e), "cudaEventCreate");
      events.ev.push_back(e);
    }
    for (int i = 0; i < reps; ++i) {
      cuda_check(cudaEventRecord(events.ev[size_t(2 * i)], nullptr), "cudaEventRecord");
      fn();
      cuda_check(cudaEventRecord(events.ev[size_t(2 * i + 1)], nullptr), "cudaEventRecord");
    }
    sync("the timed runs");
    std::vector<double> s;
    for (int i = 0; i < reps; ++i) {
      float ms = 0;
      cuda_check(cudaEventElapsedTime(&ms, events.ev[size_t(2 * i)], events.ev[size_t(2 * i + 1)]),
                 "cudaEventElapsedTime");
      s.push_back(double(ms) * 1e-3);
    }
    t.timing = summarize(std::move(s));
#endif
    return t;
  }

 private:
  void* allocate(size_t bytes) {
#if KVATTN_WITH_CUDA
    void* d = nullptr;
    cuda_check(cudaMalloc(&d, std::max<size_t>(bytes, 1)), "cudaMalloc of " + std::to_string(bytes) + " bytes");
    owned_.emplace_back(d, [](void* q) { cudaFree(q); });
    return d;
#else
    throw kvattn::Error("no CUDA backend in this build");
#endif
  }
  void sync(const char* what) const {
    if (!gpu_) return;
#if KVATTN_WITH_CUDA
    cuda_check(cudaGetLastError(), std::string("a launch before ") + what);
    cuda_check(cudaDeviceSynchronize(), std::string("cudaDeviceSynchronize after ") + what);
#endif
  }

  static std::string cpu_text(int threads) {
    return "CPU (" + std::to_string(threads) + " thread" + (threads == 1 ? "" : "s") + ")";
  }
  bool gpu_ = false;
  int device_ = 0;
  std::string where_, cpu_where_, device_name_, device_detail_;
  std::vector<std::shared_ptr<void>> owned_;
};

// ---- checks -------------------------------------------------------------------------------------
struct PhaseResult {
  std::string phase;
  std::string ran_on;
  std::string work_text;  // what the phase processed, for the table
  std::string kernels;    // which kernels ran, where the library says (BatchDecode::kernel_family)
  PhaseTiming timing;
  double plan_s = -1;     // host time of plan() (-1: no plan), planned again
  double first_plan_s = -1;  // the first plan(): with the JIT's compile or disk-cache load on a GPU
  double work = 0;        // bytes or FLOPs per run
  std::string work_unit;  // "B" or "FLOP"
  std::string work_formula;
  int64_t rows_checked = 0;
  std::string checked;    // what was checked, for the footnote
  Comparison out_cmp, lse_cmp;
  bool checked_lse = false;
  bool ran = false;
  bool ok() const { return !ran || (out_cmp.ok && lse_cmp.ok); }
};

// A (request, query row within the request, head) triple; `request` indexes the phase's requests.
struct Sample {
  int64_t request, row, head;
};

// Up to n distinct samples: the first and last query row of the request with the most KV first
// (the longest split and the causal diagonal), then the first and last rows of the others in
// random order, then random rows.
std::vector<Sample> pick_samples(const std::vector<int64_t>& qo_len, const std::vector<int64_t>& kv_len, int n,
                                 Rng& rng) {
  std::vector<Sample> out;
  std::vector<int64_t> row0{0};  // flat index of (request, row, head): (row0[b] + row) * Hq + head
  for (int64_t l : qo_len) row0.push_back(row0.back() + l);
  const int64_t total = row0.back() * kNumQoHeads;
  std::unordered_set<int64_t> taken;
  auto claim = [&](const Sample& x) {  // true if x was not picked before
    return taken.insert((row0[size_t(x.request)] + x.row) * kNumQoHeads + x.head).second;
  };
  std::vector<int64_t> order(qo_len.size());
  std::iota(order.begin(), order.end(), 0);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[size_t(rng.uniform_int(0, int64_t(i) - 1))]);
  auto longest = std::max_element(order.begin(), order.end(),
                                  [&](int64_t a, int64_t b) { return kv_len[size_t(a)] < kv_len[size_t(b)]; });
  if (longest != order.end()) std::iter_swap(order.begin(), longest);
  const int64_t want = std::min<int64_t>(n, total);
  for (size_t i = 0; i < order.size() && int64_t(out.size()) < want; ++i) {
    const int64_t b = order[i];
    if (qo_len[size_t(b)] == 0) continue;
    Sample first{b, 0, rng.uniform_int(0, kNumQoHeads - 1)};
    Sample last{b, qo_len[size_t(b)] - 1, rng.uniform_int(0, kNumQoHeads - 1)};
    if (claim(first)) out.push_back(first);
    if (int64_t(out.size()) < want && claim(last)) out.push_back(last);
  }
  while (int64_t(out.size()) < want) {
    int64_t b = rng.uniform_int(0, int64_t(qo_len.size()) - 1);
    if (qo_len[size_t(b)] == 0) continue;
    Sample x{b, rng.uniform_int(0, qo_len[size_t(b)] - 1), rng.uniform_int(0, kNumQoHeads - 1)};
    if (claim(x)) out.push_back(x);
  }
  return out;
}

// Checks sampled rows of out / lse (q/out row q_row0[i] + row for the phase's request i = ids[i])
// against the float64 reference over the request's tokens 0 .. kv_len - 1, regenerated in logical
// order from KvValues (not read from the cache).
void check_attention(const Step& s, const std::vector<int>& ids, const std::vector<int64_t>& q_row0,
                     const std::vector<int64_t>& qo_len, std::vector<Sample> samples, const HostTensor& q,
                     const HostTensor& out, const HostTensor& lse, bool causal, PhaseResult& r) {
  const int group = kNumQoHeads / kNumKvHeads;
  std::sort(samples.begin(), samples.end(), [&](const Sample& a, const Sample& b) {
    return std::pair(a.request, a.head / group) < std::pair(b.request, b.head / group);
  });
  HostTensor k, v;  // [kv_len, 1, D]: one KV head of one request, rebuilt when either changes
  int64_t built_request = -1, built_head = -1;
  for (const Sample& smp : samples) {
    const int b = ids[size_t(smp.request)];
    const int64_t kv_len = s.req[size_t(b)].kv_len();
    const int kv_head = int(smp.head) / group;
    if (built_request != smp.request || built_head != kv_head) {
      k = HostTensor(kDType, {kv_len, 1, kHeadDim});
      v = HostTensor(kDType, {kv_len, 1, kHeadDim});
      parallel_for(kv_len, [&](int64_t t) {
        s.values.row(b, t, 0, kv_head, k.data_as<uint16_t>() + t * kHeadDim);
        s.values.row(b, t, 1, kv_head, v.data_as<uint16_t>() + t * kHeadDim);
      });
      built_request = smp.request;
      built_head = kv_head;
    }
    ReferenceQuery rq;
    rq.q = &q;
    rq.q_row = q_row0[size_t(smp.request)] + smp.row;
    rq.qo_head = int(smp.head);
    rq.k = &k;
    rq.v = &v;
    rq.kv_row0 = 0;
    rq.kv_len = kv_len;
    rq.kv_head = 0;
    rq.q_pos = kv_len - qo_len[size_t(smp.request)] + smp.row;
    rq.causal = causal;
    rq.sm_scale = 1.0 / std::sqrt(double(kHeadDim));
    const ReferenceRow want = attention_reference(rq);
    const int64_t base = (rq.q_row * kNumQoHeads + smp.head) * kHeadDim;
    for (int64_t e = 0; e < kHeadDim; ++e) compare(out.get(base + e), want.o[size_t(e)], kOutAtol, kOutRtol, r.out_cmp);
    compare(lse.get(rq.q_row * kNumQoHeads + smp.head), want.lse, kLseAtol, kLseRtol, r.lse_cmp);
    ++r.rows_checked;
  }
  r.checked_lse = true;
}

template <class F>
double seconds_of(F&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t sum_kv(const Step& s, const std::vector<int>& ids) {
  int64_t n = 0;
  for (int b : ids) n += s.req[size_t(b)].kv_len();
  return n;
}

// ---- the three phases ---------------------------------------------------------------------------
// 1. Every request's new tokens' K and V into the cache.
PhaseResult run_append(Step& s, Placement& where, TensorView& cache, int reps) {
  PhaseResult r;
  r.phase = "append_paged_kv_cache";
  r.ran = true;
  std::vector<int> all(s.req.size());
  std::iota(all.begin(), all.end(), 0);
  std::vector<int32_t> bi, pos;
  for (int b : all)
    for (int64_t t = s.req[size_t(b)].cached; t < s.req[size_t(b)].kv_len(); ++t) {
      bi.push_back(b);
      pos.push_back(int32_t(t));
    }
  const int64_t nnz = int64_t(bi.size());
  HostTensor k(kDType, {nnz, kNumKvHeads, kHeadDim}), v(kDType, {nnz, kNumKvHeads, kHeadDim});
  parallel_for(nnz, [&](int64_t i) {
    for (int h = 0; h < kNumKvHeads; ++h) {
      s.values.row(bi[size_t(i)], pos[size_t(i)], 0, h, k.data_as<uint16_t>() + i * kRowElems + h * kHeadDim);
      s.values.row(bi[size_t(i)], pos[size_t(i)], 1, h, v.data_as<uint16_t>() + i * kRowElems + h * kHeadDim);
    }
  });
  const HostTensor bi_t = int32_tensor(bi), pos_t = int32_tensor(pos);
  const HostPageTable table = page_table_of(s, all);
  // On a CUDA cache every index array lives on the GPU too (ops.h).
  const TensorView kd = where.place(k), vd = where.place(v), bid = where.place(bi_t), posd = where.place(pos_t);
  const kvattn::PageTable td{where.place(table.indptr), where.place(table.indices), where.place(table.last_page_len)};
  const auto kv = kvattn::PagedKVCache::combined(cache, kvattn::KVLayout::NHD);
  r.ran_on = where.describe(kd.device());
  r.work_text = format_count(nnz) + " new tokens of " + std::to_string(all.size()) + " req";
  // Writing the same rows again is idempotent, so the op is timed like the others.
  r.timing = where.time([&] { kvattn::append_paged_kv_cache(kd, vd, bid, posd, kv, td); }, reps);
  r.work = 2.0 * 2.0 * double(nnz) * kRowElems * kBytes;
  r.work_unit = "B";
  r.work_formula = "new tokens x 2 (K, V) x Hkv x D x 2 B, read once and written once";

  // The pages that received tokens come back from the GPU; every appended element must be in its
  // slot bit for bit (the copy has no arithmetic), drawn again from KvValues.
  std::vector<int32_t> touched;
  for (int b : all)
    for (int64_t t = s.req[size_t(b)].cached; t < s.req[size_t(b)].kv_len(); ++t)
      if (t == s.req[size_t(b)].cached || t % kPageSize == 0) touched.push_back(s.pages.page_of(b, t));
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  for (int32_t p : touched)
    where.fetch(cache, s.cache, size_t(p) * kPageElems * sizeof(uint16_t), kPageElems * sizeof(uint16_t));
  std::vector<Comparison> per_row(static_cast<size_t>(nnz));
  parallel_for(nnz, [&](int64_t i) {
    uint16_t want[kHeadDim];
    const int b = bi[size_t(i)];
    const int64_t t = pos[size_t(i)];
    for (int kvi = 0; kvi < 2; ++kvi)
      for (int h = 0; h < kNumKvHeads; ++h) {
        s.values.row(b, t, kvi, h, want);
        const uint16_t* got = s.slot(s.pages.page_of(b, t), kvi, s.pages.slot_of(t), h);
        for (int e = 0; e < kHeadDim; ++e)
          if (got[e] != want[e])
            compare(bf16_to_float(got[e]), bf16_to_float(want[e]), 0.0, 0.0, per_row[size_t(i)]);
      }
  });
  for (const Comparison& c : per_row) {
    r.out_cmp.ok = r.out_cmp.ok && c.ok;
    r.out_cmp.max_abs_error = std::max(r.out_cmp.max_abs_error, c.max_abs_error);
  }
  r.rows_checked = nnz;
  r.checked = "every element of the " + format_count(nnz) + " appended tokens (K and V), bit for bit, in the cache";
  return r;
}

// 2. The decoding requests' one query each over their KV (new token included).
PhaseResult run_decode(const Step& s, Placement& where, const TensorView& cache, int reps, int samples, Rng& rng) {
  PhaseResult r;
  r.phase = "BatchDecode";
  const std::vector<int> ids = s.ids(Kind::decode);
  const int64_t B = int64_t(ids.size());
  if (B == 0) return r;
  r.ran = true;
  HostTensor q(kDType, {B, kNumQoHeads, kHeadDim});
  q.fill_uniform(rng, -kInputBound, kInputBound);
  HostTensor out(kDType, {B, kNumQoHeads, kHeadDim}), lse(DType::f32, {B, kNumQoHeads});
  out.fill(std::numeric_limits<double>::quiet_NaN());  // poisoned: unwritten rows show up
  lse.fill(std::numeric_limits<double>::quiet_NaN());

  const HostPageTable table = page_table_of(s, ids);
  kvattn::BatchDecodePlan plan;
  static_cast<kvattn::AttentionShape&>(plan) = attention_shape(/*causal=*/false);
  plan.page_table = table.view();
  plan.page_size = kPageSize;
  kvattn::BatchDecode decode(where.workspace(int64_t(256) << 20), kvattn::KVLayout::NHD);
  r.first_plan_s = seconds_of([&] { decode.plan(plan); });  // the first plan() compiles or loads the kernels
  r.plan_s = seconds_of([&] { decode.plan(plan); });
  r.kernels = std::string(decode.kernel_family());

  const TensorView qd = where.place(q), od = where.place(out), ld = where.place(lse);
  const auto kv = kvattn::PagedKVCache::combined(cache, kvattn::KVLayout::NHD);
  r.ran_on = where.describe(qd.device());
  const int64_t kv_tokens = sum_kv(s, ids);
  r.work_text = std::to_string(B) + " req, " + format_count(kv_tokens) + " KV tok";
  r.timing = where.time([&] { decode.run(qd, kv, od, ld); }, reps);
  decode.check_errors();
  where.fetch(od, out);
  where.fetch(ld, lse);
  r.work = double(kv_tokens) * 2 * kRowElems * kBytes;
  r.work_unit = "B";
  r.work_formula = "K/V bytes read: sum(kv_len) x 2 (K, V) x Hkv x D x 2 B";

  std::vector<int64_t> q_row0(static_cast<size_t>(B)), qo_len(static_cast<size_t>(B), 1), kv_len;
  std::iota(q_row0.begin(), q_row0.end(), 0);
  for (int b : ids) kv_len.push_back(s.req[size_t(b)].kv_len());
  check_attention(s, ids, q_row0, qo_len, pick_samples(qo_len, kv_len, samples, rng), q, out, lse,
                  /*causal=*/false, r);
  return r;
}

// 3. The appending and prefilling requests' new queries over their KV, causal, bottom-right.
PhaseResult run_prefill(const Step& s, Placement& where, const TensorView& cache, int reps, int samples, Rng& rng) {
  PhaseResult r;
  r.phase = "BatchPrefill";
  std::vector<int> ids = s.ids(Kind::append);
  for (int b : s.ids(Kind::prefill)) ids.push_back(b);
  const int64_t B = int64_t(ids.size());
  if (B == 0) return r;
  r.ran = true;
  std::vector<int32_t> qo_indptr{0};
  std::vector<int64_t> q_row0, qo_len, kv_len;
  double pairs = 0;  // exactly the (query, key) pairs the causal mask lets through
  for (int b : ids) {
    const Request& rq = s.req[size_t(b)];
    q_row0.push_back(qo_indptr.back());
    qo_len.push_back(rq.fresh);
    kv_len.push_back(rq.kv_len());
    qo_indptr.push_back(qo_indptr.back() + int32_t(rq.fresh));
    // query i of a request with qo_len n and kv_len L sees L - n + i + 1 keys
    const double n = double(rq.fresh), L = double(rq.kv_len());
    pairs += n * (L - n) + n * (n + 1) / 2;
  }
  const int64_t nnz = qo_indptr.back();
  HostTensor q(kDType, {nnz, kNumQoHeads, kHeadDim});
  q.fill_uniform(rng, -kInputBound, kInputBound);
  HostTensor out(kDType, {nnz, kNumQoHeads, kHeadDim}), lse(DType::f32, {nnz, kNumQoHeads});
  out.fill(std::numeric_limits<double>::quiet_NaN());
  lse.fill(std::numeric_limits<double>::quiet_NaN());

  const HostTensor qo_indptr_t = int32_tensor(qo_indptr);
  const HostPageTable table = page_table_of(s, ids);
  kvattn::BatchPrefillPlan plan;
  static_cast<kvattn::AttentionShape&>(plan) = attention_shape(/*causal=*/true);
  plan.qo_indptr = qo_indptr_t.view();
  plan.page_table = table.view();
  plan.page_size = kPageSize;
  kvattn::BatchPrefill prefill(where.workspace(int64_t(512) << 20), kvattn::KVLayout::NHD);
  r.first_plan_s = seconds_of([&] { prefill.plan(plan); });  // the first plan() compiles or loads the kernels
  r.plan_s = seconds_of([&] { prefill.plan(plan); });

  const TensorView qd = where.place(q), od = where.place(out), ld = where.place(lse);
  const auto kv = kvattn::PagedKVCache::combined(cache, kvattn::KVLayout::NHD);
  r.ran_on = where.describe(qd.device());
  r.work_text = std::to_string(B) + " req, " + format_count(nnz) + " q tok, " + format_count(sum_kv(s, ids)) +
                " KV tok, causal";
  r.timing = where.time([&] { prefill.run(qd, kv, od, ld); }, reps);
  prefill.check_errors();
  where.fetch(od, out);
  where.fetch(ld, lse);
  r.work = 4.0 * pairs * kNumQoHeads * kHeadDim;
  r.work_unit = "FLOP";
  r.work_formula = "visible (query, key) pairs x 4 x D x Hq (QK^T and PV, 2 FLOP per multiply-add)";
  check_attention(s, ids, q_row0, qo_len, pick_samples(qo_len, kv_len, samples, rng), q, out, lse,
                  /*causal=*/true, r);
  return r;
}

// ---- output -------------------------------------------------------------------------------------
std::string error_cell(const PhaseResult& r) {
  if (!r.ran) return "-";
  char buf[64];
  if (r.out_cmp.max_abs_error == 0)
    std::snprintf(buf, sizeof buf, "0 (exact)");
  else if (std::isinf(r.out_cmp.max_abs_error))
    std::snprintf(buf, sizeof buf, "NaN/inf");
  else
    std::snprintf(buf, sizeof buf, "%.2e", r.out_cmp.max_abs_error);
  return buf;
}

std::string rate_text(const PhaseResult& r) {
  if (!r.ran || r.timing.timing.median <= 0) return "-";
  return format_rate(r.work / r.timing.timing.median, r.work_unit == "B" ? "B" : "FLOP");
}

void print_table(const std::vector<PhaseResult>& results) {
  std::vector<std::vector<std::string>> rows{{"phase", "ran on", "work", "time", "throughput", "max error", "check"}};
  int i = 0;
  for (const auto& r : results) {
    ++i;
    if (!r.ran) {
      rows.push_back({std::to_string(i) + ". " + r.phase, "not run", "no requests of this kind", "-", "-", "-", "-"});
      continue;
    }
    rows.push_back({std::to_string(i) + ". " + r.phase, r.ran_on, r.work_text, format_seconds(r.timing.timing.median),
                    rate_text(r), error_cell(r), r.ok() ? "pass" : "FAIL"});
  }
  std::vector<size_t> w(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) w[c] = std::max(w[c], row[c].size());
  auto line = [&](const std::vector<std::string>& row) {
    std::string s;
    for (size_t c = 0; c < row.size(); ++c) {
      const bool right = c == 3 || c == 4;  // numbers right-aligned, text left-aligned
      std::string pad(w[c] - row[c].size(), ' ');
      s += (c ? " | " : "") + (right ? pad + row[c] : row[c] + (c + 1 < row.size() ? pad : ""));
    }
    std::cout << s << "\n";
  };
  line(rows[0]);
  std::string rule;
  for (size_t c = 0; c < w.size(); ++c) rule += (c ? "-+-" : "") + std::string(w[c], '-');
  std::cout << rule << "\n";
  for (size_t r = 1; r < rows.size(); ++r) line(rows[r]);
}

nlohmann::json to_json(const PhaseResult& r) {
  nlohmann::json j;
  j["phase"] = r.phase;
  j["ran"] = r.ran;
  if (!r.ran) return j;
  j["ran_on"] = r.ran_on;
  j["work_text"] = r.work_text;
  if (!r.kernels.empty()) j["kernel_family"] = r.kernels;
  j["time_s"] = {{"median", r.timing.timing.median}, {"min", r.timing.timing.min}, {"max", r.timing.timing.max},
                 {"runs", r.timing.timing.seconds}, {"first_run", r.timing.first_s}};
  if (r.plan_s >= 0) j["plan_s"] = {{"first", r.first_plan_s}, {"again", r.plan_s}};
  j["work"] = {{"amount", r.work}, {"unit", r.work_unit}, {"formula", r.work_formula}};
  j["throughput"] = {{"value", r.work / r.timing.timing.median}, {"unit", r.work_unit + "/s"}};
  j["check"] = {{"rows", r.rows_checked}, {"what", r.checked}, {"max_abs_error", r.out_cmp.max_abs_error},
                {"passed", r.ok()}};
  if (r.checked_lse) {
    j["check"]["lse_max_abs_error"] = r.lse_cmp.max_abs_error;
    j["check"]["tolerance"] = {{"out_atol", kOutAtol}, {"out_rtol", kOutRtol},
                               {"lse_atol", kLseAtol}, {"lse_rtol", kLseRtol}};
  } else {
    j["check"]["tolerance"] = "bit-exact";
  }
  return j;
}

std::string range_text(const std::vector<int64_t>& v) {
  if (v.empty()) return "-";
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return *lo == *hi ? format_count(*lo) : format_count(*lo) + " .. " + format_count(*hi);
}

void print_requests(const Step& s) {
  for (Kind k : {Kind::decode, Kind::append, Kind::prefill}) {
    std::vector<int64_t> cached, fresh;
    int64_t kv = 0;
    for (const Request& r : s.req)
      if (r.kind == k) {
        cached.push_back(r.cached);
        fresh.push_back(r.fresh);
        kv += r.kv_len();
      }
    if (cached.empty()) continue;
    char head[64];
    std::snprintf(head, sizeof head, "    %4zu %-10s ", cached.size(),
                  k == Kind::decode ? "decoding" : k == Kind::append ? "appending" : "prefilling");
    std::cout << head;
    if (k == Kind::decode) {
      std::vector<int64_t> rest(cached.begin() + 1, cached.end());
      std::cout << "1 new token each on " << format_count(cached[0]) << " cached tokens (request 0)";
      if (!rest.empty()) std::cout << " and " << range_text(rest) << " (the others)";
    } else if (k == Kind::append) {
      std::cout << "a chunk of " << range_text(fresh) << " new tokens on " << range_text(cached) << " cached";
    } else {
      std::cout << "a prompt of " << range_text(fresh) << " new tokens, nothing cached";
    }
    std::cout << "; KV after the step " << format_count(kv) << " tokens\n";
  }
}

StepShape resolve_shape(const DemoOptions& o, bool gpu) {
  KVATTN_CHECK(o.size == "auto" || o.size == "small" || o.size == "full", "--size must be auto, small or full, got '",
               o.size, "'");
  StepShape sh = o.size == "full" || (o.size == "auto" && gpu) ? kFullShape : kSmallShape;
  if (o.decode >= 0) sh.decode = o.decode;
  if (o.append >= 0) sh.append = o.append;
  if (o.prefill >= 0) sh.prefill = o.prefill;
  if (o.long_len >= 0) sh.long_len = o.long_len;
  if (o.max_len >= 0) {
    sh.max_len = o.max_len;
    sh.min_len = std::min(sh.min_len, sh.max_len);
  }
  KVATTN_CHECK(sh.decode + sh.append + sh.prefill >= 1, "the step needs at least one request (--decode, --append, "
               "--prefill are all 0)");
  KVATTN_CHECK(sh.max_len >= 1, "--max-len must be at least 1, got ", sh.max_len);
  KVATTN_CHECK(sh.long_len <= kvattn::kMaxKVLen / 2 && sh.max_len <= kvattn::kMaxKVLen / 2,
               "--long-len and --max-len must be at most ", kvattn::kMaxKVLen / 2);
  return sh;
}

// Why the CUDA runtime sees no device, as "; cudaGetDeviceCount: <error>" (empty if it sees one).
std::string no_device_reason() {
#if KVATTN_WITH_CUDA
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("; cudaGetDeviceCount: ") + cudaGetErrorName(e) + ", " + cudaGetErrorString(e);
  if (n == 0) return "; cudaGetDeviceCount: 0 devices";
#endif
  return "";
}

std::string format_bytes(double b) {
  char buf[32];
  if (b >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GB", b * 1e-9);
  else
    std::snprintf(buf, sizeof buf, "%.1f MB", b * 1e-6);
  return buf;
}

void validate_options(const DemoOptions& o) {
  KVATTN_CHECK(o.backend == "auto" || o.backend == "cpu" || o.backend == "cuda",
               "--backend must be auto, cpu or cuda, got '", o.backend, "'");
  KVATTN_CHECK(o.reps >= 0, "--reps must be >= 0, got ", o.reps);
  KVATTN_CHECK(o.samples >= 1, "--samples must be at least 1, got ", o.samples);
  KVATTN_CHECK(o.threads >= 0, "--threads must be >= 0, got ", o.threads);
}

void run_demo(const DemoOptions& o) {
  validate_options(o);
  // Must happen before the first kvattn call that starts the CPU thread pool.
  if (o.threads > 0) setenv("KVATTN_NUM_THREADS", std::to_string(o.threads).c_str(), 1);
  const BackendInfo backends = query_backends();
  const auto wall0 = std::chrono::steady_clock::now();

  // Where the step runs, and the sentence that says so (nothing here claims a device that the
  // step's tensors do not live on).
  const bool gpu = o.backend == "cuda" || (o.backend == "auto" && backends.gpu_available());
  if (gpu && !backends.gpu_available())
    throw kvattn::Error("--backend cuda: no CUDA device can run the step (CUDA backend: " + backends.cuda_status + ")");
  const StepShape shape = resolve_shape(o, gpu);
  const int reps = o.reps > 0 ? o.reps : gpu ? 20 : 3;
#if KVATTN_WITH_CUDA
  Placement where = gpu ? Placement::gpu(0, backends.cpu_threads) : Placement::cpu(backends.cpu_threads);
#else
  Placement where = Placement::cpu(backends.cpu_threads);
#endif
  std::string note;
  const bool small = o.size == "small" || (o.size == "auto" && !gpu);
  if (gpu) {
    note = "CUDA device found: every phase runs on " + where.where() + "; inputs are made and outputs checked on the host";
  } else if (o.backend == "cpu") {
    note = "--backend cpu: running on the CPU backend" +
           std::string(backends.gpu_available() ? " (a CUDA device is present and not used)" : "");
  } else if (!backends.cuda_built) {
    note = "no CUDA backend in this build: running on the CPU backend";
  } else {
    note = "no CUDA device: running on the CPU backend (this build has the CUDA backend" + no_device_reason() + ")";
  }
  if (!gpu && small) note += "; a smaller batch than on a GPU (--size full for the GPU's)";

  Rng rng(o.seed);
  Rng step_rng = rng.fork(), decode_rng = rng.fork(), prefill_rng = rng.fork();
  Step s = make_step(shape, o.seed, step_rng);
  if (!o.json) {
    std::cout << "kvattn " << kvattn::kVersion << " demo: one serving step of a Llama-3-8B-shaped batch\n"
              << note << ".\n";
    if (gpu) std::cout << "  device: " << where.device_detail() << "\n";
    std::cout << "  attention: " << kNumQoHeads << " query heads / " << kNumKvHeads << " KV heads, head dim "
              << kHeadDim << ", bf16 in and out, f32 LSE\n"
              << "  KV cache: paged, NHD, page " << kPageSize << ", K and V in one 5-D tensor; "
              << format_count(s.pages.num_pages) << " pages (" << format_bytes(double(s.cache.nbytes()))
              << "), handed out in random order, 25% spare; free pages and unwritten slots NaN\n";
    std::cout << "  requests: " << s.req.size() << " (seed " << o.seed << ")\n";
    print_requests(s);
    std::cout << "\n" << std::flush;
  }

  std::vector<PhaseResult> results;
  {
    TensorView cache = where.place(s.cache);  // the cache where the step runs (a GPU copy on a GPU)
    results.push_back(run_append(s, where, cache, reps));
    results.push_back(run_decode(s, where, cache, reps, o.samples, decode_rng));
    results.push_back(run_prefill(s, where, cache, reps, o.samples, prefill_rng));
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  const bool ok = std::all_of(results.begin(), results.end(), [](const PhaseResult& r) { return r.ok(); });

  if (o.json) {
    nlohmann::json j;
    j["version"] = kvattn::kVersion;
    j["backend"] = gpu ? "cuda" : "cpu";
    if (gpu) j["device"] = where.device_detail();
    j["threads"] = backends.cpu_threads;
    j["note"] = note;
    j["seed"] = o.seed;
    j["shape"] = {{"num_qo_heads", kNumQoHeads}, {"num_kv_heads", kNumKvHeads}, {"head_dim", kHeadDim},
                  {"page_size", kPageSize},      {"dtype", "bf16"},             {"kv_layout", "NHD"},
                  {"num_pages", s.pages.num_pages}};
    j["requests"] = nlohmann::json::array();
    for (const Request& r : s.req) j["requests"].push_back({{"kind", kind_name(r.kind)}, {"cached", r.cached}, {"new", r.fresh}});
    j["reps"] = reps;
    j["results"] = nlohmann::json::array();
    for (const auto& r : results) j["results"].push_back(to_json(r));
    j["passed"] = ok;
    j["wall_s"] = wall;
    std::cout << j.dump(2) << "\n";
  } else {
    print_table(results);
    const PhaseResult &ap = results[0], &de = results[1], &pf = results[2];
    std::cout << "\ntime: median of " << reps << (reps == 1 ? " run" : " runs") << " after one warm-up run, "
              << (gpu ? "CUDA events on the default stream" : "steady clock") << "; plan() is host time, apart\n";
    if (gpu)
      std::cout << "  a kernel's first use compiles it with NVRTC or loads it from the JIT's disk cache: in the\n"
                << "  first plan() of BatchDecode and BatchPrefill, in the warm-up run of the append\n";
    std::cout << "  warm-up run:";
    for (const auto& r : results)
      if (r.ran) std::cout << " " << r.phase << " " << format_seconds(r.timing.first_s) << ";";
    std::cout << "\n  plan(), first / again:";
    for (const auto& r : results)
      if (r.plan_s >= 0)
        std::cout << " " << r.phase << " " << format_seconds(r.first_plan_s) << " / " << format_seconds(r.plan_s) << ";";
    std::cout << "\nthroughput:\n  append: " << ap.work_formula << "\n";
    if (de.ran) std::cout << "  decode: " << de.work_formula << "\n";
    if (pf.ran) std::cout << "  prefill: " << pf.work_formula << "\n";
    if (de.ran && gpu)
      std::cout << "BatchDecode ran on its \"" << de.kernels << "\" kernels (BatchDecode::kernel_family())\n";
    std::cout << "max error: largest |kvattn - float64 reference| over " << de.rows_checked << " decode and "
              << pf.rows_checked << " prefill samples (request, row, head), the reference computed on the host\n"
              << "  from each request's tokens in logical order; tolerance " << kOutAtol << " + " << kOutRtol
              << " |ref| for the bf16 outputs, " << kLseAtol << " + " << kLseRtol << " |ref| for the LSE;\n"
              << "  append: " << ap.checked << "\n"
              << (ok ? "All checks passed" : "CHECK FAILED") << " (" << format_seconds(wall)
              << " in total, with setup and checks).\n";
  }
  if (!ok) {
    if (o.json) std::cerr << "kvattn demo: check against the reference FAILED\n";
    throw CLI::RuntimeError(1);
  }
}

}  // namespace
}  // namespace kvattn_cli

void register_demo_command(CLI::App& app) {
  auto opts = std::make_shared<kvattn_cli::DemoOptions>();
  auto* cmd = app.add_subcommand(
      "demo", "Run one serving step of a Llama-3-8B-shaped batch, check it, print a timing table");
  cmd->footer(
      "A continuous-batching step: decoding requests (one of --long-len cached tokens, the others\n"
      "log-uniform up to --max-len), requests appending a chunk of their prompt, and fresh prompts,\n"
      "in a paged KV cache (bf16, NHD, page 16, pages scattered). It runs append_paged_kv_cache of\n"
      "every new token, BatchDecode and a causal BatchPrefill over the paged cache, on the GPU when\n"
      "there is one (all three) and on the CPU backend otherwise, on a smaller batch. The append is\n"
      "checked bit for bit, samples of the attention outputs and LSEs against a float64 reference.\n"
      "Exit status: 0 all checks passed, 1 a check failed, 2 a kvattn or CUDA error.");
  cmd->add_option("--backend", opts->backend, "auto (the GPU when there is one), cpu or cuda")->capture_default_str();
  cmd->add_option("--size", opts->size, "auto (full on a GPU, small on the CPU), small (30 requests) or full (292)")
      ->capture_default_str();
  cmd->add_option("--decode", opts->decode, "Decoding requests (default: from --size)");
  cmd->add_option("--append", opts->append, "Requests appending a chunk (default: from --size)");
  cmd->add_option("--prefill", opts->prefill, "Fresh prompts (default: from --size)");
  cmd->add_option("--long-len", opts->long_len, "Cached tokens of decode request 0, 0: none longer (default: from --size)");
  cmd->add_option("--max-len", opts->max_len, "Most cached tokens of the other requests (default: from --size)");
  cmd->add_option("--seed", opts->seed, "Random seed for lengths, pages and data")->capture_default_str();
  cmd->add_option("--threads", opts->threads, "CPU threads (0: KVATTN_NUM_THREADS, else all cores)")->capture_default_str();
  cmd->add_option("--reps", opts->reps, "Timed runs per phase, the median is reported (0: 20 on the GPU, 3 on the CPU)")
      ->capture_default_str();
  cmd->add_option("--samples", opts->samples, "(request, row, head) samples checked per attention phase")
      ->capture_default_str();
  cmd->add_flag("--json", opts->json, "Print the results as JSON instead of a table");
  cmd->callback([opts] { kvattn_cli::run_demo(*opts); });
}
