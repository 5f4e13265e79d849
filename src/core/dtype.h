// Element types of tensors in checkpoints and in backend memory, and bf16/fp16 <-> fp32
// (fp8 e4m3fn / e5m2 <-> fp32: core/fp8.h).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

namespace sala {

// F8_E4M3: fp8 e4m3fn codes (core/fp8.h), as quantized checkpoints store weights.
// I64: integer metadata only (compressed-tensors' weight_shape, torch.tensor(shape)).
enum class DType : uint8_t { F32, BF16, F16, I32, F8_E4M3, I64 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::F8_E4M3: return 1;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::F8_E4M3: return "F8_E4M3";
  }
  return "?";
}

// bf16 is the upper half of an IEEE fp32: upcast is exact.
inline float bf16_to_f32(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, NaN kept quiet (what PyTorch's .to(bfloat16) does).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace sala
