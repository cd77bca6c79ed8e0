// The CUDA runtime layer and the NVRTC JIT (src/cuda). Everything but the last two tests runs
// without a GPU: compiling the registry for sm_90a and sm_80 is CI's "every built-in kernel
// compiles" gate. GPU tests skip, saying why, when there is no usable device.
#if KVATTN_WITH_CUDA

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/kernel_registry.h"
#include "cuda/merge_kernels.h"
#include "cuda/prefill_kernels.h"
#include "kernels/variants/params.cuh"
#include "cuda/runtime.h"
#include "core/sha256.h"
#include "kvattn/error.h"
#include "support/child_process.h"
#include "support/dtype_codec.h"
#include "support/expect_error.h"
#include "support/kernel_choice.h"
#include "support/scoped_override.h"


namespace {
namespace fs = std::filesystem;
using namespace kvattn::cuda;
using kvattn::detail::sha256_hex;
using kvattn::DType;

// A fresh, empty cache directory per test, removed afterwards.
struct TempDir : kvattn_test::TempDir {
  TempDir() : kvattn_test::TempDir("kvattn-jit-test") {}
};

// A tiny kernel: fast to compile, so cache tests stay quick.
KernelSpec small_spec(const std::string& arch = "sm_80") {
  return {"scale_test", "kvattn_scale_test",
          "#include \"kernels/common/host_device.cuh\"\n"
          "extern \"C\" __global__ void kvattn_scale_test(float* x, int64_t n) {\n"
          "  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;\n"
          "  if (i < n) x[i] *= 2.0f;\n}\n",
          {},
          arch};
}

template <class T>
T* device_alloc(size_t bytes) {
  void* p = nullptr;
  KVATTN_CUDA_CHECK(cudaMalloc(&p, bytes));
  return static_cast<T*>(p);
}

bool is_elf(const std::vector<char>& b) {
  return b.size() > 4 && b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F';
}

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
  return out;
}

