// RMSNorm kernels of the CUDA backend (SPEC §4.2) over groups of n columns: rmsnorm,
// add_scaled_rmsnorm (residual h = h + a·alpha first) and rmsnorm_mul_sigmoid (output gate
// after the norm). Rounding points as CpuBackend; T = bf16 or float (fp32 mode), launched with
// launch_pdl, starting with pdl_begin() (see cuda_ops.cu).
//
// FP8 activation codes (kQuant, bf16 only; issue 17, item 5): when the output feeds an FP8
// projection, the kernel also writes the per-token codes and scale of every row it stores
// (whole-row groups: n = cols), with cuda_fp8_quant.cuh's code on the bf16 values it stored,
// so they are launch_quantize_rows_fp8's codes and scales of `out` bit for bit and the
// projection skips its quantize kernel. The kernel choice and everything before the store are
// unchanged, so `out` (and h) are bit-identical with or without the codes. With q.skip_out the
// 16-byte-vector kernel (the model's hidden sizes) does not store `out` at all: its codes come
// from registers (the warp and block kernels read `out` back, so they store it).
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_fp8_quant.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_norm.cuh"

namespace sala::cuda {
namespace {

// RMSNorm over groups of n columns (SPEC §4.2): y = bf16(x * inv), out = bf16(y * w).
// Optional fused residual (add_scaled_rmsnorm): h = bf16(h + bf16(a * alpha)) first,
// written back to h. Optional output gate (rmsnorm_mul_sigmoid, kGate): out = bf16(bf16(y * w)
// * bf16(sigmoid(gate))), gate[groups * n] laid out as out. One warp per group (small n) or
// one block per group (large n); the gate changes only the store, so inv and y are those of
// the plain kernel.
template <typename T, bool kResidual>
__device__ __forceinline__ float load_norm_input(T* h, const T* a, float alpha, int64_t i) {
  if constexpr (kResidual) {
    const float hv = rnd<T>(ld(h[i]) + rnd<T>(ld(a[i]) * alpha));
    h[i] = cvt<T>(hv);
    return hv;
  } else {
    return ld(h[i]);
  }
}

// The value stored for a normalised element y = T(x·inv)·w: y, or with the gate MulSigmoid of
// T(y) and gate[i] (the numbers of mul_sigmoid applied to the stored T(y)).
template <typename T, bool kGate>
__device__ __forceinline__ float gated(float y, const T* gate, int64_t i) {
  if constexpr (kGate)
    return MulSigmoid<T>{}(ld(gate[i]), rnd<T>(y));
  else
    return y;
}

// kQuant: the codes of the row stored by this thread (or warp): its amax is reduced over the
// block (warp), then each thread converts the values it stored, read back (its own stores).
template <typename T, bool kResidual, bool kGate, bool kQuant>
__global__ void rmsnorm_warp_kernel(T* x, const T* a, float alpha, const T* __restrict__ w,
                                    const T* gate, int n, int64_t groups, float eps, T* out,
                                    Fp8Act q) {
  pdl_begin();  // launch_pdl: before any read or write
  const int warps = blockDim.x / 32;
  const int64_t g = int64_t(blockIdx.x) * warps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (g >= groups) return;
  const int64_t base = g * n;
  float ss = 0.f;
  for (int c = lane; c < n; c += 32) {
    const float v = load_norm_input<T, kResidual>(x, a, alpha, base + c);
    ss += v * v;
  }
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(n) + eps);
  float amax = 0.f;
  for (int c = lane; c < n; c += 32) {
    const float v = ld(x[base + c]);
    const T o = cvt<T>(gated<T, kGate>(rnd<T>(v * inv) * ld(w[c]), gate, base + c));
    out[base + c] = o;
    if constexpr (kQuant) amax = fmaxf(amax, fabsf(ld(o)));
  }
  if constexpr (kQuant) {
    const fp8q::RowScale s = fp8q::row_scale(warp_max(amax));
    if (lane == 0) q.scales[g] = s.s;
    for (int c = lane; c < n; c += 32) q.codes[base + c] = fp8q::code1(ld(out[base + c]), s);
  }
}

// 1 / rms of a group from each thread's partial Σ v² (one block per group, red: 32 floats
// of shared memory).
__device__ __forceinline__ float block_inv_rms(float ss, int n, float eps, float* red) {
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.f;
    v = warp_sum(v);
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  return 1.0f / sqrtf(red[0] / float(n) + eps);
}

template <typename T, bool kResidual, bool kGate, bool kQuant>
__global__ void rmsnorm_block_kernel(T* x, const T* a, float alpha, const T* __restrict__ w,
                                     const T* gate, int n, float eps, T* out, Fp8Act q) {
  pdl_begin();  // launch_pdl: before any read or write
  __shared__ float red[32], red_max[32];
  const int64_t base = int64_t(blockIdx.x) * n;
  float ss = 0.f;
  for (int c = threadIdx.x; c < n; c += blockDim.x) {
    const float v = load_norm_input<T, kResidual>(x, a, alpha, base + c);
    ss += v * v;
  }
  const float inv = block_inv_rms(ss, n, eps, red);
  float amax = 0.f;
  for (int c = threadIdx.x; c < n; c += blockDim.x) {
    const float v = ld(x[base + c]);
    const T o = cvt<T>(gated<T, kGate>(rnd<T>(v * inv) * ld(w[c]), gate, base + c));
    out[base + c] = o;
    if constexpr (kQuant) amax = fmaxf(amax, fabsf(ld(o)));
  }
  if constexpr (kQuant) {
    const fp8q::RowScale s = fp8q::row_scale(fp8q::block_max(amax, red_max));
    if (threadIdx.x == 0) q.scales[blockIdx.x] = s.s;
    for (int c = threadIdx.x; c < n; c += blockDim.x)
      q.codes[base + c] = fp8q::code1(ld(out[base + c]), s);
  }
}

// The same for n = 8 · blockDim.x (hidden sizes up to 8192), 16-byte aligned: thread i
// holds columns 8i .. 8i + 7 in registers between the two passes, so h, a, w and out move
// in 16-byte accesses, each once (the kernel above reads h twice, 2 bytes at a time).
// bf16 only. The gate moves in 16-byte loads where it is 16-byte aligned, else 2 bytes at a
// time (the kernel is chosen without looking at it).
//
// kSums (with kResidual; launch_add_rmsnorm_sums): the residual addend is made here from an FP8
// GEMM's fp32 sums, a = bf16(acc · sx[t] · sw[n]) (apply_scales_kernel's expression, so its
// bits), and stored to sums.y as that kernel stores it; a itself is not read.
template <bool kResidual, bool kGate, bool kQuant, bool kSums = false>
__global__ void rmsnorm_vec8_kernel(bf16* x, const bf16* a, float alpha, const bf16* __restrict__ w,
                                    const bf16* gate, int n, float eps, bf16* out, Fp8Act q,
                                    Fp8Sums sums) {
  static_assert(!kSums || kResidual, "the sums are the residual's addend");
  pdl_begin();  // launch_pdl: before any read or write
  __shared__ float red[32], red_max[32];
  const int64_t off = int64_t(blockIdx.x) * n + threadIdx.x * 8;
  uint4 hv = *reinterpret_cast<const uint4*>(x + off);
  bf16* h8 = reinterpret_cast<bf16*>(&hv);
  float v[8], ss = 0.f;
  if constexpr (kResidual) {
    uint4 av;
    if constexpr (kSums) {
      // sx[t] is read before the block's first barrier: q.scales may be the same workspace
      // words (the FP8 input's scales of x and of out), written by thread 0 after the last.
      const float sx = sums.sx[blockIdx.x];
      const float4 a0 = *reinterpret_cast<const float4*>(sums.acc + off);
      const float4 a1 = *reinterpret_cast<const float4*>(sums.acc + off + 4);
      const float4 w0 = *reinterpret_cast<const float4*>(sums.sw + threadIdx.x * 8);
      const float4 w1 = *reinterpret_cast<const float4*>(sums.sw + threadIdx.x * 8 + 4);
      const float acc[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const float sw[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
      bf16* y8 = reinterpret_cast<bf16*>(&av);
#pragma unroll
      for (int e = 0; e < 8; ++e) y8[e] = f2b(acc[e] * sx * sw[e]);
      *reinterpret_cast<uint4*>(sums.y + off) = av;
    } else {
      av = *reinterpret_cast<const uint4*>(a + off);
    }
    const bf16* a8 = reinterpret_cast<const bf16*>(&av);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      v[e] = rb(b2f(h8[e]) + rb(b2f(a8[e]) * alpha));
      h8[e] = f2b(v[e]);
    }
    *reinterpret_cast<uint4*>(x + off) = hv;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = b2f(h8[e]);
  }
  // One fused multiply-add per value, as the GEMV's norm tail (cuda_gemv_row_tail.cuh).
#pragma unroll
  for (int e = 0; e < 8; ++e) ss = __fmaf_rn(v[e], v[e], ss);
  const float inv = block_inv_rms(ss, n, eps, red);
  const uint4 wv = *reinterpret_cast<const uint4*>(w + threadIdx.x * 8);
  const bf16* w8 = reinterpret_cast<const bf16*>(&wv);
  uint4 gv{};
  bf16* g8 = reinterpret_cast<bf16*>(&gv);
  if constexpr (kGate) {
    if (aligned16(gate)) {
      gv = *reinterpret_cast<const uint4*>(gate + off);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) g8[e] = gate[off + e];
    }
  }
  uint4 ov;
  bf16* o8 = reinterpret_cast<bf16*>(&ov);
#pragma unroll
  for (int e = 0; e < 8; ++e) o8[e] = f2b(gated<bf16, kGate>(rb(v[e] * inv) * b2f(w8[e]), g8, e));
  if (!kQuant || !q.skip_out) *reinterpret_cast<uint4*>(out + off) = ov;
  if constexpr (kQuant) {
    // The row's 8 · blockDim.x values are in the registers of its block: codes of ov directly.
    const fp8q::RowScale s = fp8q::row_scale(fp8q::block_max(fp8q::amax8(0.f, ov), red_max));
    if (threadIdx.x == 0) q.scales[blockIdx.x] = s.s;
    const uint2 c8 = fp8q::codes8<false>(ov, s);
    if (reinterpret_cast<uintptr_t>(q.codes) % 8 == 0) {
      *reinterpret_cast<uint2*>(q.codes + off) = c8;
    } else {
      for (int e = 0; e < 4; ++e) {
        q.codes[off + e] = uint8_t(c8.x >> (8 * e));
        q.codes[off + 4 + e] = uint8_t(c8.y >> (8 * e));
      }
    }
  }
}

// The kernel for groups of n (the gate does not change the choice: the order in which Σ v² is
// summed, so inv, depends on it).
template <typename T, bool kResidual, bool kGate, bool kQuant = false>
void launch_rmsnorm_kernel(T* x, const T* a, float alpha, const T* w, const T* gate, int n,
                           int64_t groups, float eps, T* out, cudaStream_t st, Fp8Act q = {}) {
  static_assert(!kQuant || std::is_same_v<T, bf16>, "FP8 codes of bf16 activations only");
  if (groups == 0) return;
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  if (n <= 512) {
    const int warps = 8;
    const unsigned grid = unsigned((groups + warps - 1) / warps);
    launch_pdl(rmsnorm_warp_kernel<T, kResidual, kGate, kQuant>, grid, warps * 32, 0, st, x, a,
               alpha, w, gate, n, groups, eps, out, q);
  } else if (kBf16 && rmsnorm_vec8_fits(n) && aligned16(x) && aligned16(out) && aligned16(w) &&
             (!kResidual || aligned16(a))) {
    if constexpr (kBf16)
      launch_pdl(rmsnorm_vec8_kernel<kResidual, kGate, kQuant>, unsigned(groups), unsigned(n / 8),
                 0, st, x, a, alpha, w, gate, n, eps, out, q, Fp8Sums{});
  } else {
    const int threads = n >= 4096 ? 512 : 256;
    launch_pdl(rmsnorm_block_kernel<T, kResidual, kGate, kQuant>, unsigned(groups), threads, 0, st,
               x, a, alpha, w, gate, n, eps, out, q);
  }
  CUDA_CHECK_LAUNCH();
}

// Tensor parallelism's split o_norm, one warp per row of n columns: Σ x² (fp32, as the norm
// kernels sum), then the gated norm with the whole row's sum given.
template <typename T>
__global__ void row_sum_squares_kernel(const T* __restrict__ x, int n, int64_t rows,
                                       float* __restrict__ ss) {
  pdl_begin();  // launch_pdl: before any read or write
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  float s = 0.f;
  for (int c = threadIdx.x % 32; c < n; c += 32) {
    const float v = ld(x[row * n + c]);
    s += v * v;
  }
  s = warp_sum(s);
  if (threadIdx.x % 32 == 0) ss[row] = s;
}

template <typename T>
__global__ void rmsnorm_ss_gate_kernel(const T* x, const float* __restrict__ ss, int n,
                                       float n_total, const T* __restrict__ w,
                                       const T* __restrict__ gate, int64_t rows, float eps,
                                       T* out) {
  pdl_begin();  // launch_pdl: before any read or write
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const float inv = 1.0f / sqrtf(ss[row] / n_total + eps);
  for (int c = threadIdx.x % 32; c < n; c += 32) {
    const int64_t i = row * n + c;
    out[i] = cvt<T>(gated<T, true>(rnd<T>(ld(x[i]) * inv) * ld(w[c]), gate, i));
  }
}

}  // namespace

