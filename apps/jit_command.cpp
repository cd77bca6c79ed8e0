// `kvattn jit list` and `kvattn jit precompile`: the built-in kernel presets and the JIT's disk
// cache. precompile fills the cache ahead of time (deployment images, CI), in parallel, and needs
// no GPU: NVRTC compiles for the arch named on the command line.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "kvattn/error.h"

#if KVATTN_WITH_CUDA
#include "core/overrides.h"
#include "cuda/kernel_registry.h"
#include "cuda/runtime.h"

namespace {
using namespace kvattn::cuda;

struct JitOptions {
  std::vector<std::string> archs;
  std::string preset = "default";
  int jobs = 0;
  std::string cache_dir;
  bool with_overrides = false;  // the environment's KVATTN_* overrides change what the presets choose
  // --variant FILE: a user variant's source (docs/VARIANTS.md) and its declared parameters.
  std::string variant_file, variant_name = "custom";
  std::vector<std::string> f32_params, i32_params, tensor_params;  // tensors as name:dtype:ndim
};

// The user variant of --variant FILE, declared as the options say.
kvattn::CustomVariant user_variant(const JitOptions& o) {
  kvattn::CustomVariant v;
  v.name = o.variant_name;
  std::ifstream f(o.variant_file);
  KVATTN_CHECK(f.good(), "--variant: cannot read ", o.variant_file);
  std::ostringstream os;
  os << f.rdbuf();
  v.source = os.str();
  v.f32_params = o.f32_params;
  v.i32_params = o.i32_params;
  for (const std::string& t : o.tensor_params) {
    const auto a = t.find(':'), b = t.rfind(':');
    KVATTN_CHECK(a != std::string::npos && b > a, "--tensor ", t, ": expected name:dtype:ndim (e.g. slopes:f32:1)");
    const std::string dtype = t.substr(a + 1, b - a - 1), ndim = t.substr(b + 1);
    KVATTN_CHECK(dtype == "f32" || dtype == "i32" || dtype == "u8", "--tensor ", t, ": dtype ", dtype,
                 " is not f32, i32 or u8");
    KVATTN_CHECK(ndim.size() == 1 && ndim[0] >= '1' && ndim[0] <= '4', "--tensor ", t, ": ndim ", ndim,
                 " is not 1 to 4");
    v.tensor_params.push_back({t.substr(0, a),
                               dtype == "f32" ? kvattn::DType::f32 : dtype == "i32" ? kvattn::DType::i32 : kvattn::DType::u8,
                               ndim[0] - '0'});
  }
  v.validate();
  return v;
}

std::vector<std::string> archs_or_device(const JitOptions& o) {
  if (!o.archs.empty()) return o.archs;
  std::string why;
  if (!cuda_available(&why))
    kvattn::detail::throw_error("no --arch given and no CUDA device to take it from (", why,
                                "); pass e.g. --arch sm_90a");
  return {device_info(current_device()).arch};
}

std::string cache_dir(const JitOptions& o) {
  return o.cache_dir.empty() ? default_cache_dir().string() : o.cache_dir;
}

void list(const JitOptions& o) {
  std::printf("JIT cache: %s\n", cache_dir(o).c_str());
  for (const Preset& p : presets()) {
    std::printf("preset %s: %s (%zu kernels)\n", p.name.c_str(), p.description.c_str(), p.kernels.size());
    DiskCache disk(cache_dir(o));
    for (const auto& k : p.kernels) {
      std::printf("  %s", k.name.c_str());
      if (k.min_sm > 0) std::printf(" (sm_%d+)", k.min_sm);
      if (k.below_sm > 0) std::printf(" (below sm_%d)", k.below_sm);
      for (const std::string& arch : o.archs) {
        if (!k.for_arch(arch_sm(arch))) {
          std::printf("  %s:n/a", arch.c_str());
          continue;
        }
        bool cached = std::filesystem::exists(disk.entry_path(kernel_key(k.make(arch))));
        std::printf("  %s:%s", arch.c_str(), cached ? "cached" : "-");
      }
      std::printf("\n");
    }
  }
}

struct Job {
  KernelSpec spec;
  CubinLookup result;
  std::string error;
};

void precompile(const JitOptions& o) {
  std::vector<Job> jobs;
  for (const std::string& arch : archs_or_device(o)) {
    check_arch(arch);
    const kvattn::detail::Overrides env = kvattn::detail::Overrides::from_environment();
    auto specs = o.variant_file.empty() ? preset_specs(o.preset, arch, o.with_overrides ? &env : nullptr)
                                        : user_variant_specs(user_variant(o), arch);
    for (KernelSpec& s : specs) jobs.push_back({std::move(s), {}, {}});
  }
  KernelCache cache(cache_dir(o));
  int workers = o.jobs > 0 ? o.jobs : int(std::max(1u, std::thread::hardware_concurrency()));
  workers = std::min<int>(workers, int(jobs.size()));
  const std::string what = o.variant_file.empty() ? "preset " + o.preset : "user variant " + o.variant_name;
  std::fprintf(stderr, "precompiling %zu kernels (%s) with %d jobs into %s\n", jobs.size(), what.c_str(), workers,
               cache.dir().c_str());

  // Workers take the next job; one line per finished kernel is the progress bar (CI logs keep it).
  auto t0 = std::chrono::steady_clock::now();
  std::atomic<size_t> next{0}, done{0};
  std::mutex print;
  auto work = [&] {
    for (size_t i; (i = next++) < jobs.size();) {
      Job& j = jobs[i];
      try {
        j.result = cache.cubin(j.spec);
      } catch (const std::exception& e) {
        j.error = e.what();
      }
      std::lock_guard lock(print);
      size_t n = ++done;
      int width = 24, filled = int(width * n / jobs.size());
      std::fprintf(stderr, "[%s%s] %zu/%zu %8.1f ms  %-8s %s %s\n", std::string(filled, '#').c_str(),
                   std::string(width - filled, '.').c_str(), n, jobs.size(), j.result.seconds * 1e3,
                   j.error.empty() ? to_string(j.result.source) : "FAILED", j.spec.name.c_str(),
                   j.spec.arch.c_str());
    }
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) threads.emplace_back(work);
  for (auto& t : threads) t.join();
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int compiled = 0, cached = 0, failed = 0;
  double compile_sum = 0, compile_max = 0;
  for (const Job& j : jobs) {
    if (!j.error.empty()) {
      ++failed;
      std::fprintf(stderr, "\n%s (%s) failed:\n%s\n", j.spec.name.c_str(), j.spec.arch.c_str(), j.error.c_str());
    } else if (j.result.source == CacheSource::compiled) {
      ++compiled, compile_sum += j.result.seconds, compile_max = std::max(compile_max, j.result.seconds);
    } else {
      ++cached;
    }
  }
  std::printf("%zu kernels in %.2f s wall (%d jobs): %d compiled (sum %.2f s, max %.2f s), "
              "%d already cached, %d failed\n",
              jobs.size(), wall, workers, compiled, compile_sum, compile_max, cached, failed);
  if (failed) throw CLI::RuntimeError(1);
}

}  // namespace
#endif