TEST(CudaSha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::string million(1000000, 'a');  // crosses many blocks and the buffered path
  EXPECT_EQ(sha256_hex(million), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(CudaRuntime, NoDeviceIsAClearError) {
  std::string reason;
  if (cuda_available(&reason)) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(device_count(), 0);
  try {
    device_info(0);
    FAIL() << "device_info without a device must throw";
  } catch (const kvattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device: " + reason), std::string::npos) << e.what();
  }
}

TEST(CudaRuntime, ArchStrings) {
  EXPECT_EQ(arch_for(9, 0), "sm_90a");
  EXPECT_EQ(arch_for(8, 0), "sm_80");
  EXPECT_EQ(arch_for(8, 6), "sm_86");
  EXPECT_EQ(arch_for(8, 9), "sm_89");
  EXPECT_THROW(check_arch("sm90"), kvattn::Error);
  EXPECT_THROW(check_arch("sm_10"), kvattn::Error);  // NVRTC has no such target
  EXPECT_NO_THROW(check_arch("sm_90a"));
}

// CI's gate: every kernel of the default preset compiles for Hopper and Ampere, with no GPU.
TEST(CudaJit, DefaultPresetCompilesForSm90aAndSm80) {
  for (const std::string arch : {"sm_90a", "sm_80"}) {
    auto specs = preset_specs("default", arch);
    ASSERT_FALSE(specs.empty());
    for (const KernelSpec& spec : specs) {
      SCOPED_TRACE(spec.name + " " + arch);
      CompileResult r = compile_to_cubin(spec);
      EXPECT_TRUE(is_elf(r.cubin));
      std::printf("[ compile  ] %-28s %-7s %6.2f s  %zu bytes\n", spec.name.c_str(), arch.c_str(),
                  r.seconds, r.cubin.size());
    }
  }
}

// The prefill kernels' decode shape beyond what the presets hold: every variant family's transform
// path (fp8 and RoPE tiles converted before the KV warps split them), head dims 64 and 256, and
// the shapes shrunk for Ada's 99 KB per block (the uniform variant's six KV warps become three).
TEST(CudaJit, DecodeShapesOfEveryVariantCompile) {
  namespace k = kvattn::kernels;
  struct Case {
    DType kv;
    int hd;
    uint32_t features;
    bool uniform;
    int64_t smem;
    const char* arch;
  };
  const Case cases[] = {
      {DType::e4m3, 128, k::kCausal, false, 227 * 1024, "sm_90a"},
      {DType::bf16, 128, k::kCausal | k::kRope, true, 227 * 1024, "sm_90a"},
      {DType::bf16, 128, k::kSoftCap | k::kSlidingWindow | k::kAlibi, false, 227 * 1024, "sm_90a"},
      {DType::bf16, 128, k::kCustomMask, true, 227 * 1024, "sm_90a"},
      {DType::bf16, 128, k::kSigmoid, false, 227 * 1024, "sm_90a"},
      {DType::bf16, 64, 0, true, 227 * 1024, "sm_90a"},
      {DType::bf16, 256, 0, false, 227 * 1024, "sm_90a"},
      {DType::bf16, 128, 0, true, 99 * 1024, "sm_89"},
      {DType::e5m2, 256, 0, false, 99 * 1024, "sm_89"},
      {DType::bf16, 256, 0, true, 99 * 1024, "sm_89"},
  };
  for (const Case& c : cases) {
    const auto cfg = kvattn_test::prefill_choice(DType::bf16, c.kv, DType::bf16, c.hd, c.hd, 4, true, 16, c.features, 1, kvattn_test::arch(c.arch), c.uniform);
    ASSERT_GE(cfg.kv_warps, 1) << cfg.name();
    ASSERT_LE(kvattn::cuda::prefill_smem_bytes(cfg), c.smem) << cfg.name();
    const KernelSpec spec = kvattn::cuda::prefill_spec(cfg, c.arch);
    SCOPED_TRACE(spec.name + " " + c.arch);
    CompileResult r = compile_to_cubin(spec);
    EXPECT_TRUE(is_elf(r.cubin));
  }
}

// The bulk-copy decode kernels (sm_90+ instructions) are in the default preset for Hopper only; the
// cp.async kernels that older devices run stay in it for both.
TEST(CudaJit, BulkDecodeKernelsAreCompiledOnlyForSm90) {
  // The presets reflect the default choices: the overrides (of a test scope or the environment)
  // never change them (presets() is built without any).
  kvattn_test::ScopedOverride forced("KVATTN_DECODE_KERNEL", "transposed");
  auto count = [](const std::string& arch, const std::string& suffix) {
    int n = 0;
    for (const KernelSpec& s : preset_specs("default", arch))
      n += s.name.size() > suffix.size() && s.name.compare(s.name.size() - suffix.size(), suffix.size(), suffix) == 0;
    return n;
  };
  EXPECT_GT(count("sm_90a", "_bulk"), 0);
  EXPECT_EQ(count("sm_80", "_bulk"), 0);
  EXPECT_EQ(count("sm_90a", "_g4_p16_f0"), count("sm_80", "_g4_p16_f0"));  // the mma kernels in both
  EXPECT_KVATTN_ERROR(arch_sm("sm90"), "invalid arch 'sm90'");
  EXPECT_EQ(arch_sm("sm_90a"), 90);
  EXPECT_EQ(arch_sm("sm_86"), 86);
}

TEST(CudaJit, UnknownPresetNamesTheKnownOnes) {
  try {
    preset_specs("nope", "sm_80");
    FAIL();
  } catch (const kvattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("default"), std::string::npos) << e.what();
  }
}

TEST(CudaJit, KeyCoversSourceOptionsArchAndEntry) {
  KernelSpec base = small_spec();
  std::string k = kernel_key(base);
  EXPECT_EQ(k.size(), 64u);
  EXPECT_EQ(kernel_key(base), k);
  KernelSpec s = base;
  s.name = "renamed";  // a display name changes no code
  EXPECT_EQ(kernel_key(s), k);
  s = base, s.source += "\n";
  EXPECT_NE(kernel_key(s), k);
  s = base, s.options = {"-DKVATTN_X=1"};
  EXPECT_NE(kernel_key(s), k);
  s = base, s.arch = "sm_90a";
  EXPECT_NE(kernel_key(s), k);
  s = base, s.entry = "other";
  EXPECT_NE(kernel_key(s), k);
  // Options are length-prefixed: {"ab"} and {"a", "b"} differ.
  KernelSpec a = base, b = base;
  a.options = {"-DA=1 -DB=2"}, b.options = {"-DA=1", "-DB=2"};
  EXPECT_NE(kernel_key(a), kernel_key(b));
}

TEST(CudaJit, CompileErrorShowsLogAndSourceLine) {
  KernelSpec s = small_spec();
  s.name = "broken";
  s.source += "extern \"C\" __global__ void kvattn_broken() { undefined_thing(42); }\n";
  try {
    compile_to_cubin(s);
    FAIL() << "expected a compile error";
  } catch (const kvattn::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("failed to compile kernel broken"), std::string::npos) << m;
    EXPECT_NE(m.find("undefined_thing"), std::string::npos) << m;  // NVRTC's log
    EXPECT_NE(m.find("broken.cu(6): error"), std::string::npos) << m;
    EXPECT_NE(m.find(">    6 | extern \"C\" __global__ void kvattn_broken()"), std::string::npos) << m;
  }
}

