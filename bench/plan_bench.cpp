// plan() itself: how long the planner takes on the host for serving-sized batches (targets, from
// the planner issue: <= 20 us for a 256-request decode batch, <= 50 us for a 256-request prefill
// batch). A Planner is reused across iterations, as a serving loop would; the FreshPlanner cases
// include the first call's allocations. Heads: Llama-3-8B (32 query heads, 8 KV heads, dim 128);
// workers: 132 SMs x residency 1 unless the name says otherwise.
#include <benchmark/benchmark.h>

#include <numeric>
#include <vector>

#include "core/batch_shapes.h"
#include "kvattn/plan.h"

namespace {

struct BatchInputs {
  std::vector<int32_t> qo_indptr, kv_len;
  kvattn::PlannerInputs inputs;
};

BatchInputs decode_batch(std::vector<int32_t> kv) {
  BatchInputs b;
  b.kv_len = std::move(kv);
  b.qo_indptr.resize(b.kv_len.size() + 1);
  std::iota(b.qo_indptr.begin(), b.qo_indptr.end(), 0);
  b.inputs.qo_indptr = b.qo_indptr;
  b.inputs.kv_len = b.kv_len;
  b.inputs.num_qo_heads = 32;
  b.inputs.num_kv_heads = 8;
  b.inputs.head_dim_qk = 128;
  b.inputs.tile = {1, 64};
  return b;
}

// 256 requests, chunked prefill/append: qo_len uniform in [16, 256] new tokens on a cached prefix
// of uniform [0, 2048] tokens, causal; tile 128 packed rows = 32 query tokens x group 4.
BatchInputs prefill_batch(int n, int32_t q_lo, int32_t q_hi, int32_t prefix_hi) {
  BatchInputs b;
  kvattn::detail::SplitMix64 rng(7);
  b.qo_indptr.push_back(0);
  for (int i = 0; i < n; ++i) {
    int32_t q = int32_t(rng.uniform(q_lo, q_hi));
    b.qo_indptr.push_back(b.qo_indptr.back() + q);
    b.kv_len.push_back(q + int32_t(rng.uniform(0, prefix_hi)));
  }
  b.inputs.qo_indptr = b.qo_indptr;
  b.inputs.kv_len = b.kv_len;
  b.inputs.num_qo_heads = 32;
  b.inputs.num_kv_heads = 8;
  b.inputs.head_dim_qk = 128;
  b.inputs.tile = {32, 64};
  b.inputs.causal = true;
  return b;
}

void run_plan(benchmark::State& state, const BatchInputs& b, const kvattn::SchedulerOptions& opt) {
  kvattn::Planner planner;
  const kvattn::Plan* plan = &planner.plan(b.inputs, opt);  // warm the buffers
  for (auto _ : state) {
    plan = &planner.plan(b.inputs, opt);
    benchmark::DoNotOptimize(plan);
  }
  state.counters["items"] = double(plan->num_items());
  state.counters["merges"] = double(plan->num_merges());
  state.counters["split"] = double(plan->split_size());
  state.counters["max_over_mean"] = plan->max_over_mean();
}

kvattn::SchedulerOptions workers(int n) {
  kvattn::SchedulerOptions o;
  o.num_workers = n;
  return o;
}

void BM_PlanDecode256_Uniform512to16k(benchmark::State& s) {
  static auto b = decode_batch(kvattn::detail::uniform_lengths(256, 512, 16384, 1));
  run_plan(s, b, workers(132));
}
void BM_PlanDecode256_Zipf4k(benchmark::State& s) {
  static auto b = decode_batch(kvattn::detail::zipf_lengths(256, 4096, 1.0, 1));
  run_plan(s, b, workers(132));
}
void BM_PlanDecode256_OneLong(benchmark::State& s) {
  static auto b = decode_batch(kvattn::detail::one_long_lengths(131072, 255, 512));
  run_plan(s, b, workers(132));
}
void BM_PlanDecode256_Uniform_Residency2(benchmark::State& s) {
  static auto b = decode_batch(kvattn::detail::uniform_lengths(256, 512, 16384, 1));
  run_plan(s, b, workers(264));
}
void BM_PlanDecode256_CudaGraph(benchmark::State& s) {
  static auto b = decode_batch(kvattn::detail::zipf_lengths(256, 4096, 1.0, 1));
  auto o = workers(132);
  o.cuda_graph = kvattn::GraphCapacity{256, 256};
  run_plan(s, b, o);
}
void BM_PlanDecode256_FreshPlanner(benchmark::State& s) {
  static auto b = decode_batch(kvattn::detail::uniform_lengths(256, 512, 16384, 1));
  auto o = workers(132);
  for (auto _ : s) {
    kvattn::Plan p = kvattn::make_plan(b.inputs, o);
    benchmark::DoNotOptimize(p.num_items());
  }
}
void BM_PlanPrefill256(benchmark::State& s) {
  static auto b = prefill_batch(256, 16, 256, 2048);
  run_plan(s, b, workers(132));
}
void BM_PlanPrefill256_Long(benchmark::State& s) {
  static auto b = prefill_batch(256, 256, 1024, 8192);
  run_plan(s, b, workers(132));
}
void BM_PlanDecodeScaling(benchmark::State& s) {
  auto b = decode_batch(kvattn::detail::uniform_lengths(int(s.range(0)), 512, 16384, 1));
  run_plan(s, b, workers(132));
}

// The decode benchmark's batches (kvattn bench decode, issue 4's plan() target) as the CUDA
// decode runner plans them on the H200: one worker per SM (132), rounded down to a multiple of
// the KV heads (128), slice 0 stored only. Skewed batches run another kernel, with the same workers.
kvattn::SchedulerOptions decode_runner(int sms, int kv_heads) {
  kvattn::SchedulerOptions o = workers(sms - sms % kv_heads);
  o.slice_zero_only = true;
  return o;
}
void BM_PlanDecodeBench(benchmark::State& s, std::vector<int32_t> lens) {
  auto b = decode_batch(std::move(lens));
  run_plan(s, b, decode_runner(132, 8));
}
// MHA, 32/32 heads.
void BM_PlanDecodeBenchMHA(benchmark::State& s, std::vector<int32_t> lens) {
  auto b = decode_batch(std::move(lens));
  b.inputs.num_kv_heads = 32;
  run_plan(s, b, decode_runner(132, 32));
}
BENCHMARK_CAPTURE(BM_PlanDecodeBenchMHA, b64_l4096, std::vector<int32_t>(64, 4096));
BENCHMARK_CAPTURE(BM_PlanDecodeBenchMHA, b256_l4096, std::vector<int32_t>(256, 4096));
BENCHMARK_CAPTURE(BM_PlanDecodeBench, b1_l32768, std::vector<int32_t>(1, 32768));
BENCHMARK_CAPTURE(BM_PlanDecodeBench, b16_l4096, std::vector<int32_t>(16, 4096));
BENCHMARK_CAPTURE(BM_PlanDecodeBench, b64_l4096, std::vector<int32_t>(64, 4096));
BENCHMARK_CAPTURE(BM_PlanDecodeBench, b256_l4096, std::vector<int32_t>(256, 4096));
BENCHMARK_CAPTURE(BM_PlanDecodeBench, b256_l32768, std::vector<int32_t>(256, 32768));
BENCHMARK_CAPTURE(BM_PlanDecodeBench, zipf64, kvattn::detail::zipf_lengths(64, 4096.0, 1.0, 7));
BENCHMARK_CAPTURE(BM_PlanDecodeBench, long32k_63x512, kvattn::detail::one_long_lengths(32768, 63, 512));
BENCHMARK_CAPTURE(BM_PlanDecodeBench, b256_l512, std::vector<int32_t>(256, 512));
// Long decode batches as BatchDecode plans them on sm_90's route to the prefill kernels' decode
// shape (cuda::decode_uses_prefill_kernels): 3 CTAs per SM (396 workers), every slice stored.
void BM_PlanDecodeOnPrefill(benchmark::State& s, std::vector<int32_t> lens) {
  auto b = decode_batch(std::move(lens));
  run_plan(s, b, workers(396));
}
void BM_PlanDecodeOnPrefillSlice0(benchmark::State& s, std::vector<int32_t> lens) {
  auto b = decode_batch(std::move(lens));
  auto o = workers(392);
  o.slice_zero_only = true;
  run_plan(s, b, o);
}
void BM_PlanDecodeOnPrefillFixed(benchmark::State& s, std::vector<int32_t> lens) {
  auto b = decode_batch(std::move(lens));
  auto o = workers(392);
  o.slice_zero_only = true;
  o.fixed_split_size = 1408;
  run_plan(s, b, o);
}
BENCHMARK_CAPTURE(BM_PlanDecodeOnPrefillFixed, b64_l4096, std::vector<int32_t>(64, 4096));
BENCHMARK_CAPTURE(BM_PlanDecodeOnPrefillFixed, b256_l4096, std::vector<int32_t>(256, 4096));
void BM_PlanDecodeOnPrefillSlice0W264(benchmark::State& s, std::vector<int32_t> lens) {
  auto b = decode_batch(std::move(lens));
  auto o = workers(264);
  o.slice_zero_only = true;
  run_plan(s, b, o);
}
BENCHMARK_CAPTURE(BM_PlanDecodeOnPrefillSlice0W264, zipf64, kvattn::detail::zipf_lengths(64, 4096.0, 1.0, 7));
BENCHMARK_CAPTURE(BM_PlanDecodeOnPrefillSlice0W264, b64_l4096, std::vector<int32_t>(64, 4096));
BENCHMARK_CAPTURE(BM_PlanDecodeOnPrefillSlice0, b64_l4096, std::vector<int32_t>(64, 4096));
BENCHMARK_CAPTURE(BM_PlanDecodeOnPrefillSlice0, b256_l4096, std::vector<int32_t>(256, 4096));
BENCHMARK_CAPTURE(BM_PlanDecodeOnPrefillSlice0, zipf64, kvattn::detail::zipf_lengths(64, 4096.0, 1.0, 7));
BENCHMARK_CAPTURE(BM_PlanDecodeOnPrefill, b64_l4096, std::vector<int32_t>(64, 4096));
BENCHMARK_CAPTURE(BM_PlanDecodeOnPrefill, b256_l4096, std::vector<int32_t>(256, 4096));
BENCHMARK_CAPTURE(BM_PlanDecodeOnPrefill, zipf64, kvattn::detail::zipf_lengths(64, 4096.0, 1.0, 7));

BENCHMARK(BM_PlanDecode256_Uniform512to16k);
BENCHMARK(BM_PlanDecode256_Zipf4k);
BENCHMARK(BM_PlanDecode256_OneLong);
BENCHMARK(BM_PlanDecode256_Uniform_Residency2);
BENCHMARK(BM_PlanDecode256_CudaGraph);
BENCHMARK(BM_PlanDecode256_FreshPlanner);
BENCHMARK(BM_PlanPrefill256);
BENCHMARK(BM_PlanPrefill256_Long);
BENCHMARK(BM_PlanDecodeScaling)->RangeMultiplier(4)->Range(1, 1024);

}  // namespace
