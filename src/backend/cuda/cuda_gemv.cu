// Skinny GEMM for decode rows (M <= 16): y[m, n] = Σ_k x[m, k] W[n, k] with W streamed once
// from memory in 16-byte loads. One warp owns R consecutive weight rows; its lanes walk K in
// 16-byte chunks (U chunks in flight per row), multiply every input row held in L1, and the
// warp reduces by a butterfly. Each output's summation order depends only on K (never on M
// or on the other rows), so a row's result is the same in a batch of 1 and of 16, and in a
// padded recorded step. Outputs may be split over up to 4 tensors (stacked weights).
// Portable: plain loads and FMAs, no Hopper-only instructions.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace sala::cuda {
namespace {

constexpr int kGemvThreads = 128;  // 4 warps per block
constexpr int kUnroll = 4;         // 16-byte chunks of each weight row in flight per lane

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <int MT, int R>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(const bf16* __restrict__ x, int64_t ldx,
                                                            const bf16* __restrict__ w, int64_t N,
                                                            int K, int M, GemvOut o) {
  const int64_t warp = (int64_t(blockIdx.x) * kGemvThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  const int64_t n0 = warp * R;
  if (n0 >= N) return;
  const int KV = K / 8;
  const uint4* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    wr[r] = reinterpret_cast<const uint4*>(w + (n0 + r < N ? n0 + r : N - 1) * int64_t(K));
  float acc[MT][R];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = 0.f;

  for (int c0 = lane; c0 < KV; c0 += 32 * kUnroll) {
    uint4 wv[kUnroll][R];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * 32;
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (c < KV) wv[u][r] = ld_stream(wr[r] + c);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * 32;
      if (c >= KV) break;
      // Each weight chunk and each input chunk converted to fp32 once, then M x R dots.
      float wf[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&wv[u][r]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 f = __bfloat1622float2(wp[i]);
          wf[r][2 * i] = f.x;
          wf[r][2 * i + 1] = f.y;
        }
      }
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m < M) {
          const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + m * ldx) + c);
          const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&xv);
          float xf[8];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float2 f = __bfloat1622float2(xp[i]);
            xf[2 * i] = f.x;
            xf[2 * i + 1] = f.y;
          }
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[m][r] = __fmaf_rn(wf[r][i], xf[i], acc[m][r]);
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    if (m >= M) break;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float v = warp_sum(acc[m][r]);
      const int64_t n = n0 + r;
      if (lane == (m * R + r) % 32 && n < N) {
        int p = 0;
        while (p + 1 < o.nparts && n >= o.end[p]) ++p;
        const int64_t col = n - (p ? o.end[p - 1] : 0);
        if (o.f32)
          static_cast<float*>(o.y[p])[m * o.cols[p] + col] = rb(v);
        else
          static_cast<bf16*>(o.y[p])[m * o.cols[p] + col] = f2b(v);
      }
    }
  }
}

template <int MT, int R>
void launch_t(const bf16* x, int64_t ldx, const bf16* w, int64_t N, int K, int M, const GemvOut& o,
              cudaStream_t st) {
  const int64_t warps = (N + R - 1) / R;
  const unsigned grid = unsigned((warps * 32 + kGemvThreads - 1) / kGemvThreads);
  gemv_kernel<MT, R><<<grid, kGemvThreads, 0, st>>>(x, ldx, w, N, K, M, o);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool gemv_supported(const void* x, int64_t ldx, const void* w, int64_t K, int64_t M) {
  const auto a16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  return M >= 1 && M <= kGemvMaxRows && K % 8 == 0 && ldx % 8 == 0 && a16(x) && a16(w);
}

void launch_gemv(const bf16* x, int64_t ldx, const bf16* w, int64_t N, int K, int M,
                 const GemvOut& o, cudaStream_t st) {
  if (M <= 1) launch_t<1, 2>(x, ldx, w, N, K, M, o, st);
  else if (M <= 2) launch_t<2, 2>(x, ldx, w, N, K, M, o, st);
  else if (M <= 4) launch_t<4, 2>(x, ldx, w, N, K, M, o, st);
  else if (M <= 8) launch_t<8, 4>(x, ldx, w, N, K, M, o, st);
  else launch_t<16, 4>(x, ldx, w, N, K, M, o, st);
}

}  // namespace sala::cuda
