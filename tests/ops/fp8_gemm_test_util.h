// Helpers of the FP8 GEMM op tests (test_cuda_fp8_gemm.cpp, test_cuda_fp8_decode.cpp): a
// device buffer, an FP8 weight on both backends, and the GPU-vs-CPU criterion of FP8 GEMMs.
#pragma once
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cuda_test_util.h"

namespace sala::test {

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(bytes, 16)), cudaSuccess);
  }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

struct W2 {
  Weight c, g;
};
// The same bf16 weight through upload_linear(…, FP8_E4M3) on both backends (host
// quantization: identical codes).
inline W2 up_fp8(Pair& p, const HostMat& m) {
  TensorView v;
  v.name = "fp8 test weight";
  v.dtype = DType::BF16;
  v.shape = {m.rows, m.cols};
  v.data = reinterpret_cast<const uint8_t*>(m.bits.data());
  v.nbytes = m.bits.size() * 2;
  return {p.cpu->upload_linear(v, WeightFormat::FP8_E4M3),
          p.gpu->upload_linear(v, WeightFormat::FP8_E4M3)};
}

// GPU (e) against CPU (r). Both compute bf16(S · sx · sw) from the same codes and scales, and
// every product of two e4m3 values is exact in fp32, so only the fp32 summation differs (its
// order; on the FP8 tensor cores also the accumulator's width between promotions to fp32) and
// where the two scales multiply: an output moves by one bf16 ulp where the two sums straddle a
// rounding boundary, on a small fraction of the outputs (<= 10% here); an output that cancels
// to far below its neighbours carries the sums' absolute error instead, bounded by 2^-12 of the
// largest output (>= 16x the accumulation error at K = 16384).
inline void expect_fp8_close(const std::string& name, const std::vector<float>& e,
                      const std::vector<float>& r) {
  const Stat s = compare(name, e, r);
  int64_t beyond = 0, first = -1;
  for (size_t i = 0; i < r.size(); ++i) {
    const double d = std::fabs(double(e[i]) - double(r[i]));
    if (!(d <= bf16_ulp(r[i]) || d <= s.max_ref * 0x1p-12)) {
      if (first < 0) first = int64_t(i);
      ++beyond;
    }
  }
  EXPECT_EQ(beyond, 0) << name << ": " << beyond << " outputs beyond 1 ulp; first #" << first
                       << ": gpu " << (first >= 0 ? e[size_t(first)] : 0.f) << " cpu "
                       << (first >= 0 ? r[size_t(first)] : 0.f);
  EXPECT_LE(double(s.ndiff), 0.1 * double(s.n) + 0.5) << name << ": " << s.ndiff << " of " << s.n
                                                       << " differ";
  expect_close(s, 2e-3, 1.6e-2);
}

}  // namespace sala::test
