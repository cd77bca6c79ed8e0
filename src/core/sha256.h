// SHA-256 (FIPS 180-4), hand-written so the JIT's cache keys and entry checksums need no crypto
// library. Not constant-time and not meant for secrets: it names and checks cache files.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvattn::detail {

class Sha256 {
 public:
  Sha256();
  Sha256& update(const void* data, size_t size);
  Sha256& update(std::string_view s) { return update(s.data(), s.size()); }
  // Hashes a length-prefixed field, so ("ab", "c") and ("a", "bc") give different keys.
  Sha256& field(std::string_view s);
  std::array<uint8_t, 32> digest();  // finishes the hash; the object is spent afterwards
  std::string hex_digest();

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(std::string_view data);
std::string to_hex(const uint8_t* data, size_t size);

}  // namespace kvattn::detail
