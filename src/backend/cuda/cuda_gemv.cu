// Skinny GEMM for decode rows (M <= 16) on tensor cores: y[m, n] = Σ_k x[m, k] W[n, k].
//
// mma.sync m16n8k16 (bf16 in, fp32 accumulate) with W as the A operand (16 weight rows per
// CTA) and the input rows as B (one n8 tile for M <= 8, two for M <= 16; rows past M are
// zeros in registers). W is streamed once in 16-byte loads straight into A fragments: lane
// (g, t) of a warp loads 8 consecutive k of weight rows g and g+8 at chunk c = 4u + t, and
// the same chunk of input row g, and uses elements 0-3 / 4-7 as the two k16 steps (k is
// permuted identically in A and B, so the dot products are unchanged). The 8 warps of a CTA
// split K into fixed slices; their partial tiles are summed in shared memory in warp order.
//
// Batch invariance: every output (n, m) is one accumulator column of the same mma sequence,
// whose k order and K split depend only on K. Other rows of x only feed other columns of B,
// so a row's result is bit-identical for any M in 1..16 (and in a padded recorded step).
// Outputs may be split over up to 4 tensors (stacked weights); bf16 rounding happens once.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace sala::cuda {
namespace {

constexpr int kWarps = 8;           // K slices per CTA
constexpr int kThreads = 32 * kWarps;
constexpr int kU = 4;               // 16-byte chunks per weight row and lane in flight

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

template <int NT>  // n8 tiles of input rows: 1 (M <= 8) or 2 (M <= 16)
__global__ void __launch_bounds__(kThreads, 2) skinny_gemm_kernel(const bf16* __restrict__ x,
                                                                  int64_t ldx,
                                                                  const bf16* __restrict__ w,
                                                                  int64_t N, int K, int M, GemvOut o) {
  __shared__ float red[kWarps][16][17];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t n0 = int64_t(blockIdx.x) * 16;
  const int KC = K / 8;  // 16-byte chunks per row
  const int per = ((KC + kWarps - 1) / kWarps + 3) / 4 * 4;
  const int cb = warp * per, ce = min(cb + per, KC);
  const int64_t ra = min(n0 + g, N - 1), rb8 = min(n0 + g + 8, N - 1);
  const uint4* wa = reinterpret_cast<const uint4*>(w + ra * int64_t(K));
  const uint4* wb = reinterpret_cast<const uint4*>(w + rb8 * int64_t(K));
  const uint4* xr[NT];
  bool xv[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    xv[nt] = g + 8 * nt < M;
    xr[nt] = reinterpret_cast<const uint4*>(x + int64_t(xv[nt] ? g + 8 * nt : 0) * ldx);
  }
  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = 0.f;

  const uint4 z = make_uint4(0, 0, 0, 0);
  for (int c0 = cb; c0 < ce; c0 += 4 * kU) {
    uint4 A[kU], B[kU], X[NT][kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = c0 + 4 * u + t;
      const bool ok = c < ce;
      A[u] = ok ? ld_stream(wa + c) : z;
      B[u] = ok ? ld_stream(wb + c) : z;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) X[nt][u] = ok && xv[nt] ? __ldg(xr[nt] + c) : z;
    }
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        mma_bf16(acc[nt], A[u].x, B[u].x, A[u].y, B[u].y, X[nt][u].x, X[nt][u].y);
        mma_bf16(acc[nt], A[u].z, B[u].z, A[u].w, B[u].w, X[nt][u].z, X[nt][u].w);
      }
  }
  // c0, c1: (weight row g, input rows 2t, 2t+1); c2, c3: weight row g + 8.
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    red[warp][g][nt * 8 + 2 * t] = acc[nt][0];
    red[warp][g][nt * 8 + 2 * t + 1] = acc[nt][1];
    red[warp][g + 8][nt * 8 + 2 * t] = acc[nt][2];
    red[warp][g + 8][nt * 8 + 2 * t + 1] = acc[nt][3];
  }
  __syncthreads();
  const int nl = threadIdx.x % 16, m = threadIdx.x / 16;
  const int64_t n = n0 + nl;
  if (m < M && n < N) {
    float v = red[0][nl][m];
#pragma unroll
    for (int q = 1; q < kWarps; ++q) v += red[q][nl][m];
    int p = 0;
    while (p + 1 < o.nparts && n >= o.end[p]) ++p;
    const int64_t col = n - (p ? o.end[p - 1] : 0);
    if (o.f32)
      static_cast<float*>(o.y[p])[m * o.cols[p] + col] = rb(v);
    else
      static_cast<bf16*>(o.y[p])[m * o.cols[p] + col] = f2b(v);
  }
}

template <int NT>
void launch_t(const bf16* x, int64_t ldx, const bf16* w, int64_t N, int K, int M, const GemvOut& o,
              cudaStream_t st) {
  const unsigned grid = unsigned((N + 15) / 16);
  skinny_gemm_kernel<NT><<<grid, kThreads, 0, st>>>(x, ldx, w, N, K, M, o);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool gemv_supported(const void* x, int64_t ldx, const void* w, int64_t K, int64_t M) {
  const auto a16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  return M >= 1 && M <= kGemvMaxRows && K % 8 == 0 && ldx % 8 == 0 && a16(x) && a16(w);
}

void launch_gemv(const bf16* x, int64_t ldx, const bf16* w, int64_t N, int K, int M,
                 const GemvOut& o, cudaStream_t st) {
  if (M <= 8) launch_t<1>(x, ldx, w, N, K, M, o, st);
  else launch_t<2>(x, ldx, w, N, K, M, o, st);
}

}  // namespace sala::cuda
