// libFuzzer harness: safetensors files (core/safetensors.cpp). The input is the whole file
// (8-byte header length, JSON header, data); it is written to a temporary file because
// SafetensorsFile maps a path, as the loader does. Every header must be validated: the file is
// refused with a sala::Error, or every tensor view lies inside the file and can be read.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "fuzz_common.h"

namespace {
const std::string& tmp_path() {
  static const std::string p = [] {
    const char* d = std::getenv("TMPDIR");
    return std::string(d ? d : "/tmp") + "/sala-fuzz-safetensors-" + std::to_string(::getpid());
  }();
  return p;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    FILE* f = std::fopen(tmp_path().c_str(), "wb");
    if (!f) sala::fuzz::finding("cannot write", tmp_path());
    if (size) std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  sala::fuzz::expect_clear_error([&] {
    sala::SafetensorsFile st(tmp_path());
    for (auto& [name, t] : st.tensors()) {
      const uint8_t* end = t.data + t.nbytes;
      (void)name;
      // Touch the first and last byte: ASan / a fault catches a view outside the mapping.
      volatile uint8_t sink = 0;
      if (t.nbytes) sink = sink + t.data[0] + end[-1];
      if (t.numel() > 0 && t.numel() < (1 << 16)) {
        std::vector<float> out(size_t(t.numel()));
        t.to_f32(out.data());
      }
    }
  });
  std::remove(tmp_path().c_str());
  return 0;
}