TEST(CudaJit, ErrorInAnEmbeddedHeaderShowsThatHeadersLine) {
  KernelSpec s = small_spec();
  // Breaks merge_states.cuh's call of a helper by renaming it after its definition.
  s.source = "#include \"kernels/common/ptx.cuh\"\n#define store_from_f32 nonexistent_store\n"
             "#include \"kernels/merge/merge_states.cuh\"\n"
             "extern \"C\" __global__ void kvattn_scale_test(kvattn::kernels::MergeStatesParams p) {\n"
             "  kvattn::kernels::merge_states<0, 0>(p);\n}\n";
  try {
    compile_to_cubin(s);
    FAIL() << "expected a compile error";
  } catch (const kvattn::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("at kernels/merge/merge_states.cuh:"), std::string::npos) << m;
    EXPECT_NE(m.find("store_from_f32<DOut>(out, e, acc)"), std::string::npos) << m;
  }
}

TEST(CudaJitCache, ColdThenWarmFromMemoryAndDisk) {
  TempDir dir;
  KernelSpec spec = small_spec();
  KernelCache cache(dir.path);
  CubinLookup cold = cache.cubin(spec);
  EXPECT_EQ(cold.source, CacheSource::compiled);
  EXPECT_TRUE(is_elf(*cold.cubin));
  EXPECT_TRUE(fs::exists(fs::path(dir.path) / (cold.key + ".cubin")));

  CubinLookup mem = cache.cubin(spec);
  EXPECT_EQ(mem.source, CacheSource::memory);
  EXPECT_EQ(*mem.cubin, *cold.cubin);

  KernelCache other(dir.path);  // a fresh process's view of the same directory
  CubinLookup disk = other.cubin(spec);
  EXPECT_EQ(disk.source, CacheSource::disk);
  EXPECT_EQ(*disk.cubin, *cold.cubin);

  // Warm lookups: report, and bound loosely (sanitizer builds are slower).
  constexpr int kReps = 2000;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kReps; ++i) cache.cubin(spec);
  double mem_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kReps;
  std::printf("[ timing   ] cold %.3f s, warm from disk %.3f ms, in-process %.2f us\n", cold.seconds,
              disk.seconds * 1e3, mem_us);
  EXPECT_LT(mem_us, 1000.0);
  EXPECT_LT(disk.seconds, 0.5);
}