template <typename T>
void launch_row_sum_squares(const T* x, int n, int64_t rows, float* ss, cudaStream_t st) {
  if (rows == 0) return;
  const int warps = 8;
  launch_pdl(row_sum_squares_kernel<T>, unsigned((rows + warps - 1) / warps), warps * 32, 0, st,
             x, n, rows, ss);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_rmsnorm_mul_sigmoid_ss(const T* x, const float* ss, int n, int64_t n_total,
                                   const T* w, const T* gate, int64_t rows, float eps, T* out,
                                   cudaStream_t st) {
  if (rows == 0) return;
  const int warps = 8;
  launch_pdl(rmsnorm_ss_gate_kernel<T>, unsigned((rows + warps - 1) / warps), warps * 32, 0, st,
             x, ss, n, float(n_total), w, gate, rows, eps, out);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_rmsnorm(T* x, const T* a, float alpha, const T* w, int n, int64_t groups, float eps,
                    T* out, cudaStream_t st) {
  if (a)
    launch_rmsnorm_kernel<T, true, false>(x, a, alpha, w, nullptr, n, groups, eps, out, st);
  else
    launch_rmsnorm_kernel<T, false, false>(x, a, alpha, w, nullptr, n, groups, eps, out, st);
}

template <typename T>
void launch_rmsnorm_mul_sigmoid(T* x, const T* w, const T* gate, int n, int64_t groups, float eps,
                                T* out, cudaStream_t st) {
  launch_rmsnorm_kernel<T, false, true>(x, nullptr, 0.f, w, gate, n, groups, eps, out, st);
}

void launch_rmsnorm_fp8(bf16* x, const bf16* a, float alpha, const bf16* w, const bf16* gate,
                        int n, int64_t rows, float eps, bf16* out, Fp8Act q, cudaStream_t st) {
  if (a && gate) {
    std::fprintf(stderr, "%s:%d: launch_rmsnorm_fp8: a residual and a gate together\n", __FILE__,
                 __LINE__);
    std::abort();
  }
  if (a)
    launch_rmsnorm_kernel<bf16, true, false, true>(x, a, alpha, w, nullptr, n, rows, eps, out, st, q);
  else if (gate)
    launch_rmsnorm_kernel<bf16, false, true, true>(x, nullptr, 0.f, w, gate, n, rows, eps, out, st,
                                                   q);
  else
    launch_rmsnorm_kernel<bf16, false, false, true>(x, nullptr, 0.f, w, nullptr, n, rows, eps, out,
                                                    st, q);
}

void launch_add_rmsnorm_sums(bf16* h, Fp8Sums s, float alpha, const bf16* w, int n, int64_t rows,
                             float eps, bf16* out, Fp8Act q, cudaStream_t st) {
  if (rows == 0) return;
  if (!(rmsnorm_vec8_fits(n) && aligned16(h) && aligned16(s.acc) && aligned16(s.sw) &&
        aligned16(s.y) && aligned16(w) && aligned16(out))) {
    std::fprintf(stderr,
                 "%s:%d: launch_add_rmsnorm_sums: n = %d or a pointer that is not 16-byte "
                 "aligned (the caller checks rmsnorm_vec8_fits and the alignment)\n",
                 __FILE__, __LINE__, n);
    std::abort();
  }
  if (q.codes)
    launch_pdl(rmsnorm_vec8_kernel<true, false, true, true>, unsigned(rows), unsigned(n / 8), 0,
               st, h, static_cast<const bf16*>(nullptr), alpha, w,
               static_cast<const bf16*>(nullptr), n, eps, out, q, s);
  else
    launch_pdl(rmsnorm_vec8_kernel<true, false, false, true>, unsigned(rows), unsigned(n / 8), 0,
               st, h, static_cast<const bf16*>(nullptr), alpha, w,
               static_cast<const bf16*>(nullptr), n, eps, out, q, s);
  CUDA_CHECK_LAUNCH();
}

#define SALA_NORM_INSTANTIATE(T)                                                               \
  template void launch_rmsnorm<T>(T*, const T*, float, const T*, int, int64_t, float, T*,      \
                                  cudaStream_t);                                               \
  template void launch_rmsnorm_mul_sigmoid<T>(T*, const T*, const T*, int, int64_t, float, T*, \
                                              cudaStream_t);                                   \
  template void launch_row_sum_squares<T>(const T*, int, int64_t, float*, cudaStream_t);       \
  template void launch_rmsnorm_mul_sigmoid_ss<T>(const T*, const float*, int, int64_t,         \
                                                 const T*, const T*, int64_t, float, T*,       \
                                                 cudaStream_t);
SALA_NORM_INSTANTIATE(bf16)
SALA_NORM_INSTANTIATE(float)
#undef SALA_NORM_INSTANTIATE

}  // namespace sala::cuda
