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
//
// fast_accum_k > 0: the outputs may come from the sm_90 prefill GEMM, whose FP8 "FastAccum"
// mainloop keeps the whole K sum in the tensor cores' accumulator (about 14 significant bits
// kept where 32 products and the running sum are aligned, per wgmma of k = 32; DeepSeek-V3
// §3.3.2 measured the width). Modelled in numpy (products and sum aligned to the largest
// exponent, truncated to 14 bits; x ~ N(0, 1), w ~ N(0, 1/K)), the model gives rel L2 0.00238
// at K = 4096 and 0.00391 at K = 16384, the H100's measured 0.00237 and 0.00388 (session 41);
// its largest excess over one ulp is 2^-14 · rms · sqrt(K) (K = 4096) and 2x that (16384), for
// rms the outputs' root mean square. So: each output within 1 ulp + 2 · 2^-14 · rms ·
// sqrt(6 K) (~12 standard deviations of the model's error), rel L2 <= 2e-3 · max(1,
// sqrt(K / 2048)); up to half of the outputs differ by an ulp, so no count.
inline void expect_fp8_close(const std::string& name, const std::vector<float>& e,
                             const std::vector<float>& r, int64_t fast_accum_k = 0) {
  const Stat s = compare(name, e, r);
  double sq = 0;
  for (float v : r) sq += double(v) * double(v);
  const double rms = r.empty() ? 0.0 : std::sqrt(sq / double(r.size()));
  const double acc_err =
      fast_accum_k > 0 ? 2.0 * 0x1p-14 * rms * std::sqrt(6.0 * double(fast_accum_k)) : 0.0;
  int64_t beyond = 0, first = -1;
  for (size_t i = 0; i < r.size(); ++i) {
    const double d = std::fabs(double(e[i]) - double(r[i]));
    if (!(d <= bf16_ulp(r[i]) + acc_err || d <= s.max_ref * 0x1p-12)) {
      if (first < 0) first = int64_t(i);
      ++beyond;
    }
  }
  EXPECT_EQ(beyond, 0) << name << ": " << beyond << " outputs beyond the bound; first #" << first
                       << ": gpu " << (first >= 0 ? e[size_t(first)] : 0.f) << " cpu "
                       << (first >= 0 ? r[size_t(first)] : 0.f);
  if (fast_accum_k > 0) {
    expect_close(s, 2e-3 * std::max(1.0, std::sqrt(double(fast_accum_k) / 2048.0)), 1.6e-2);
    return;
  }
  EXPECT_LE(double(s.ndiff), 0.1 * double(s.n) + 0.5) << name << ": " << s.ndiff << " of " << s.n
                                                       << " differ";
  expect_close(s, 2e-3, 1.6e-2);
}

// The K to pass as expect_fp8_close's fast_accum_k for linear() of T rows: runs of more than
// 64 rows with a bf16 output may take the sm_90 prefill GEMM (launch_fp8_scaled_gemm_sm90).
inline int64_t fast_accum_k(int64_t T, int64_t K, bool f32_out) {
  return T > 64 && !f32_out ? K : 0;
}

}  // namespace sala::test
