// Fail-fast invariant checks. An invariant violated inside the engine is a bug: print
// file:line and the failed condition, then abort. Bad input from outside is never
// checked with these; it raises sala::Error (see error.h) with a message for the user.
#pragma once
#include <fmt/core.h>

#include <cstdio>
#include <cstdlib>

namespace sala::detail {
[[noreturn]] inline void check_failed(const char* file, int line, const char* cond,
                                      const std::string& msg) {
  std::fprintf(stderr, "%s:%d: check failed: %s %s\n", file, line, cond, msg.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace sala::detail

#define SALA_CHECK(cond, ...)                                                         \
  do {                                                                                \
    if (!(cond)) [[unlikely]]                                                         \
      ::sala::detail::check_failed(__FILE__, __LINE__, #cond, fmt::format("" __VA_ARGS__)); \
  } while (0)
