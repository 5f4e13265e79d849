// The quotient x / s of an FP8 activation code (core/fp8.h's per-token quantization: code =
// e4m3(RN(x / s)), s = amax / 448) without a division per element, for the GPU kernels that
// write codes (backend/cuda/cuda_fp8_quant.cuh). An IEEE division costs a GPU ~10 instructions
// and a branch per element; with r = RN(1 / s) once per row,
//   q0 = RN(x · r),  e = RN(x − q0 · s) (one fma),  q = e == 0 ? q0 : RN(q0 + e · r)
// costs 3. q is RN(x / s) for almost every input; where it is not (2,305,882 of the
// 1,056,732,160 pairs below, in the last fp32 bit) it never lies across an e4m3 rounding
// point, so the codes are the division's. Checked exhaustively once (session 55, PERF_LOG):
// every positive finite bf16 amax >= 2^-104 with s = RN(amax / 448) and every bf16 x with
// |x| <= amax, both signs, give the code of x / s; below 2^-104 codes differ (the largest
// failing amax is 0x1.54p-105), so those rows and non-finite ones keep the division
// (fp8_quotient_exact_for). CI repeats it over a stride of x (tests/unit/fp8_quotient_test.cpp).
// The `e == 0` guard keeps the sign of −0; NaN is the caller's (the GPU returns a positive
// canonical NaN). Only for bf16 x: what every code kernel quantizes (rounded activations).
#pragma once
#include <cmath>

#if defined(__CUDACC__)
#define SALA_FP8Q_FN __host__ __device__ __forceinline__
#else
#define SALA_FP8Q_FN inline
#endif

namespace sala {

// Whether fp8_quotient gives the codes of x / s for every bf16 x of a row whose largest
// magnitude is amax (s = RN(amax / 448), or 1 for amax == 0).
SALA_FP8Q_FN bool fp8_quotient_exact_for(float amax) {
  return amax == 0.f || (amax >= 0x1p-104f && amax <= 3.40282347e38f);
}

// x / s by the reciprocal r = RN(1 / s) (see above); exact rounding steps on host and device.
SALA_FP8Q_FN float fp8_quotient(float x, float s, float r) {
#if defined(__CUDA_ARCH__)
  const float q0 = __fmul_rn(x, r);
  const float e = __fmaf_rn(-q0, s, x);
  return e == 0.f ? q0 : __fmaf_rn(e, r, q0);
#else
  const float q0 = x * r;
  const float e = std::fma(-q0, s, x);
  return e == 0.f ? q0 : std::fma(e, r, q0);
#endif
}

}  // namespace sala

#undef SALA_FP8Q_FN
