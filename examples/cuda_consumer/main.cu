// Uses the installed kvattn package from CUDA: this file is compiled by nvcc (host and device
// passes both parse the kvattn headers), with C++20 coming from kvattn::kvattn. It runs one decode
// step on the CPU backend (every key equal, so the output is the mean of the values); with a CUDA
// device it also fills a cache with a kernel of its own and runs the same step there. Without a
// device it touches no GPU and says so.
#include <kvattn/kvattn.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <vector>

static_assert(__cplusplus >= 202002L, "kvattn::kvattn should have carried C++20 to nvcc");

namespace {

constexpr int kHeads = 2, kDim = 64, kPage = 4, kPages = 3, kTokens = kPages * kPage;

// K = 1 everywhere, V = the token's slot index in the pool (page * kPage + slot): the same values
// the host fills below.
__global__ void fill_cache(float* k, float* v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < kTokens * kHeads * kDim) {
    k[i] = 1.0f;
    v[i] = float(i / (kHeads * kDim));
  }
}

bool cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) std::printf("kvattn cuda consumer: %s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

struct Step {
  std::vector<int32_t> indptr = {0, 2, 3}, indices = {2, 0, 1}, last = {3, 4};
  kvattn::BatchDecodePlan plan() {
    using kvattn::DType;
    using kvattn::TensorView;
    kvattn::BatchDecodePlan p;
    p.num_qo_heads = p.num_kv_heads = kHeads;
    p.head_dim_qk = kDim;
    p.q_dtype = DType::f32;
    p.page_size = kPage;
    p.page_table = {TensorView(indptr.data(), DType::i32, {3}), TensorView(indices.data(), DType::i32, {3}),
                    TensorView(last.data(), DType::i32, {2})};
    return p;
  }
};

// Request 0: pages 2 (4 tokens, ids 8..11) and 0 (3 tokens, ids 0..2): mean 41/7.
// Request 1: page 1 (4 tokens, ids 4..7): mean 5.5.
bool check(const std::vector<float>& out, const char* where) {
  const double want[2] = {41.0 / 7.0, 5.5};
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < kHeads * kDim; ++i)
      if (std::fabs(out[size_t(b * kHeads * kDim + i)] - want[b]) > 1e-4) {
        std::printf("kvattn cuda consumer: %s: request %d element %d got %f, want %f\n", where, b, i,
                    out[size_t(b * kHeads * kDim + i)], want[b]);
        return false;
      }
  return true;
}

}  // namespace

int run() {
  using kvattn::DType;
  using kvattn::TensorView;
  std::vector<float> q(2 * kHeads * kDim, 0.5f), out(q.size(), -1.0f), lse(2 * kHeads);
  std::vector<float> k(size_t(kTokens) * kHeads * kDim, 1.0f), v(k.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i / (kHeads * kDim));
  Step step;

  // The CPU backend.
  kvattn::BatchDecode cpu;
  cpu.plan(step.plan());
  cpu.run(TensorView(q.data(), DType::f32, {2, kHeads, kDim}),
          kvattn::PagedKVCache::split(TensorView(k.data(), DType::f32, {kPages, kPage, kHeads, kDim}),
                                      TensorView(v.data(), DType::f32, {kPages, kPage, kHeads, kDim}),
                                      kvattn::KVLayout::NHD),
          TensorView(out.data(), DType::f32, {2, kHeads, kDim}), TensorView(lse.data(), DType::f32, {2, kHeads}));
  if (!check(out, "CPU backend")) return 1;

  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("kvattn cuda consumer: ok on the CPU backend (kvattn %s, nvcc, C++%ld); no CUDA device (%s): "
                "the GPU part is skipped\n",
                kvattn::kVersion, long(__cplusplus / 100 % 100), e != cudaSuccess ? cudaGetErrorName(e) : "0 devices");
    return 0;
  }

  // The same step on cuda:0, on a cache filled by this file's own kernel.
  const size_t cache_bytes = k.size() * sizeof(float), q_bytes = q.size() * sizeof(float);
  const int64_t ws_bytes = int64_t(16) << 20;
  float *dk = nullptr, *dv = nullptr, *dq = nullptr, *dout = nullptr, *dlse = nullptr;
  void* ws = nullptr;
  if (!cuda_ok(cudaMalloc(&dk, cache_bytes), "cudaMalloc") || !cuda_ok(cudaMalloc(&dv, cache_bytes), "cudaMalloc") ||
      !cuda_ok(cudaMalloc(&dq, q_bytes), "cudaMalloc") || !cuda_ok(cudaMalloc(&dout, q_bytes), "cudaMalloc") ||
      !cuda_ok(cudaMalloc(&dlse, lse.size() * sizeof(float)), "cudaMalloc") ||
      !cuda_ok(cudaMalloc(&ws, size_t(ws_bytes)), "cudaMalloc"))
    return 1;
  fill_cache<<<(kTokens * kHeads * kDim + 255) / 256, 256>>>(dk, dv);
  if (!cuda_ok(cudaGetLastError(), "fill_cache") ||
      !cuda_ok(cudaMemcpy(dq, q.data(), q_bytes, cudaMemcpyHostToDevice), "cudaMemcpy"))
    return 1;
  const auto dev = kvattn::Device::cuda(0);
  kvattn::BatchDecode gpu(TensorView(ws, DType::u8, {ws_bytes}, dev));
  gpu.plan(step.plan());
  gpu.run(TensorView(dq, DType::f32, {2, kHeads, kDim}, dev),
          kvattn::PagedKVCache::split(TensorView(dk, DType::f32, {kPages, kPage, kHeads, kDim}, dev),
                                      TensorView(dv, DType::f32, {kPages, kPage, kHeads, kDim}, dev),
                                      kvattn::KVLayout::NHD),
          TensorView(dout, DType::f32, {2, kHeads, kDim}, dev), TensorView(dlse, DType::f32, {2, kHeads}, dev));
  std::vector<float> gout(q.size(), -1.0f);
  if (!cuda_ok(cudaMemcpy(gout.data(), dout, q_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy") || !check(gout, "GPU"))
    return 1;
  gpu.check_errors();
  for (void* p : {static_cast<void*>(dk), static_cast<void*>(dv), static_cast<void*>(dq), static_cast<void*>(dout),
                  static_cast<void*>(dlse), ws})
    cudaFree(p);
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("kvattn cuda consumer: ok on the CPU backend and on cuda:0 (%s) (kvattn %s, nvcc, C++%ld)\n", prop.name,
              kvattn::kVersion, long(__cplusplus / 100 % 100));
  return 0;
}

int main() {
  try {
    return run();
  } catch (const kvattn::Error& e) {
    std::printf("kvattn cuda consumer: kvattn error: %s\n", e.what());
    return 1;
  }
}