void register_jit_command(CLI::App& app) {
  auto* jit = app.add_subcommand("jit", "The JIT's built-in kernel presets and disk cache");
#if KVATTN_WITH_CUDA
  jit->require_subcommand(1);
  auto o = std::make_shared<JitOptions>();
  auto* ls = jit->add_subcommand("list", "List the presets and their kernels (with --arch: which are cached)");
  ls->add_option("--arch", o->archs, "Show cache state for this arch (repeatable), e.g. sm_90a");
  ls->add_option("--cache-dir", o->cache_dir, "Cache directory (default: $KVATTN_CACHE_DIR, else "
                                              "$XDG_CACHE_HOME/kvattn, else ~/.cache/kvattn)");
  ls->callback([o] { list(*o); });

  auto* pc = jit->add_subcommand("precompile", "Compile a preset's kernels into the disk cache (no GPU needed)");
  pc->add_option("--arch", o->archs, "Target arch (repeatable): sm_90a, sm_80, sm_86, sm_89...; "
                                     "default: the current GPU's");
  pc->add_option("--preset", o->preset, "Preset to compile")->capture_default_str();
  pc->add_option("--jobs,-j", o->jobs, "Parallel compiles (default: the number of cores)");
  pc->add_option("--cache-dir", o->cache_dir, "Cache directory (default: $KVATTN_CACHE_DIR, else "
                                              "$XDG_CACHE_HOME/kvattn, else ~/.cache/kvattn)");
  pc->add_flag("--with-overrides", o->with_overrides,
               "Let the KVATTN_* overrides of the environment change the kernels the preset chooses "
               "(default: they are ignored)");
  pc->add_option("--variant", o->variant_file,
                 "Compile a user variant (docs/VARIANTS.md) from this source file into the default preset's "
                 "decode and prefill kernels, instead of a preset")
      ->type_name("FILE");
  pc->add_option("--variant-name", o->variant_name, "The user variant's name (an identifier)")->capture_default_str();
  pc->add_option("--f32", o->f32_params, "Its f32 scalar parameters, comma-separated")->delimiter(',');
  pc->add_option("--i32", o->i32_params, "Its i32 scalar parameters, comma-separated")->delimiter(',');
  pc->add_option("--tensor", o->tensor_params, "Its tensor parameters as name:dtype:ndim (repeatable), e.g. slopes:f32:1");
  pc->callback([o] { precompile(*o); });
#else
  jit->callback([] {
    throw kvattn::Error("this kvattn was built without the CUDA backend (KVATTN_WITH_CUDA=OFF)");
  });
#endif
}
