// core/error.h — the one exception type of fastpath and the FP_CHECK macro.
// Errors carry context: which file, tensor or field, what was expected and what was found.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace fp {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
inline void append(std::ostringstream&) {}
template <class T, class... Rest>
void append(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  append(os, rest...);
}
}  // namespace detail

// Builds a message from any streamable pieces: fail("file ", path, ": bad magic ", m).
template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  std::ostringstream os;
  detail::append(os, args...);
  throw Error(os.str());
}

}  // namespace fp

// FP_CHECK(cond, "what", value, "and why") throws fp::Error with the message when cond is false.
#define FP_CHECK(cond, ...)          \
  do {                               \
    if (!(cond)) ::fp::fail(__VA_ARGS__); \
  } while (0)