class CudaJitCorrupt : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaJitCorrupt, EntryIsDetectedAndRebuilt) {
  TempDir dir;
  KernelSpec spec = small_spec();
  CubinLookup first = KernelCache(dir.path).cubin(spec);
  fs::path entry = fs::path(dir.path) / (first.key + ".cubin");
  auto size = fs::file_size(entry);
  std::string how = GetParam();
  if (how == "truncate") {
    fs::resize_file(entry, size / 2);
  } else if (how == "header") {
    fs::resize_file(entry, 20);
  } else if (how == "empty") {
    fs::resize_file(entry, 0);
  } else {  // flip one payload byte
    std::fstream f(entry, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(std::streamoff(size - 100));
    char c;
    f.get(c);
    f.seekp(std::streamoff(size - 100));
    f.put(char(c ^ 0x20));
  }
  testing::internal::CaptureStderr();
  CubinLookup again = KernelCache(dir.path).cubin(spec);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(again.source, CacheSource::compiled) << "a corrupt entry must never be loaded";
  EXPECT_NE(err.find("is invalid"), std::string::npos) << err;
  EXPECT_EQ(*again.cubin, *first.cubin);
  EXPECT_EQ(fs::file_size(entry), size);  // rebuilt whole
  EXPECT_EQ(KernelCache(dir.path).cubin(spec).source, CacheSource::disk);
}
INSTANTIATE_TEST_SUITE_P(Ways, CudaJitCorrupt, ::testing::Values("truncate", "header", "empty", "flip"));

TEST(CudaJitCache, ConcurrentThreadsShareOneDirectory) {
  TempDir dir;
  KernelSpec spec = small_spec();
  KernelCache shared(dir.path);
  std::vector<std::vector<char>> got(6);
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&, t] {
      // Even threads: separate caches (like processes); odd: one shared cache (one compile).
      if (t % 2 == 0) got[t] = *KernelCache(dir.path).cubin(spec).cubin;
      else got[t] = *shared.cubin(spec).cubin;
    });
  for (auto& th : threads) th.join();
  for (const auto& g : got) EXPECT_EQ(g, got[0]);
  auto files = files_in(dir.path);
  ASSERT_EQ(files.size(), 1u) << "no temporary file may be left behind";
  EXPECT_EQ(KernelCache(dir.path).cubin(spec).source, CacheSource::disk);
}

// The child half of the two-process test: runs only when the parent spawns it.
TEST(CudaJitProcessChild, CompileIntoSharedDir) {
  const char* dir = std::getenv("KVATTN_JIT_TEST_CHILD_DIR");
  if (!dir) GTEST_SKIP() << "helper of CudaJitCache.TwoProcessesShareOneDirectory (spawned by it)";
  KernelCache(dir).cubin(small_spec("sm_90a"));
}

TEST(CudaJitCache, TwoProcessesShareOneDirectory) {
  TempDir dir;
  kvattn_test::run_copies_of_this_binary(2, "CudaJitProcessChild.CompileIntoSharedDir",
                                         "KVATTN_JIT_TEST_CHILD_DIR=" + dir.path.string());
  ASSERT_EQ(files_in(dir.path).size(), 1u);
  CubinLookup r = KernelCache(dir.path).cubin(small_spec("sm_90a"));
  EXPECT_EQ(r.source, CacheSource::disk);
  EXPECT_TRUE(is_elf(*r.cubin));
}

// ---- on a GPU -------------------------------------------------------------------------------------

#define REQUIRE_GPU()                                                                   \
  do {                                                                                  \
    std::string why;                                                                    \
    if (!cuda_available(&why)) GTEST_SKIP() << "needs a CUDA device; no CUDA device: " << why; \
  } while (0)

TEST(CudaJitGpu, LoadedKernelIsCachedPerKey) {
  REQUIRE_GPU();
  KernelCache cache("");
  KernelSpec spec = small_spec(device_info(current_device()).arch);
  cudaKernel_t k = cache.kernel(spec);
  EXPECT_EQ(cache.kernel(spec), k);
  float* x = device_alloc<float>(256 * sizeof(float));
  std::vector<float> h(256, 1.5f);
  KVATTN_CUDA_CHECK(cudaMemcpy(x, h.data(), 1024, cudaMemcpyHostToDevice));
  int64_t n = 256;
  void* args[] = {&x, &n};
  KVATTN_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3(2), dim3(128), args, 0, nullptr));
  KVATTN_CUDA_CHECK(cudaMemcpy(h.data(), x, 1024, cudaMemcpyDeviceToHost));
  cudaFree(x);
  for (float v : h) EXPECT_EQ(v, 3.0f);
}

