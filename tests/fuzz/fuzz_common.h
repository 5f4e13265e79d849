// Shared by the libFuzzer harnesses (tests/fuzz/README.md). Each harness feeds outside input
// to the real library code. The product's contract for bad input is a clear error: a
// sala::Error (which includes the engine's InvalidRequest) or the server's ApiError. Any other
// exception would reach the client as a 500 or end the process, so it is a finding: the
// harness aborts, and libFuzzer saves the input. Crashes, ASan and UBSan reports stop the
// fuzzer by themselves.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "core/error.h"

namespace sala::fuzz {

[[noreturn]] inline void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "FUZZ FINDING: %s: %s\n", what, detail.c_str());
  std::abort();
}

// Runs fn; a sala::Error (or a subclass, e.g. the server's errors deriving from it) is the
// expected outcome for bad input. Extra accepted error types are caught by `fn` itself.
template <typename Fn>
void expect_clear_error(Fn&& fn) {
  try {
    fn();
  } catch (const sala::Error&) {
  } catch (const std::exception& e) {
    finding("unexpected exception type", e.what());
  } catch (...) {
    finding("unexpected exception", "not a std::exception");
  }
}

// The bundled tiny model (its tokenizer, chat template, config.json): the harnesses that need
// a model directory read it once; SALA_SOURCE_DIR is set by tests/fuzz/CMakeLists.txt.
inline std::string tiny_model_dir() {
  if (const char* d = std::getenv("SALA_FUZZ_MODEL_DIR")) return d;
  return std::string(SALA_SOURCE_DIR) + "/models/sala-tiny-chat";
}

}  // namespace sala::fuzz
