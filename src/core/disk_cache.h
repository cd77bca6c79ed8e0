// The JIT's on-disk cubin cache: one file per kernel key, shared by every process that uses the
// same directory.
//
// Entry file <dir>/<key>.cubin:
//   "KVATTNJ\n"         8-byte magic
//   u32 format version  (kDiskFormatVersion)
//   u32 header size     (kHeaderSize)
//   char key[64]        the kernel key (hex), guards against a renamed or misplaced file
//   u64 payload size
//   u8 sha256[32]       of the payload
//   payload             the cubin
// Writes go to a unique temporary file in the same directory, then rename(): readers see either
// no entry or a whole one, and concurrent writers of the same key each install a valid copy.
// A truncated or corrupt entry (a crash mid-write on a filesystem without ordered writes, a bad
// disk, a hand edit) fails the checks, is reported on stderr, deleted and rebuilt; it is never
// loaded.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace kvattn::detail {

inline constexpr uint32_t kDiskFormatVersion = 1;

// $KVATTN_CACHE_DIR, else $XDG_CACHE_HOME/kvattn, else $HOME/.cache/kvattn, else a directory under
// the system temp dir (a service account without HOME still gets a cache).
std::filesystem::path default_cache_dir();

class DiskCache {
 public:
  // An empty path disables the disk cache (loads miss, stores do nothing).
  explicit DiskCache(std::filesystem::path dir);

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path entry_path(const std::string& key) const;

  // The payload of a valid entry; nullopt when there is none. An invalid entry is reported,
  // deleted, and reported as missing.
  std::optional<std::vector<char>> load(const std::string& key) const;

  // Installs an entry atomically. A failure (read-only or full disk) is reported once per process
  // on stderr and otherwise ignored: the kernel still runs, it is only not cached.
  void store(const std::string& key, const std::vector<char>& payload) const;

 private:
  std::filesystem::path dir_;
};

}  // namespace kvattn::detail
