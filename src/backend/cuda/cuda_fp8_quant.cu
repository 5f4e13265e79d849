// FP8 (e4m3) kernels of the W8A8 GEMM path (GemmDispatch, cuda_gemm_fp8.cpp): the per-token
// activation quantization, the fallback scaling epilogue, and a self-check of the two e4m3
// conversions. The numbers are core/fp8.h's (the CPU oracle, backend/cpu/cpu_fp8.cpp):
//   s[r]       = amax(|x[r, :]|) / 448 (IEEE division; 1 for an all-zero row),
//   code[r, c] = f32_to_fp8_e4m3(x[r, c] / s[r]) (IEEE division; nearest even, saturating).
// The conversion is `cvt.rn.satfinite.e4m3x2.f32` on sm_89+ and core/fp8.h's integer rounding
// elsewhere (the sm_80 build); launch_fp8_e4m3_selfcheck proves them equal on all 2^32 inputs.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"  // pdl_begin, aligned16
#include "backend/cuda/cuda_fp8_quant.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"

namespace sala::cuda {
namespace {

constexpr int kQuantThreads = 256;
using namespace fp8q;

// Rows of up to kRegCols columns (the decode rows of every projection: K <= 16384): one block
// of kRegThreads per row holds its row in registers (kRegLoads 16-byte loads per thread, all
// in flight at once), so the row is read once and the decode step waits one L2 round trip,
// not one per 2048 columns and pass.
constexpr int kRegThreads = 1024, kRegLoads = 2, kRegCols = kRegThreads * 8 * kRegLoads;

template <bool kPortable>
__global__ void __launch_bounds__(kRegThreads)
    quantize_rows_reg_kernel(const bf16* x, int64_t cols, int64_t ldx,
                             uint8_t* __restrict__ codes, float* __restrict__ scales) {
  __shared__ float red[kRegThreads / 32];
  // Launched with PDL after the kernel that writes x (the FP8 GEMV after this one likewise):
  // trigger first so that GEMV may start its weight prologue, then wait for x.
  pdl_begin();
  const int64_t r = blockIdx.x;
  const uint4* xr = reinterpret_cast<const uint4*>(x + r * ldx);
  uint4 v[kRegLoads];
  float amax = 0.f;
#pragma unroll
  for (int u = 0; u < kRegLoads; ++u) {
    const int64_t c = (int64_t(u) * kRegThreads + threadIdx.x) * 8;
    v[u] = c < cols ? xr[c / 8] : make_uint4(0, 0, 0, 0);
    amax = amax8(amax, v[u]);
  }
  amax = block_max(amax, red);
  const RowScale s = row_scale(amax);
  if (threadIdx.x == 0) scales[r] = s.s;
#pragma unroll
  for (int u = 0; u < kRegLoads; ++u) {
    const int64_t c = (int64_t(u) * kRegThreads + threadIdx.x) * 8;
    if (c < cols) *reinterpret_cast<uint2*>(codes + r * cols + c) = codes8<kPortable>(v[u], s);
  }
}

// Any row (prefill steps, long or unaligned rows): one block per row r of x [rows, ldx] (cols
// used), two passes over the row. 16-byte loads of 8 bf16 where the row allows them. fmaxf
// ignores NaN as std::max(amax, NaN) does.
template <bool kPortable>
__global__ void __launch_bounds__(kQuantThreads)
    quantize_rows_kernel(const bf16* x, int64_t cols, int64_t ldx,
                         uint8_t* __restrict__ codes, float* __restrict__ scales) {
  __shared__ float red[kQuantThreads / 32];
  pdl_begin();
  const int64_t r = blockIdx.x;
  const bf16* xr = x + r * ldx;
  uint8_t* cr = codes + r * cols;
  const bool vec = cols % 8 == 0 && (reinterpret_cast<uintptr_t>(xr) % 16) == 0 &&
                   (reinterpret_cast<uintptr_t>(cr) % 8) == 0;
  float amax = 0.f;
  if (vec) {
    for (int64_t c = int64_t(threadIdx.x) * 8; c < cols; c += kQuantThreads * 8)
      amax = amax8(amax, *reinterpret_cast<const uint4*>(xr + c));
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += kQuantThreads)
      amax = fmaxf(amax, fabsf(__bfloat162float(xr[c])));
  }
  amax = block_max(amax, red);
  const RowScale s = row_scale(amax);
  if (threadIdx.x == 0) scales[r] = s.s;
  if (vec) {
    for (int64_t c = int64_t(threadIdx.x) * 8; c < cols; c += kQuantThreads * 8)
      *reinterpret_cast<uint2*>(cr + c) = codes8<kPortable>(*reinterpret_cast<const uint4*>(xr + c), s);
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += kQuantThreads)
      cr[c] = uint8_t(e4m3<kPortable>(code_quotient(__bfloat162float(xr[c]), s)));
  }
}

