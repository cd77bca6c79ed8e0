// kvattn's one exception type. Every validation failure throws it with a message that names the
// argument and the offending value, e.g. "kv_indices[17] = 9001 is out of range [0, 512)".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvattn {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {
template <class... Parts>
[[noreturn]] void throw_error(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  throw Error(os.str());
}
}  // namespace detail

}  // namespace kvattn

// KVATTN_CHECK(cond, "q has ", n, " heads") throws kvattn::Error with the concatenated message.
#define KVATTN_CHECK(cond, ...)                                    \
  do {                                                             \
    if (!(cond)) ::kvattn::detail::throw_error(__VA_ARGS__);       \
  } while (0)
