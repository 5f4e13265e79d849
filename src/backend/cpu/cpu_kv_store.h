// One array of the CPU backend's sparse-layer caches (K, V, or a level of compressed keys):
// fp32 values (bf16-representable in BF16 mode) for KvCacheDtype::Auto, or one byte per
// element (FP8 codes with the array's scale, backend/kv_cache_dtype.h) for an FP8 cache, so
// the pool really takes 1 byte per element (CpuBackend::kv_element_bytes). Offsets are in
// elements (backend/cache_layout.h); writers quantize, readers dequantize into a scratch row.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/kv_cache_dtype.h"
#include "core/check.h"

namespace sala {

class CpuKvArray {
 public:
  void init(size_t elements, KvCacheDtype dtype, float scale) {
    SALA_CHECK(scale > 0.f && std::isfinite(scale), "KV scale {} must be finite and > 0", scale);
    dtype_ = dtype;
    scale_ = scale;
    if (kv_is_fp8(dtype)) {
      f32_.clear();
      codes_.assign(elements, 0);
    } else {
      codes_.clear();
      f32_.assign(elements, 0.f);
    }
  }
  // Elements [off, off + n) = src[0, n) (quantized in an FP8 cache).
  void store(size_t off, const float* src, int64_t n) {
    if (!kv_is_fp8(dtype_)) {
      std::copy(src, src + n, f32_.begin() + long(off));
      return;
    }
    for (int64_t e = 0; e < n; ++e) codes_[off + size_t(e)] = kv_fp8_encode(src[e], dtype_, scale_);
  }
  // The values of elements [off, off + n): a pointer into the fp32 array, or `buf` (room for
  // n floats) filled with the dequantized codes.
  const float* read(size_t off, int64_t n, float* buf) const {
    if (!kv_is_fp8(dtype_)) return f32_.data() + off;
    for (int64_t e = 0; e < n; ++e) buf[e] = kv_fp8_decode(codes_[off + size_t(e)], dtype_, scale_);
    return buf;
  }
  KvCacheDtype dtype() const { return dtype_; }
  float scale() const { return scale_; }
  const std::vector<uint8_t>& codes() const { return codes_; }  // FP8 caches (tests)

 private:
  KvCacheDtype dtype_ = KvCacheDtype::Auto;
  float scale_ = kDefaultKvScale;
  std::vector<float> f32_;
  std::vector<uint8_t> codes_;
};

}  // namespace sala
