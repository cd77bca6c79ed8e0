// `kvattn demo`: one serving step with Llama-3-8B attention shapes, run with no arguments.
//
// A batch of requests with skewed lengths (one long, the rest short) lives in a paged KV cache
// (bf16, NHD, page 16, pages scattered over a pool with free pages poisoned with NaN). The demo
// runs
//   1. BatchDecode: one new query token per request over its cached tokens;
//   2. append_paged_kv_cache: writes each request's next `--append-len` tokens into the cache;
//   3. BatchPrefill (append): those tokens' queries over the whole request, causal, bottom-right;
// times each (median of --reps runs after a warm-up), and checks a sample of output rows (and
// their LSE) against a float64 reference computed here from the requests' tokens in logical order
// (demo_reference.cpp), so the page table, the append and the attention are all checked.
// It prints a table (or --json) and exits 1 if any check fails.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
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

#include "cuda/runtime.h"
#endif

namespace kvattn_cli {
namespace {

using kvattn::DType;

// Llama-3-8B attention.
constexpr int kNumQoHeads = 32;
constexpr int kNumKvHeads = 8;
constexpr int kHeadDim = 128;
constexpr int kPageSize = 16;
constexpr DType kDType = DType::bf16;
constexpr double kBytes = 2.0;  // bytes per bf16 element

// bf16 inputs rounded once, f32 accumulation, bf16 output: the output's own rounding is 2^-9
// relative (~0.002 for |o| ~ 1); 1e-2 absolute plus 1e-2 relative leaves room for f32
// accumulation over thousands of keys while still catching a wrong page or a missed mask, which
// move outputs by O(0.1). LSE is f32 (no output rounding), so it gets a tighter bound.
constexpr double kOutAtol = 1e-2, kOutRtol = 1e-2;
constexpr double kLseAtol = 1e-3, kLseRtol = 1e-4;

// Inputs uniform in [-sqrt(3), sqrt(3)): unit variance, so logits q.k / sqrt(D) have unit variance.
const double kInputBound = std::sqrt(3.0);

struct DemoOptions {
  uint64_t seed = 2025;
  int batch = 8;
  int long_len = 2048;
  int short_min = 100;
  int short_max = 300;
  int append_len = 64;
  int threads = 0;  // 0: the library's default (KVATTN_NUM_THREADS, else all cores)
  int reps = 5;
  int samples = 128;
  bool json = false;
};

struct OpResult {
  std::string operation;
  std::string shape;
  Timing timing;
  double work = 0;          // bytes or FLOPs per run
  std::string work_unit;    // "B" or "FLOP"
  std::string work_formula;
  int64_t rows_checked = 0;
  Comparison out_cmp, lse_cmp;
  bool checked_lse = false;
  bool ok() const { return out_cmp.ok && lse_cmp.ok; }
};

// ---- the state of the step ----------------------------------------------------------------------
struct Batch {
  std::vector<int64_t> cached;    // tokens in the cache before the step (decode attends to these)
  std::vector<int64_t> capacity;  // after the append
  std::vector<int64_t> token_row0;  // row of token 0 of request b in the logical k / v
  PageAssignment pages;
  HostTensor k_logical, v_logical;  // [sum(capacity), Hkv, D]: every request's tokens, in order
  HostTensor cache;                 // [pages, 2, page_size, Hkv, D] (combined K/V, NHD)
  kvattn::PagedKVCache cache_view() const {
    return kvattn::PagedKVCache::combined(cache.view(), kvattn::KVLayout::NHD);
  }
  int64_t batch_size() const { return int64_t(cached.size()); }
};

// Byte address of token t (all heads) of request b in the cache, for K (kv = 0) or V (kv = 1).
uint16_t* cache_row(Batch& s, int64_t b, int64_t t, int kv) {
  const int64_t page = s.pages.page_of(b, t), slot = s.pages.slot_of(t);
  const int64_t row = ((page * 2 + kv) * kPageSize + slot);
  return s.cache.data_as<uint16_t>() + row * kNumKvHeads * kHeadDim;
}
const uint16_t* logical_row(const HostTensor& t, int64_t row) {
  return t.data_as<uint16_t>() + row * kNumKvHeads * kHeadDim;
}

Batch make_batch(const DemoOptions& o, Rng& rng) {
  Batch s;
  for (int b = 0; b < o.batch; ++b) {
    int64_t len = b == 0 ? o.long_len : rng.uniform_int(o.short_min, o.short_max);
    s.cached.push_back(len);
    s.capacity.push_back(len + o.append_len);
  }
  int64_t total = 0;
  for (int64_t c : s.capacity) {
    s.token_row0.push_back(total);
    total += c;
  }
  s.pages = assign_pages(s.capacity, kPageSize, rng, /*scatter=*/true, /*spare=*/0.25);

  s.k_logical = HostTensor(kDType, {total, kNumKvHeads, kHeadDim});
  s.v_logical = HostTensor(kDType, {total, kNumKvHeads, kHeadDim});
  s.k_logical.fill_uniform(rng, -kInputBound, kInputBound);
  s.v_logical.fill_uniform(rng, -kInputBound, kInputBound);

  // Owned pages start with stale data (what a previous request left); free pages are poisoned,
  // so reading a page the table does not list shows up as NaN.
  s.cache = HostTensor(kDType, {s.pages.num_pages, 2, kPageSize, kNumKvHeads, kHeadDim});
  s.cache.fill_uniform(rng, -kInputBound, kInputBound);
  const int64_t page_elems = 2 * kPageSize * kNumKvHeads * kHeadDim;
  const uint16_t nan_bits = float_to_bf16(std::numeric_limits<float>::quiet_NaN());
  for (int32_t p : s.pages.unowned_pages())
    std::fill_n(s.cache.data_as<uint16_t>() + p * page_elems, page_elems, nan_bits);

  // The tokens already cached (the earlier prefill and decode steps), scattered by hand.
  const size_t row_bytes = size_t(kNumKvHeads) * kHeadDim * sizeof(uint16_t);
  for (int64_t b = 0; b < s.batch_size(); ++b)
    for (int64_t t = 0; t < s.cached[size_t(b)]; ++t) {
      std::memcpy(cache_row(s, b, t, 0), logical_row(s.k_logical, s.token_row0[size_t(b)] + t), row_bytes);
      std::memcpy(cache_row(s, b, t, 1), logical_row(s.v_logical, s.token_row0[size_t(b)] + t), row_bytes);
    }
  return s;
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

// Checks out / lse rows against the reference. A sample: (request, query row within the
// request, head) triples; q/out rows are q_row0[b] + i.
struct Sample {
  int64_t request, row, head;
};

void check_rows(const Batch& s, const std::vector<Sample>& samples, const HostTensor& q,
                const HostTensor& out, const HostTensor& lse, const std::vector<int64_t>& q_row0,
                const std::vector<int64_t>& kv_len, const std::vector<int64_t>& qo_len, bool causal,
                OpResult& r) {
  const int group = kNumQoHeads / kNumKvHeads;
  for (const Sample& smp : samples) {
    const size_t b = size_t(smp.request);
    ReferenceQuery rq;
    rq.q = &q;
    rq.q_row = q_row0[b] + smp.row;
    rq.qo_head = int(smp.head);
    rq.k = &s.k_logical;
    rq.v = &s.v_logical;
    rq.kv_row0 = s.token_row0[b];
    rq.kv_len = kv_len[b];
    rq.kv_head = int(smp.head) / group;
    rq.q_pos = kv_len[b] - qo_len[b] + smp.row;
    rq.causal = causal;
    rq.sm_scale = 1.0 / std::sqrt(double(kHeadDim));
    ReferenceRow want = attention_reference(rq);
    const int64_t base = (rq.q_row * kNumQoHeads + smp.head) * kHeadDim;
    for (int64_t e = 0; e < kHeadDim; ++e)
      compare(out.get(base + e), want.o[size_t(e)], kOutAtol, kOutRtol, r.out_cmp);
    compare(lse.get(rq.q_row * kNumQoHeads + smp.head), want.lse, kLseAtol, kLseRtol, r.lse_cmp);
    ++r.rows_checked;
  }
  r.checked_lse = true;
}

// Up to n distinct samples: for every request its first and last query row (so the longest
// request and the causal diagonal are always covered), then random ones.
std::vector<Sample> pick_samples(const std::vector<int64_t>& qo_len, int n, Rng& rng) {
  std::vector<Sample> out;
  std::vector<int64_t> row0{0};  // flat index of (request, row, head): (row0[b] + row) * Hq + head
  for (int64_t l : qo_len) row0.push_back(row0.back() + l);
  const int64_t total = row0.back() * kNumQoHeads;
  std::unordered_set<int64_t> taken;
  auto claim = [&](const Sample& x) {  // true if x was not picked before
    return taken.insert((row0[size_t(x.request)] + x.row) * kNumQoHeads + x.head).second;
  };
  const int64_t want = std::min<int64_t>(n, total);
  for (size_t b = 0; b < qo_len.size() && int64_t(out.size()) < want; ++b) {
    if (qo_len[b] == 0) continue;
    Sample first{int64_t(b), 0, rng.uniform_int(0, kNumQoHeads - 1)};
    Sample last{int64_t(b), qo_len[b] - 1, rng.uniform_int(0, kNumQoHeads - 1)};
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

std::string lengths_summary(const std::vector<int64_t>& len) {
  std::ostringstream os;
  int64_t total = std::accumulate(len.begin(), len.end(), int64_t(0));
  for (size_t i = 0; i < len.size(); ++i) {
    if (i == 12) {
      os << ", ... (" << len.size() - i << " more)";
      break;
    }
    os << (i ? ", " : "") << len[i];
  }
  os << "  (total " << format_count(total) << ")";
  return os.str();
}

// ---- the three operations -----------------------------------------------------------------------
#if KVATTN_WITH_CUDA
// The decode step on cuda:0: the cache, q and the poisoned outputs are copied there, the step is
// planned with a device workspace and timed (wall clock around run() and a synchronize), and the
// outputs come back for the same host-side check as the CPU path.
Timing run_decode_on_gpu(const Batch& s, const kvattn::BatchDecodePlan& plan, const HostTensor& q,
                         HostTensor& out, HostTensor& lse, int reps) {
  using kvattn::cuda::check;
  struct DeviceBuffer {
    void* ptr = nullptr;
    explicit DeviceBuffer(size_t n) { check(cudaMalloc(&ptr, n ? n : 1), "cudaMalloc"); }
    ~DeviceBuffer() { cudaFree(ptr); }
  };
  const auto dev = kvattn::Device::cuda(0);
  auto on_device = [&](const HostTensor& h, DeviceBuffer& d) {
    check(cudaMemcpy(d.ptr, h.data(), h.nbytes(), cudaMemcpyHostToDevice), "copying to the GPU");
    const kvattn::TensorView v = h.view();
    return kvattn::TensorView(d.ptr, v.dtype(), v.ndim(), v.shape(), v.strides(), dev);
  };
  DeviceBuffer cache(s.cache.nbytes()), dq(q.nbytes()), dout(out.nbytes()), dlse(lse.nbytes());
  const int64_t ws_bytes = int64_t(64) << 20;
  DeviceBuffer ws(static_cast<size_t>(ws_bytes));
  const auto kv = kvattn::PagedKVCache::combined(on_device(s.cache, cache), kvattn::KVLayout::NHD);
  const auto qv = on_device(q, dq), ov = on_device(out, dout), lv = on_device(lse, dlse);
  kvattn::BatchDecode decode(kvattn::TensorView(ws.ptr, DType::u8, {ws_bytes}, dev), kvattn::KVLayout::NHD);
  decode.plan(plan);
  Timing t = time_runs([&] {
    decode.run(qv, kv, ov, lv);
    check(cudaDeviceSynchronize(), "running the decode step");
  }, 1, reps);
  check(cudaMemcpy(out.data(), dout.ptr, out.nbytes(), cudaMemcpyDeviceToHost), "copying out back");
  check(cudaMemcpy(lse.data(), dlse.ptr, lse.nbytes(), cudaMemcpyDeviceToHost), "copying lse back");
  return t;
}
#endif

OpResult run_decode(const DemoOptions& o, Batch& s, Rng& rng, bool on_gpu) {
  const int64_t B = s.batch_size();
  HostTensor q(kDType, {B, kNumQoHeads, kHeadDim});
  q.fill_uniform(rng, -kInputBound, kInputBound);
  HostTensor out(kDType, {B, kNumQoHeads, kHeadDim});
  HostTensor lse(DType::f32, {B, kNumQoHeads});
  out.fill(std::numeric_limits<double>::quiet_NaN());  // poisoned: unwritten rows show up
  lse.fill(std::numeric_limits<double>::quiet_NaN());

  HostPageTable table = make_page_table(s.pages, s.cached);
  kvattn::BatchDecodePlan plan;
  static_cast<kvattn::AttentionShape&>(plan) = attention_shape(/*causal=*/false);
  plan.page_table = table.view();
  plan.page_size = kPageSize;
  OpResult r;
  r.operation = on_gpu ? "BatchDecode (cuda:0)" : "BatchDecode";
  int64_t kv_tokens = std::accumulate(s.cached.begin(), s.cached.end(), int64_t(0));
  r.shape = std::to_string(B) + " req x 1 q, " + format_count(kv_tokens) + " kv tok";
  if (on_gpu) {
#if KVATTN_WITH_CUDA
    r.timing = run_decode_on_gpu(s, plan, q, out, lse, o.reps);
#endif
  } else {
    kvattn::BatchDecode decode({}, kvattn::KVLayout::NHD);
    decode.plan(plan);
    const auto kv = s.cache_view();
    r.timing = time_runs([&] { decode.run(q.view(), kv, out.view(), lse.view()); }, 1, o.reps);
  }
  // Bytes that must move: every cached K and V element once, plus q and out.
  r.work = double(kv_tokens) * 2 * kNumKvHeads * kHeadDim * kBytes +
           2.0 * double(B) * kNumQoHeads * kHeadDim * kBytes;
  r.work_unit = "B";
  r.work_formula = "sum(kv_len) * 2 * Hkv * D * 2 B (K and V) + 2 * B * Hq * D * 2 B (q, out)";

  std::vector<int64_t> q_row0(static_cast<size_t>(B)), qo_len(static_cast<size_t>(B), 1);
  std::iota(q_row0.begin(), q_row0.end(), 0);
  check_rows(s, pick_samples(qo_len, o.samples, rng), q, out, lse, q_row0, s.cached, qo_len,
             /*causal=*/false, r);
  return r;
}

struct AppendData {
  HostTensor k, v;                     // [nnz, Hkv, D]
  HostTensor batch_indices, positions;  // [nnz] int32
  std::vector<int64_t> q_row0;          // first appended row of request b
};

AppendData make_append(const DemoOptions& o, const Batch& s) {
  AppendData a;
  const int64_t B = s.batch_size(), nnz = B * o.append_len;
  a.k = HostTensor(kDType, {nnz, kNumKvHeads, kHeadDim});
  a.v = HostTensor(kDType, {nnz, kNumKvHeads, kHeadDim});
  std::vector<int32_t> bi, pos;
  const size_t row_bytes = size_t(kNumKvHeads) * kHeadDim * sizeof(uint16_t);
  for (int64_t b = 0; b < B; ++b) {
    a.q_row0.push_back(int64_t(bi.size()));
    for (int64_t i = 0; i < o.append_len; ++i) {
      const int64_t t = s.cached[size_t(b)] + i, r = int64_t(bi.size());
      std::memcpy(a.k.data_as<uint16_t>() + r * kNumKvHeads * kHeadDim,
                  logical_row(s.k_logical, s.token_row0[size_t(b)] + t), row_bytes);
      std::memcpy(a.v.data_as<uint16_t>() + r * kNumKvHeads * kHeadDim,
                  logical_row(s.v_logical, s.token_row0[size_t(b)] + t), row_bytes);
      bi.push_back(int32_t(b));
      pos.push_back(int32_t(t));
    }
  }
  a.batch_indices = int32_tensor(bi);
  a.positions = int32_tensor(pos);
  return a;
}

OpResult run_append(const DemoOptions& o, Batch& s, const AppendData& a) {
  const int64_t B = s.batch_size(), nnz = a.k.shape()[0];
  HostPageTable table = make_page_table(s.pages, s.capacity);
  const auto kv = s.cache_view();
  OpResult r;
  r.operation = "append_paged_kv_cache";
  r.shape = std::to_string(B) + " req x " + std::to_string(o.append_len) + " tok";
  // Writing the same rows again is idempotent, so the op can be timed like the others.
  r.timing = time_runs(
      [&] {
        kvattn::append_paged_kv_cache(a.k.view(), a.v.view(), a.batch_indices.view(),
                                      a.positions.view(), kv, table.view());
      },
      1, o.reps);
  r.work = 2.0 * 2.0 * double(nnz) * kNumKvHeads * kHeadDim * kBytes;
  r.work_unit = "B";
  r.work_formula = "2 * (nnz * Hkv * D * 2 B) for K and V, read and written";

  // Every appended element must be in its slot, bit for bit (the copy has no arithmetic).
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < o.append_len; ++i) {
      const int64_t t = s.cached[size_t(b)] + i, row = s.token_row0[size_t(b)] + t;
      for (int kvi = 0; kvi < 2; ++kvi) {
        const uint16_t* got = cache_row(s, b, t, kvi);
        const uint16_t* want = logical_row(kvi ? s.v_logical : s.k_logical, row);
        for (int64_t e = 0; e < int64_t(kNumKvHeads) * kHeadDim; ++e)
          compare(bf16_to_float(got[e]), bf16_to_float(want[e]), 0.0, 0.0, r.out_cmp);
      }
      ++r.rows_checked;
    }
  return r;
}

OpResult run_prefill(const DemoOptions& o, Batch& s, const AppendData& a, Rng& rng) {
  const int64_t B = s.batch_size(), nnz = a.k.shape()[0];
  HostTensor q(kDType, {nnz, kNumQoHeads, kHeadDim});
  q.fill_uniform(rng, -kInputBound, kInputBound);
  HostTensor out(kDType, {nnz, kNumQoHeads, kHeadDim});
  HostTensor lse(DType::f32, {nnz, kNumQoHeads});
  out.fill(std::numeric_limits<double>::quiet_NaN());
  lse.fill(std::numeric_limits<double>::quiet_NaN());

  std::vector<int32_t> qo_indptr{0};
  for (int64_t b = 0; b < B; ++b) qo_indptr.push_back(qo_indptr.back() + o.append_len);
  HostTensor qo_indptr_t = int32_tensor(qo_indptr);
  HostPageTable table = make_page_table(s.pages, s.capacity);
  kvattn::BatchPrefillPlan plan;
  static_cast<kvattn::AttentionShape&>(plan) = attention_shape(/*causal=*/true);
  plan.qo_indptr = qo_indptr_t.view();
  plan.page_table = table.view();
  plan.page_size = kPageSize;
  kvattn::BatchPrefill prefill({}, kvattn::KVLayout::NHD);
  prefill.plan(plan);
  const auto kv = s.cache_view();

  OpResult r;
  r.operation = "BatchPrefill (append)";
  int64_t kv_tokens = std::accumulate(s.capacity.begin(), s.capacity.end(), int64_t(0));
  r.shape = std::to_string(B) + " req x " + std::to_string(o.append_len) + " q, " +
            format_count(kv_tokens) + " kv tok, causal";
  r.timing = time_runs([&] { prefill.run(q.view(), kv, out.view(), lse.view()); }, 1, o.reps);
  // Exactly the (query, key) pairs the causal mask lets through: query i of a request with
  // qo_len n and kv_len L sees L - n + i + 1 keys.
  double pairs = 0;
  for (int64_t b = 0; b < B; ++b) {
    const double n = o.append_len, L = double(s.capacity[size_t(b)]);
    pairs += n * (L - n) + n * (n + 1) / 2;
  }
  r.work = 4.0 * pairs * kNumQoHeads * kHeadDim;
  r.work_unit = "FLOP";
  r.work_formula = "4 * visible_pairs * Hq * D (QK^T and PV, 2 FLOP per multiply-add)";

  std::vector<int64_t> qo_len(size_t(B), o.append_len);
  check_rows(s, pick_samples(qo_len, o.samples, rng), q, out, lse, a.q_row0, s.capacity, qo_len,
             /*causal=*/true, r);
  return r;
}

// ---- output -------------------------------------------------------------------------------------
std::string error_cell(const OpResult& r) {
  char buf[64];
  if (r.out_cmp.max_abs_error == 0)
    std::snprintf(buf, sizeof buf, "0 (exact)");
  else
    std::snprintf(buf, sizeof buf, "%.2e", r.out_cmp.max_abs_error);
  std::string s = buf;
  if (!r.ok()) s += "  FAIL";
  return s;
}

void print_table(const std::vector<OpResult>& results) {
  std::vector<std::vector<std::string>> rows{{"operation", "shape", "time", "throughput", "max error"}};
  for (const auto& r : results)
    rows.push_back({r.operation, r.shape, format_seconds(r.timing.median),
                    format_rate(r.work / r.timing.median, r.work_unit == "B" ? "B" : "FLOP"),
                    error_cell(r)});
  std::vector<size_t> w(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) w[c] = std::max(w[c], row[c].size());
  auto line = [&](const std::vector<std::string>& row) {
    std::string s;
    for (size_t c = 0; c < row.size(); ++c) {
      // Numbers right-aligned, text left-aligned.
      bool right = c == 2 || c == 3;
      std::string pad(w[c] - row[c].size(), ' ');
      s += (c ? " | " : "") + (right ? pad + row[c] : row[c] + (c + 1 < row.size() ? pad : ""));
    }
    std::cout << s << "\n";
  };
  line(rows[0]);
  std::string rule;
  for (size_t c = 0; c < w.size(); ++c) rule += (c ? "-+-" : "") + std::string(w[c], '-');
  std::cout << rule << "\n";
  for (size_t i = 1; i < rows.size(); ++i) line(rows[i]);
}

nlohmann::json to_json(const OpResult& r) {
  nlohmann::json j;
  j["operation"] = r.operation;
  j["shape"] = r.shape;
  j["time_s"] = {{"median", r.timing.median}, {"min", r.timing.min}, {"max", r.timing.max},
                 {"runs", r.timing.seconds}};
  j["work"] = {{"amount", r.work}, {"unit", r.work_unit}, {"formula", r.work_formula}};
  j["throughput"] = {{"value", r.work / r.timing.median}, {"unit", r.work_unit + "/s"}};
  j["check"] = {{"rows", r.rows_checked},
                {"max_abs_error", r.out_cmp.max_abs_error},
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

void validate_options(const DemoOptions& o) {
  KVATTN_CHECK(o.batch >= 1, "--batch must be at least 1, got ", o.batch);
  KVATTN_CHECK(o.long_len >= 1, "--long-len must be at least 1, got ", o.long_len);
  KVATTN_CHECK(o.short_min >= 1 && o.short_min <= o.short_max, "--short-min (", o.short_min,
               ") must be in [1, --short-max = ", o.short_max, "]");
  KVATTN_CHECK(o.append_len >= 1, "--append-len must be at least 1, got ", o.append_len);
  KVATTN_CHECK(o.reps >= 1, "--reps must be at least 1, got ", o.reps);
  KVATTN_CHECK(o.samples >= 1, "--samples must be at least 1, got ", o.samples);
  KVATTN_CHECK(o.threads >= 0, "--threads must be >= 0, got ", o.threads);
}

void run_demo(const DemoOptions& o) {
  validate_options(o);
  // Must happen before the first kvattn call that starts the CPU thread pool.
  if (o.threads > 0) setenv("KVATTN_NUM_THREADS", std::to_string(o.threads).c_str(), 1);
  const BackendInfo backends = query_backends();
  const auto wall0 = std::chrono::steady_clock::now();
  // With a GPU the decode step runs there; append and prefill stay on the CPU backend until the
  // GPU prefill kernels exist (the next issue), so the sizes stay laptop-sized.
  const bool on_gpu = backends.gpu_available();
  const std::string device_note =
      on_gpu ? "CUDA device found: decode runs on cuda:0; append and prefill run on the CPU "
               "backend (GPU prefill is not built yet), on laptop-sized inputs"
             : "No GPU backend in this build (or no CUDA device): running the CPU backend on "
               "laptop-sized inputs";

  Rng rng(o.seed);
  Rng batch_rng = rng.fork(), decode_rng = rng.fork(), prefill_rng = rng.fork();
  Batch s = make_batch(o, batch_rng);
  if (!o.json) {
    std::cout << "kvattn " << kvattn::kVersion << " demo: one serving step, Llama-3-8B attention\n";
    if (!device_note.empty()) std::cout << device_note << " (" << backends.cpu_threads << " threads).\n";
    std::cout << "  heads " << kNumQoHeads << " query / " << kNumKvHeads << " KV, head dim "
              << kHeadDim << ", bf16, paged KV cache (NHD, page " << kPageSize << ", "
              << s.pages.num_pages << " pages in random order), seed " << o.seed << "\n"
              << "  cached tokens per request: " << lengths_summary(s.cached) << "\n"
              << "  then each request appends " << o.append_len << " tokens (append/prefill step)\n\n"
              << std::flush;
  }

  std::vector<OpResult> results;
  results.push_back(run_decode(o, s, decode_rng, on_gpu));
  AppendData a = make_append(o, s);
  results.push_back(run_append(o, s, a));
  results.push_back(run_prefill(o, s, a, prefill_rng));
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  const bool ok = std::all_of(results.begin(), results.end(), [](const OpResult& r) { return r.ok(); });

  if (o.json) {
    nlohmann::json j;
    j["version"] = kvattn::kVersion;
    j["backend"] = "cpu";
    j["threads"] = backends.cpu_threads;
    if (!device_note.empty()) j["note"] = device_note;
    j["seed"] = o.seed;
    j["shape"] = {{"num_qo_heads", kNumQoHeads}, {"num_kv_heads", kNumKvHeads},
                  {"head_dim", kHeadDim},        {"page_size", kPageSize},
                  {"dtype", "bf16"},             {"kv_layout", "NHD"},
                  {"num_pages", s.pages.num_pages}};
    j["cached_lengths"] = s.cached;
    j["append_len"] = o.append_len;
    j["reps"] = o.reps;
    j["results"] = nlohmann::json::array();
    for (const auto& r : results) j["results"].push_back(to_json(r));
    j["passed"] = ok;
    j["wall_s"] = wall;
    std::cout << j.dump(2) << "\n";
  } else {
    print_table(results);
    std::cout << "\ntime: median of " << o.reps << (o.reps == 1 ? " run" : " runs")
              << " after a warm-up\n"
              << "max error: largest |kvattn - float64 reference| over " << results[0].rows_checked
              << " decode and " << results[2].rows_checked << " prefill samples (request, row, head);\n"
              << "  tolerance " << kOutAtol << " + " << kOutRtol << " |ref| for the bf16 outputs, "
              << kLseAtol << " + " << kLseRtol << " |ref| for the LSE; the append is checked bit for bit\n"
              << (ok ? "All checks passed" : "CHECK FAILED") << " (" << format_seconds(wall)
              << " in total).\n";
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
      "demo", "Run one serving step with Llama-3-8B shapes, check it, print a timing table");
  cmd->footer(
      "Builds a paged KV cache (bf16, NHD, page 16, pages scattered) for a batch with skewed\n"
      "lengths (one --long-len request, the others between --short-min and --short-max), then\n"
      "runs BatchDecode, append_paged_kv_cache of --append-len tokens per request, and a causal\n"
      "BatchPrefill of those tokens. Samples of the outputs and LSEs are checked against a float64\n"
      "reference. Exit status: 0 all checks passed, 1 a check failed, 2 a kvattn error.\n"
      "Without a GPU backend the CPU backend runs on sizes a laptop finishes in seconds.");
  cmd->add_option("--seed", opts->seed, "Random seed for lengths, pages and data")->capture_default_str();
  cmd->add_option("--batch", opts->batch, "Requests in the batch (one long, the rest short)")->capture_default_str();
  cmd->add_option("--long-len", opts->long_len, "Cached tokens of the long request")->capture_default_str();
  cmd->add_option("--short-min", opts->short_min, "Fewest cached tokens of a short request")->capture_default_str();
  cmd->add_option("--short-max", opts->short_max, "Most cached tokens of a short request")->capture_default_str();
  cmd->add_option("--append-len", opts->append_len, "Tokens each request appends in the prefill step")->capture_default_str();
  cmd->add_option("--threads", opts->threads, "CPU threads (0: KVATTN_NUM_THREADS, else all cores)")->capture_default_str();
  cmd->add_option("--reps", opts->reps, "Timed runs per operation (the median is reported)")->capture_default_str();
  cmd->add_option("--samples", opts->samples, "(request, row, head) samples checked per attention op")->capture_default_str();
  cmd->add_flag("--json", opts->json, "Print the results as JSON instead of a table");
  cmd->callback([opts] { kvattn_cli::run_demo(*opts); });
}