// y[t, n] = acc[t, n] · sx[t] · sw[n] in the CPU's order (sum · s_x · s_w), stored as bf16 or
// fp32 (y may be acc then: each element is read before it is written by the same thread).
__global__ void apply_scales_kernel(const float* acc, int64_t T, int64_t N, const float* sx,
                                    const float* sw, void* y, bool f32) {
  const int64_t total = T * N;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / N, n = i - t * N;
    const float v = acc[i] * sx[t] * sw[n];
    if (f32)
      static_cast<float*>(y)[i] = v;
    else
      static_cast<bf16*>(y)[i] = __float2bfloat16_rn(v);
  }
}

// Every fp32 bit pattern u = i (i < 2^32) through both conversions, and through the paired one
// (e4m3x2: i as the low value beside a scrambled pattern as the high one, then as the high
// one); counts disagreements and keeps the smallest disagreeing pattern.
__global__ void selfcheck_kernel(unsigned long long* out) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  unsigned long long bad = 0;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (uint64_t(1) << 32);
       i += stride) {
    const float f = __uint_as_float(uint32_t(i));
    const float o = __uint_as_float(uint32_t(i) * 2654435761u ^ 0x5bd1e995u);
    const uint32_t pf = e4m3<true>(f), po = e4m3<true>(o);
    if (e4m3<false>(f) != pf || e4m3x2<false>(f, o) != (pf | po << 8) ||
        e4m3x2<false>(o, f) != (po | pf << 8)) {
      ++bad;
      atomicMin(&out[1], (unsigned long long)i);
    }
  }
  if (bad) atomicAdd(&out[0], bad);
}

}  // namespace

void launch_quantize_rows_fp8(const bf16* x, int64_t rows, int64_t cols, int64_t ldx,
                              uint8_t* codes, float* scales, cudaStream_t st,
                              bool force_portable) {
  if (rows <= 0) return;
  const dim3 grid{unsigned(rows)};
  const bool reg = cols <= kRegCols && cols % 8 == 0 && ldx % 8 == 0 && aligned16(x) &&
                   reinterpret_cast<uintptr_t>(codes) % 8 == 0;
  using Kernel = void (*)(const bf16*, int64_t, int64_t, uint8_t*, float*);
  const Kernel k = reg ? (force_portable ? quantize_rows_reg_kernel<true> : quantize_rows_reg_kernel<false>)
                       : (force_portable ? quantize_rows_kernel<true> : quantize_rows_kernel<false>);
  launch_pdl(k, grid, dim3(reg ? kRegThreads : kQuantThreads), 0, st, x, cols, ldx, codes, scales);
}

void launch_fp8_apply_scales(const float* acc, int64_t T, int64_t N, const float* sx,
                             const float* sw, void* y, bool y_f32, cudaStream_t st) {
  if (T * N <= 0) return;
  const int threads = 256;
  const int blocks = int(std::min<int64_t>((T * N + threads - 1) / threads, 4096));
  apply_scales_kernel<<<blocks, threads, 0, st>>>(acc, T, N, sx, sw, y, y_f32);
  CUDA_CHECK_LAUNCH();
}

void launch_fp8_e4m3_selfcheck(unsigned long long* out, cudaStream_t st) {
  CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(unsigned long long), st));
  CUDA_CHECK(cudaMemsetAsync(out + 1, 0xff, sizeof(unsigned long long), st));
  selfcheck_kernel<<<2048, 256, 0, st>>>(out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sala::cuda
