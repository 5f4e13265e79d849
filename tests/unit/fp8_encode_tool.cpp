// Writes core/fp8.h's encodings of a spread of fp32 bit patterns to stdout, for
// fp8_vs_ml_dtypes.py to compare with the ml_dtypes package (a well-kept independent
// implementation of the formats). Patterns: u = 0, STRIDE, 2·STRIDE, ... < 2^32 (every sign,
// exponent, subnormals, inf and NaN); per pattern two bytes: e4m3fn, e5m2.
// Usage: fp8_encode_tool STRIDE
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/fp8.h"

int main(int argc, char** argv) {
  const uint64_t stride = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 0;
  if (stride == 0) {
    std::fprintf(stderr, "usage: fp8_encode_tool STRIDE (> 0)\n");
    return 2;
  }
  std::vector<uint8_t> out;
  for (uint64_t u = 0; u <= 0xffffffffull; u += stride) {
    const uint32_t b = uint32_t(u);
    float f;
    std::memcpy(&f, &b, 4);
    out.push_back(sala::f32_to_fp8_e4m3(f));
    out.push_back(sala::f32_to_fp8_e5m2(f));
  }
  return std::fwrite(out.data(), 1, out.size(), stdout) == out.size() ? 0 : 1;
}
