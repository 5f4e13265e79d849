// Errors caused by input from outside the engine (files, requests, flags). They carry a
// message meant for the user and are caught at the CLI / HTTP boundary.
#pragma once
#include <fmt/core.h>

#include <stdexcept>
#include <string>

namespace sala {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace sala
