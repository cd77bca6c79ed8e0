// The automatic shared-prefix detection of BatchDecode's plan() (core/shared_prefix.h) alone, on
// host page tables of serving-sized batches (issue 29's target: <= 5 us of plan() at 256 requests).
// Page 16; every request ends in pages of its own. "none": no two requests share a first page (what
// a batch without prefix sharing pays); "shared": one prefix shared by every request; "nested":
// a system prompt shared by all, then a few-shot block shared by runs of 16.
#include <benchmark/benchmark.h>

#include <vector>

#include "core/shared_prefix.h"
#include "kvattn/attention.h"

namespace {

struct Table {
  std::vector<int32_t> indptr{0}, indices;
  void add(const std::vector<int32_t>& shared, int32_t own_pages, int32_t& next_id) {
    indices.insert(indices.end(), shared.begin(), shared.end());
    for (int32_t i = 0; i < own_pages; ++i) indices.push_back(next_id++);
    indptr.push_back(int32_t(indices.size()));
  }
};

std::vector<int32_t> run_of(int32_t first, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) v[size_t(i)] = first + i;
  return v;
}

// batch requests of `own` pages each after a prefix of `shared` pages (0: none) common to all;
// `inner` > 0 adds a block of `inner` pages shared by runs of 16 requests after it.
Table make_table(int batch, int32_t shared, int32_t own, int32_t inner = 0) {
  Table t;
  int32_t next = 0;
  const std::vector<int32_t> prefix = run_of(0, shared);
  next = shared;
  std::vector<int32_t> block;
  for (int b = 0; b < batch; ++b) {
    if (inner > 0 && b % 16 == 0) {
      block = prefix;
      const auto add = run_of(next, inner);
      block.insert(block.end(), add.begin(), add.end());
      next += inner;
    }
    t.add(inner > 0 ? block : prefix, own, next);
  }
  return t;
}

void BM_SharedPrefixDetection(benchmark::State& state, Table t) {
  for (auto _ : state) {
    auto levels = kvattn::detail::find_shared_prefix_levels(t.indptr, t.indices, 8);  // 128 tokens
    benchmark::DoNotOptimize(levels);
  }
}

BENCHMARK_CAPTURE(BM_SharedPrefixDetection, b256_none_4k, make_table(256, 0, 256));
BENCHMARK_CAPTURE(BM_SharedPrefixDetection, b256_none_32k, make_table(256, 0, 2048));
BENCHMARK_CAPTURE(BM_SharedPrefixDetection, b256_shared4k_own512, make_table(256, 256, 32));
BENCHMARK_CAPTURE(BM_SharedPrefixDetection, b128_shared32k_own256, make_table(128, 2048, 16));
BENCHMARK_CAPTURE(BM_SharedPrefixDetection, b256_nested_system2k_fewshot2k_own256, make_table(256, 128, 16, 128));

// BatchDecode::plan() as a whole on the CPU backend (32/8 heads, hd 128, bf16, page 16, host page
// ids): validation of every id, the detection, the levels' tables and both levels' plans when a
// cascade is chosen ("always"), or the flat plan ("never"). The GPU backend's plan() adds its
// kernels' choice and the staging copy on top of the same host work.
void BM_BatchDecodePlan(benchmark::State& state, Table t, kvattn::SharedPrefix mode) {
  const int64_t B = int64_t(t.indptr.size()) - 1;
  std::vector<int32_t> last(static_cast<size_t>(B), 16);
  kvattn::BatchDecodePlan p;
  p.num_qo_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim_qk = 128;
  p.q_dtype = kvattn::DType::bf16;
  p.page_size = 16;
  p.page_table = {kvattn::TensorView(t.indptr.data(), kvattn::DType::i32, {B + 1}),
                  kvattn::TensorView(t.indices.data(), kvattn::DType::i32, {int64_t(t.indices.size())}),
                  kvattn::TensorView(last.data(), kvattn::DType::i32, {B})};
  p.shared_prefix = mode;
  kvattn::BatchDecode decode;
  decode.plan(p);
  for (auto _ : state) decode.plan(p);
  state.counters["cascade"] = decode.cascade() != nullptr;
}

BENCHMARK_CAPTURE(BM_BatchDecodePlan, b128_shared32k_own256_always, make_table(128, 2048, 16),
                  kvattn::SharedPrefix::always);
BENCHMARK_CAPTURE(BM_BatchDecodePlan, b128_shared32k_own256_never, make_table(128, 2048, 16),
                  kvattn::SharedPrefix::never);
BENCHMARK_CAPTURE(BM_BatchDecodePlan, b256_shared4k_own512_always, make_table(256, 256, 32),
                  kvattn::SharedPrefix::always);
BENCHMARK_CAPTURE(BM_BatchDecodePlan, b256_shared4k_own512_never, make_table(256, 256, 32),
                  kvattn::SharedPrefix::never);
BENCHMARK_CAPTURE(BM_BatchDecodePlan, b256_none_4k_automatic, make_table(256, 0, 256),
                  kvattn::SharedPrefix::automatic);

}  // namespace
