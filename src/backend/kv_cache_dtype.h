// The element type of the sparse layers' KV caches (K, V pages and the InfLLM-v2 compressed
// keys of level 1 and 2), BackendOptions::kv_cache_dtype, under SGLang's `--kv-cache-dtype`
// names, and the FP8 quantization of one cached element.
//
// FP8 KV (vLLM's recipe, one fp32 scale per sparse layer for K and one for V):
//   code  = fp8(x / scale)      saturating: e4m3 clamps to ±448 (core/fp8.h), e5m2 is clamped
//                               to ±57344 before the cast, so no element becomes inf
//   value = fp8_to_f32(code) * scale
// The scales come from the checkpoint (model.layers.N.self_attn.k_scale / v_scale, the names
// compressed-tensors' kv_cache_scheme writes and vLLM / SGLang load; see model/weights.h),
// else kDefaultKvScale. The compressed keys are means of keys, so they use the layer's k_scale.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>

#include "core/fp8.h"

namespace sala {

enum class KvCacheDtype {
  Auto,      // the activation type's cache: fp32 on the CPU (bf16 values in BF16 mode), bf16 on CUDA
  FP8_E4M3,  // `fp8_e4m3` (also `fp8`, vLLM's name for it)
  FP8_E5M2,  // `fp8_e5m2`
};

// vLLM's default k_scale / v_scale when the checkpoint has none (the codes are then the
// values themselves, rounded; fine for keys/values of magnitude well below 448).
inline constexpr float kDefaultKvScale = 1.f;

// "auto", "fp8_e4m3", "fp8_e5m2". Inline: the CUDA backend's library names them too.
inline const char* kv_cache_dtype_name(KvCacheDtype t) {
  switch (t) {
    case KvCacheDtype::Auto: return "auto";
    case KvCacheDtype::FP8_E4M3: return "fp8_e4m3";
    case KvCacheDtype::FP8_E5M2: return "fp8_e5m2";
  }
  return "?";
}
// SGLang's names ("auto", "fp8_e4m3", "fp8_e5m2", and "fp8" for e4m3); sala::Error naming
// `what` (the flag or spec) and the accepted values for anything else.
KvCacheDtype parse_kv_cache_dtype(const std::string& s, const std::string& what = "--kv-cache-dtype");

inline bool kv_is_fp8(KvCacheDtype t) { return t != KvCacheDtype::Auto; }

// The stored code of x in an FP8 cache with this scale (t is FP8_E4M3 or FP8_E5M2).
inline uint8_t kv_fp8_encode(float x, KvCacheDtype t, float scale) {
  const float y = x / scale;
  if (t == KvCacheDtype::FP8_E4M3) return f32_to_fp8_e4m3(y);
  return f32_to_fp8_e5m2(std::clamp(y, -kFp8E5m2Max, kFp8E5m2Max));  // NaN passes through
}
// The value a code of an FP8 cache stands for.
inline float kv_fp8_decode(uint8_t c, KvCacheDtype t, float scale) {
  return (t == KvCacheDtype::FP8_E4M3 ? fp8_e4m3_to_f32(c) : fp8_e5m2_to_f32(c)) * scale;
}
// x as an FP8 cache gives it back: decode(encode(x)).
inline float kv_fp8_round(float x, KvCacheDtype t, float scale) {
  return kv_fp8_decode(kv_fp8_encode(x, t, scale), t, scale);
}

// K and V scales of one sparse layer.
struct KvScales {
  float k = kDefaultKvScale, v = kDefaultKvScale;
};

}  // namespace sala
