#include "core/disk_cache.h"

#include "core/overrides.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "core/sha256.h"

namespace kvattn::detail {
namespace fs = std::filesystem;
namespace {

constexpr char kMagic[8] = {'K', 'V', 'A', 'T', 'T', 'N', 'J', '\n'};
constexpr size_t kKeySize = 64;
constexpr size_t kHeaderSize = 8 + 4 + 4 + kKeySize + 8 + 32;
constexpr uint64_t kMaxPayload = uint64_t(1) << 30;  // a cubin larger than 1 GiB is corruption

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <class T>
T get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Returns "" when the entry is valid, else why not.
std::string validate(const std::string& data, const std::string& key) {
  if (data.size() < kHeaderSize) return "truncated header (" + std::to_string(data.size()) + " bytes)";
  const char* p = data.data();
  if (std::memcmp(p, kMagic, 8) != 0) return "bad magic";
  if (get<uint32_t>(p + 8) != kDiskFormatVersion) return "format version " + std::to_string(get<uint32_t>(p + 8));
  if (get<uint32_t>(p + 12) != kHeaderSize) return "bad header size";
  if (std::string_view(p + 16, kKeySize) != key) return "key mismatch";
  uint64_t size = get<uint64_t>(p + 16 + kKeySize);
  if (size > kMaxPayload || size != data.size() - kHeaderSize)
    return "payload size " + std::to_string(data.size() - kHeaderSize) + " != recorded " + std::to_string(size);
  auto sum = Sha256().update(p + kHeaderSize, size).digest();
  if (std::memcmp(sum.data(), p + 16 + kKeySize + 8, 32) != 0) return "checksum mismatch";
  return "";
}

bool read_file(const fs::path& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  out = std::move(ss).str();
  return true;
}

// pid + a per-process random number + a counter: unique among processes and threads.
std::string temp_name(const std::string& key) {
  static const uint64_t salt = std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);
  static std::atomic<uint64_t> counter{0};
  std::ostringstream os;
  os << "." << key << ".tmp." << getpid() << "." << std::hex << salt << "." << counter++;
  return os.str();
}

bool write_all(int fd, const char* p, size_t n) {
  while (n) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w, n -= size_t(w);
  }
  return true;
}

void warn_store_once(const std::string& message) {
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) std::fprintf(stderr, "kvattn: JIT disk cache disabled: %s\n", message.c_str());
}

}  // namespace

fs::path default_cache_dir() {
  if (const auto d = detail::cache_dir_setting()) return *d;
  if (const auto d = detail::system_environment("XDG_CACHE_HOME")) return fs::path(*d) / "kvattn";
  if (const auto d = detail::system_environment("HOME")) return fs::path(*d) / ".cache" / "kvattn";
  return fs::temp_directory_path() / ("kvattn-cache-" + std::to_string(getuid()));
}

DiskCache::DiskCache(fs::path dir) : dir_(std::move(dir)) {}

fs::path DiskCache::entry_path(const std::string& key) const { return dir_ / (key + ".cubin"); }

std::optional<std::vector<char>> DiskCache::load(const std::string& key) const {
  if (dir_.empty()) return std::nullopt;
  fs::path path = entry_path(key);
  std::string data;
  if (!read_file(path, data)) return std::nullopt;
  if (std::string why = validate(data, key); !why.empty()) {
    std::fprintf(stderr, "kvattn: JIT cache entry %s is invalid (%s); rebuilding it\n",
                 path.c_str(), why.c_str());
    std::error_code ec;
    fs::remove(path, ec);  // another process may have replaced or removed it already: fine
    return std::nullopt;
  }
  return std::vector<char>(data.begin() + kHeaderSize, data.end());
}

void DiskCache::store(const std::string& key, const std::vector<char>& payload) const {
  if (dir_.empty()) return;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return warn_store_once("cannot create " + dir_.string() + ": " + ec.message());

  std::string header;
  header.append(kMagic, 8);
  put<uint32_t>(header, kDiskFormatVersion);
  put<uint32_t>(header, uint32_t(kHeaderSize));
  header.append(key);
  put<uint64_t>(header, payload.size());
  auto sum = Sha256().update(payload.data(), payload.size()).digest();
  header.append(reinterpret_cast<const char*>(sum.data()), sum.size());

  fs::path tmp = dir_ / temp_name(key);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return warn_store_once("cannot write " + tmp.string() + ": " + std::strerror(errno));
  // fsync before rename: after a crash the entry is whole or absent, not an empty file.
  bool ok = write_all(fd, header.data(), header.size()) &&
            write_all(fd, payload.data(), payload.size()) && ::fsync(fd) == 0;
  int saved = errno;
  ok = (::close(fd) == 0) && ok;
  if (ok && ::rename(tmp.c_str(), entry_path(key).c_str()) == 0) return;
  if (!ok) errno = saved;
  std::string why = std::strerror(errno);
  ::unlink(tmp.c_str());
  warn_store_once("cannot install " + entry_path(key).string() + ": " + why);
}

}  // namespace kvattn::detail