TEST(CudaJitGpu, MergeStatesMatchesFloat64Reference) {
  REQUIRE_GPU();
  const double inf = std::numeric_limits<double>::infinity();
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal(0.0, 1.0);
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(std::string(kvattn::dtype_name(dt)));
    const int64_t n = 37;
    const int k = 5, H = 3, D = 72;
    const size_t es = kvattn::dtype_size(dt);
    std::vector<char> v(size_t(n * k * H * D) * es);
    std::vector<float> s(size_t(n * k * H));
    for (int64_t i = 0; i < n * k * H * D; ++i) kvattn_test::encode(v.data(), dt, i, normal(rng));
    for (int64_t i = 0; i < n * k * H; ++i) s[i] = float(4.0 * normal(rng));
    // -inf rules: row 0 all states empty; row 1 all but state 2; row 2 the first state only.
    for (int j = 0; j < k; ++j)
      for (int h = 0; h < H; ++h) {
        s[(0 * k + j) * H + h] = -INFINITY;
        if (j != 2) s[(1 * k + j) * H + h] = -INFINITY;
        if (j == 0) s[(2 * k + j) * H + h] = -INFINITY;
      }
    char* dv = device_alloc<char>(v.size());
    char* dvo = device_alloc<char>(size_t(n * H * D) * es);
    float* ds = device_alloc<float>(s.size() * 4);
    float* dso = device_alloc<float>(size_t(n * H) * 4);
    KVATTN_CUDA_CHECK(cudaMemcpy(dv, v.data(), v.size(), cudaMemcpyHostToDevice));
    KVATTN_CUDA_CHECK(cudaMemcpy(ds, s.data(), s.size() * 4, cudaMemcpyHostToDevice));
    KVATTN_CUDA_CHECK(cudaMemset(dvo, 0xff, size_t(n * H * D) * es));  // poison
    kvattn::kernels::MergeStatesParams p;
    p.v = dv, p.v_row = k * H * D, p.v_state = H * D, p.v_head = D;
    p.s = ds, p.s_row = k * H, p.s_state = H, p.s_head = 1;
    p.v_out = dvo, p.vo_row = H * D, p.vo_head = D;
    p.s_out = dso, p.so_row = H, p.so_head = 1;
    p.num_rows = n, p.num_states = k, p.num_heads = H, p.head_dim = D;
    launch_merge_states(p, dt, dt, nullptr);
    std::vector<char> vo(size_t(n * H * D) * es);
    std::vector<float> so(size_t(n * H));
    KVATTN_CUDA_CHECK(cudaMemcpy(vo.data(), dvo, vo.size(), cudaMemcpyDeviceToHost));
    KVATTN_CUDA_CHECK(cudaMemcpy(so.data(), dso, so.size() * 4, cudaMemcpyDeviceToHost));
    for (void* ptr : {(void*)dv, (void*)dvo, (void*)ds, (void*)dso}) cudaFree(ptr);

    const double tol = dt == DType::f32 ? 1e-5 : dt == DType::f16 ? 2e-3 : 1.6e-2;
    for (int64_t r = 0; r < n; ++r)
      for (int h = 0; h < H; ++h) {
        double m = -inf, sum = 0;
        for (int j = 0; j < k; ++j) m = std::max(m, double(s[(r * k + j) * H + h]));
        if (m != -inf)
          for (int j = 0; j < k; ++j) sum += std::exp2(double(s[(r * k + j) * H + h]) - m);
        double lse = m == -inf ? -inf : m + std::log2(sum);
        if (lse == -inf) EXPECT_EQ(so[r * H + h], -INFINITY);
        else EXPECT_NEAR(so[r * H + h], lse, 1e-5 * std::max(1.0, std::abs(lse)));
        for (int d = 0; d < D; ++d) {
          double want = 0;
          for (int j = 0; j < k; ++j) {
            double sj = s[(r * k + j) * H + h];
            if (sj != -inf) want += kvattn_test::decode(v.data(), dt, ((r * k + j) * H + h) * D + d) * std::exp2(sj - lse);
          }
          double got = kvattn_test::decode(vo.data(), dt, (r * H + h) * D + d);
          ASSERT_NEAR(got, want, tol * std::max(1.0, std::abs(want))) << "row " << r << " head " << h << " d " << d;
        }
      }
  }
}

}  // namespace

#endif  // KVATTN_WITH_CUDA
