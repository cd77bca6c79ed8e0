// The JIT: device code is specialised at run time into a tiny generated translation unit that
// includes the embedded kernel headers and defines one extern "C" __global__ entry, compiled with
// NVRTC to a cubin for one arch, cached on disk and in process, and loaded with the runtime API
// (cudaLibraryLoadData). Compiling needs no GPU (precompile, CI); loading needs one.
#pragma once

#include <cuda_runtime_api.h>

#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/disk_cache.h"
#include "core/sha256.h"

namespace kvattn::cuda {

using detail::default_cache_dir;
using detail::DiskCache;
using detail::kDiskFormatVersion;
using detail::Sha256;


// Everything that determines one compiled kernel. Two specs with the same key compile to the same
// cubin; `name` is for people (progress bar, errors) and is not part of the key.
struct KernelSpec {
  std::string name;                  // "merge_states_bf16"
  std::string entry;                 // the extern "C" __global__ symbol `source` defines
  std::string source;                // generated TU: #include "kernels/..." + the entry
  std::vector<std::string> options;  // extra NVRTC options, e.g. "-DKVATTN_TILE=64"
  std::string arch;                  // "sm_90a", "sm_80", ...
  // A user variant's file name ("<name>.variant", as #line gives it in `source`) and text, so that
  // a failure quotes the user's own lines first. Not part of the key (`source` holds the text).
  std::string user_file, user_source;
};

// The extern "C" symbol of a kernel named `name`: "kvattn_" + the name with every character that
// cannot be in an identifier ('-' of the tuning names) as '_'.
std::string entry_symbol(const std::string& name);

// Options every compile gets before spec.options: C++20, device code by default, line info for
// profilers. No fast math unless a spec asks for it.
const std::vector<std::string>& base_nvrtc_options();
std::string nvrtc_version();  // "13.0"
// Throws kvattn::Error unless `arch` is "sm_<digits>[a]" and NVRTC can target it.
void check_arch(const std::string& arch);
// The compute capability of an arch name: "sm_90a" -> 90, "sm_80" -> 80 (kvattn::Error if malformed).
int arch_sm(const std::string& arch);

// SHA-256 (64 hex chars) over the key format version, kvattn's version, NVRTC's version, the hash
// of every embedded header, the arch, the options and the source.
std::string kernel_key(const KernelSpec& spec);

struct CompileResult {
  std::vector<char> cubin;
  std::string log;  // NVRTC's log (warnings), usually empty
  double seconds = 0;
};
// Compiles with NVRTC; no GPU needed. On failure throws kvattn::Error with NVRTC's log, the lines
// of the generated source and headers the log points at, and the whole generated source, numbered.
CompileResult compile_to_cubin(const KernelSpec& spec);

// Where a lookup found its cubin.
enum class CacheSource { memory, disk, compiled };
const char* to_string(CacheSource s);

struct CubinLookup {
  std::shared_ptr<const std::vector<char>> cubin;
  std::string key;
  CacheSource source = CacheSource::compiled;
  double seconds = 0;  // wall time of this lookup (compile time when compiled)
};

// Memory -> disk -> NVRTC, per key. Thread-safe: different keys compile in parallel, callers of
// one key wait for the first compile. Several processes may share one directory.
class KernelCache {
 public:
  explicit KernelCache(std::filesystem::path dir);  // empty: no disk cache
  ~KernelCache();                                   // unloads the libraries it loaded
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  // The process-wide cache in default_cache_dir(); never destroyed (its libraries live as long as
  // the process, so no unload races the CUDA runtime's own teardown at exit).
  static KernelCache& global();

  CubinLookup cubin(const KernelSpec& spec);
  // The loaded kernel, usable with cudaLaunchKernel / cudaLaunchKernelExC (cast to const void*)
  // and cudaFuncSetAttribute on every device of spec.arch. Needs a device.
  cudaKernel_t kernel(const KernelSpec& spec);
  // The value of the `extern "C" __device__ const int` named `symbol` in spec's module (loaded as
  // kernel() loads it), read from the current device. Synchronous: for plan(), not run().
  int32_t device_int(const KernelSpec& spec, const char* symbol);

  const std::filesystem::path& dir() const { return disk_.dir(); }

 private:
  struct Slot {
    std::mutex mutex;  // held while compiling / loading this key
    std::shared_ptr<const std::vector<char>> cubin;
    cudaLibrary_t library = nullptr;
    cudaKernel_t kernel = nullptr;
  };
  std::shared_ptr<Slot> slot(const std::string& key);
  CubinLookup fill(Slot& s, const KernelSpec& spec, const std::string& key);

  DiskCache disk_;
  std::mutex mutex_;  // guards slots_ only; never held during a compile
  std::unordered_map<std::string, std::shared_ptr<Slot>> slots_;
};

}  // namespace kvattn::cuda
