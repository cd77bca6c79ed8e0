#include "cuda/jit.h"

#include <chrono>

#include "cuda/embedded_kernels.h"
#include "cuda/runtime.h"
#include "core/sha256.h"
#include "kvattn/error.h"
#include "kvattn/version.h"

namespace kvattn::cuda {
namespace {

// Bump when the meaning of a key's inputs changes (e.g. a new implicit option).
constexpr const char* kKeyFormat = "kvattn-jit-key-1";

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

const char* to_string(CacheSource s) {
  switch (s) {
    case CacheSource::memory: return "memory";
    case CacheSource::disk: return "disk";
    case CacheSource::compiled: return "compiled";
  }
  return "?";
}

std::string kernel_key(const KernelSpec& spec) {
  // The embedded headers are hashed once at build time (embedded_kernels_sha256), so a key costs
  // one SHA-256 over a few hundred bytes: about a microsecond.
  // The fields common to every key are absorbed once; each key copies that state.
  static const Sha256 prefix = [] {
    Sha256 h;
    h.field(kKeyFormat).field(std::to_string(kDiskFormatVersion)).field(kVersion);
    h.field(nvrtc_version()).field(embedded_kernels_sha256());
    h.field(std::to_string(base_nvrtc_options().size()));
    for (const auto& o : base_nvrtc_options()) h.field(o);
    return h;
  }();
  Sha256 h = prefix;
  h.field(spec.arch).field(spec.entry);
  h.field(std::to_string(spec.options.size()));
  for (const auto& o : spec.options) h.field(o);
  h.field(spec.source);
  return h.hex_digest();
}

KernelCache::KernelCache(std::filesystem::path dir) : disk_(std::move(dir)) {}

KernelCache::~KernelCache() {
  for (auto& [key, s] : slots_)
    if (s->library) cudaLibraryUnload(s->library);  // best effort
}

KernelCache& KernelCache::global() {
  static KernelCache* cache = new KernelCache(default_cache_dir());
  return *cache;
}

std::shared_ptr<KernelCache::Slot> KernelCache::slot(const std::string& key) {
  std::lock_guard lock(mutex_);
  auto& s = slots_[key];
  if (!s) s = std::make_shared<Slot>();
  return s;
}

// Called with s.mutex held and s.cubin empty.
CubinLookup KernelCache::fill(Slot& s, const KernelSpec& spec, const std::string& key) {
  auto t0 = std::chrono::steady_clock::now();
  CubinLookup r;
  r.key = key;
  if (auto cached = disk_.load(key)) {
    s.cubin = std::make_shared<const std::vector<char>>(std::move(*cached));
    r.source = CacheSource::disk;
  } else {
    CompileResult c = compile_to_cubin(spec);
    disk_.store(key, c.cubin);
    s.cubin = std::make_shared<const std::vector<char>>(std::move(c.cubin));
    r.source = CacheSource::compiled;
  }
  r.cubin = s.cubin;
  r.seconds = seconds_since(t0);
  return r;
}

CubinLookup KernelCache::cubin(const KernelSpec& spec) {
  auto t0 = std::chrono::steady_clock::now();
  std::string key = kernel_key(spec);
  std::shared_ptr<Slot> s = slot(key);
  std::lock_guard lock(s->mutex);
  if (!s->cubin) return fill(*s, spec, key);
  return {s->cubin, key, CacheSource::memory, seconds_since(t0)};
}

cudaKernel_t KernelCache::kernel(const KernelSpec& spec) {
  require_cuda(spec.name.c_str());
  std::string key = kernel_key(spec);
  std::shared_ptr<Slot> s = slot(key);
  std::lock_guard lock(s->mutex);
  if (s->kernel) return s->kernel;
  if (!s->cubin) fill(*s, spec, key);
  // A cudaLibrary_t is context-independent: the runtime loads it into each device's context when
  // the kernel is first used there, so one handle serves every device of this arch.
  check(cudaLibraryLoadData(&s->library, s->cubin->data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
        ("loading the cubin of " + spec.name + " (" + spec.arch + ")").c_str());
  cudaError_t err = cudaLibraryGetKernel(&s->kernel, s->library, spec.entry.c_str());
  if (err != cudaSuccess) {
    cudaLibraryUnload(s->library);
    s->library = nullptr;
    check(err, ("finding entry " + spec.entry + " of " + spec.name).c_str());
  }
  return s->kernel;
}

int32_t KernelCache::device_int(const KernelSpec& spec, const char* symbol) {
  kernel(spec);
  std::shared_ptr<Slot> s = slot(kernel_key(spec));
  void* ptr = nullptr;
  size_t bytes = 0;
  {
    std::lock_guard lock(s->mutex);
    check(cudaLibraryGetGlobal(&ptr, &bytes, s->library, symbol),
          ("finding " + std::string(symbol) + " in " + spec.name).c_str());
  }
  KVATTN_CHECK(bytes == sizeof(int32_t), spec.name, ": ", symbol, " has ", bytes, " bytes, not 4");
  int32_t value = 0;
  check(cudaMemcpy(&value, ptr, sizeof value, cudaMemcpyDeviceToHost), ("reading " + std::string(symbol)).c_str());
  return value;
}

std::string entry_symbol(const std::string& name) {
  std::string e = "kvattn_" + name;
  for (char& ch : e)
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_')) ch = '_';
  return e;
}

}  // namespace kvattn::cuda
