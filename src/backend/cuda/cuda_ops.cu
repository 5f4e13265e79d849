// Element-wise, RoPE, q/k norm, embedding and gather kernels of the CUDA backend (the RMSNorm
// kernels: cuda_norm.cu). Each computes in fp32 between the bf16 rounding points of the golden
// README §4, exactly where CpuBackend (NumericMode::BF16) rounds. Each is templated on the
// storage type T: bf16 (the bf16 contract) or float (fp32 mode: no rounding anywhere; cvt /
// rnd in cuda_common.cuh). Each is launched with launch_pdl and starts with pdl_begin()
// (cuda_common.cuh): the next kernels, e.g. a skinny GEMM that streams its first weights
// early (cuda_gemv.cu), may start while this one runs.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_fp8_quant.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_norm.cuh"

namespace sala::cuda {
namespace {

// ---- kernels ------------------------------------------------------------------------

// out[t, c] = T(table[ids[t], c] * scale)                        grid: T, block: 256
template <typename T>
__global__ void embedding_kernel(const T* __restrict__ table, const int32_t* __restrict__ ids,
                                 int64_t cols, float scale, T* __restrict__ out) {
  pdl_begin();  // launch_pdl: before any read or write
  const int64_t t = blockIdx.x;
  const T* e = table + int64_t(ids[t]) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    out[t * cols + c] = cvt<T>(ld(e[c]) * scale);
}

// Two-input element-wise ops, 8 bf16 per thread and step (16-byte loads) when every pointer
// is 16-byte aligned and n % 8 == 0, else one per thread. Same rounding either way.
// (The 8-wide path is bf16 only: vec is false for float.) Ops: SiluMul; MulSigmoid (in
// cuda_norm.cuh: the gated RMSNorm applies it too).
template <typename T>
struct SiluMul {  // T(T(silu(g)) * u)
  __device__ float operator()(float gv, float uv) const { return rnd<T>(gv / (1.f + expf(-gv))) * uv; }
};

// op on 8 pairs of bf16 packed in 16 bytes each, every result rounded to bf16 as the scalar
// path rounds it (binary_kernel, silu_mul_halves_kernel and silu_mul_fp8_kernel share it).
template <typename Op>
__device__ __forceinline__ uint4 apply8(const uint4& xv, const uint4& yv, const Op& op) {
  const bf16* xe = reinterpret_cast<const bf16*>(&xv);
  const bf16* ye = reinterpret_cast<const bf16*>(&yv);
  uint4 ov;
  bf16* oe = reinterpret_cast<bf16*>(&ov);
#pragma unroll
  for (int k = 0; k < 8; ++k) oe[k] = f2b(op(b2f(xe[k]), b2f(ye[k])));
  return ov;
}

template <typename T, typename Op>
__global__ void binary_kernel(const T* x, const T* y, T* out, int64_t n, bool vec, Op op) {
  pdl_begin();  // launch_pdl: before any read or write
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  if constexpr (std::is_same_v<T, bf16>) {
    if (vec) {
      for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n / 8; i += stride)
        reinterpret_cast<uint4*>(out)[i] =
            apply8(reinterpret_cast<const uint4*>(x)[i], reinterpret_cast<const uint4*>(y)[i], op);
      return;
    }
  }
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride)
    out[i] = cvt<T>(op(ld(x[i]), ld(y[i])));
}

// Row t = blockIdx.y of x[T, N]: 16-byte chunks (vec: every part's width a multiple of 8) or
// single elements, each copied to its part; a row spans blocks (x), one chunk per thread, so
// a 64-row step's loads are in flight at once (one block per row walked each row in 8 serial
// round trips: 8.4 µs per launch at B = 64, session 47).
__global__ void split_cols_kernel(const bf16* x, int64_t N, GemvOut s, bool vec) {
  pdl_begin();  // launch_pdl: before any read or write
  const int64_t t = blockIdx.y, step = vec ? 8 : 1;
  for (int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * step; c < N;
       c += int64_t(gridDim.x) * blockDim.x * step) {
    int p = 0;
    while (p + 1 < s.nparts && c >= s.end[p]) ++p;
    const int64_t c0 = p ? s.end[p - 1] : 0, w = s.end[p] - c0;
    bf16* y = static_cast<bf16*>(s.y[p]) + t * w + (c - c0);
    if (vec)
      *reinterpret_cast<uint4*>(y) = *reinterpret_cast<const uint4*>(x + t * N + c);
    else
      *y = x[t * N + c];
  }
}

// Row t = blockIdx.y: out[t, c] = SiluMul(x[t, c], x[t, I + c]), 8 per thread when vec; a row
// spans blocks as in split_cols_kernel.
__global__ void silu_mul_halves_kernel(const bf16* x, int64_t I, bf16* out, bool vec) {
  pdl_begin();  // launch_pdl: before any read or write
  const int64_t t = blockIdx.y, step = vec ? 8 : 1;
  const bf16* g = x + t * 2 * I;
  const SiluMul<bf16> op;
  for (int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * step; c < I;
       c += int64_t(gridDim.x) * blockDim.x * step) {
    if (vec) {
      *reinterpret_cast<uint4*>(out + t * I + c) = apply8(
          *reinterpret_cast<const uint4*>(g + c), *reinterpret_cast<const uint4*>(g + I + c), op);
    } else {
      out[t * I + c] = f2b(op(b2f(g[c]), b2f(g[I + c])));
    }
  }
}

// One block per row t of g, u [rows, ldi] (cols used) and out [rows, cols]: out = SiluMul(g, u)
// as binary_kernel stores it (8 per thread when vec: every pointer 16-byte aligned, codes
// 8-byte aligned, cols and ldi % 8 == 0), and the FP8 codes and scale of the stored row
// (cuda_fp8_quant.cuh: the amax over the block, then each thread converts what it stored, read
// back). out may be g when ldi == cols.
__global__ void silu_mul_fp8_kernel(const bf16* g, const bf16* u, int64_t ldi, bf16* out,
                                    int64_t cols, bool vec, Fp8Act q) {
  pdl_begin();  // launch_pdl: before any read or write
  __shared__ float red[32];
  const int64_t t = blockIdx.x, step = vec ? 8 : 1, base = t * cols, in = t * ldi;
  const SiluMul<bf16> op;
  float amax = 0.f;
  for (int64_t c = threadIdx.x * step; c < cols; c += int64_t(blockDim.x) * step) {
    if (vec) {
      const uint4 ov = apply8(*reinterpret_cast<const uint4*>(g + in + c),
                              *reinterpret_cast<const uint4*>(u + in + c), op);
      *reinterpret_cast<uint4*>(out + base + c) = ov;
      amax = fp8q::amax8(amax, ov);
    } else {
      const bf16 o = f2b(op(b2f(g[in + c]), b2f(u[in + c])));
      out[base + c] = o;
      amax = fmaxf(amax, fabsf(b2f(o)));
    }
  }
  const fp8q::RowScale s = fp8q::row_scale(fp8q::block_max(amax, red));
  if (threadIdx.x == 0) q.scales[t] = s.s;
  for (int64_t c = threadIdx.x * step; c < cols; c += int64_t(blockDim.x) * step) {
    if (vec)
      *reinterpret_cast<uint2*>(q.codes + base + c) =
          fp8q::codes8<false>(*reinterpret_cast<const uint4*>(out + base + c), s);
    else
      q.codes[base + c] = fp8q::code1(b2f(out[base + c]), s);
  }
}

// The same numbers with the row in registers: one block of cols / (8 · kChunks) threads per row,
// thread i holding chunks i, i + blockDim.x, ... of 8 columns (16-byte loads of g and u,
// kChunks in flight each). The codes come from those registers, so `out` is stored only
// without q.skip_out (the GEMM that reads the codes is out's only reader).
template <int kChunks>
__global__ void silu_mul_fp8_regs_kernel(const bf16* g, const bf16* u, int64_t ldi, bf16* out,
                                         int64_t cols, Fp8Act q) {
  pdl_begin();  // launch_pdl: before any read or write
  __shared__ float red[32];
  const int64_t base = int64_t(blockIdx.x) * cols, stride = int64_t(blockDim.x) * 8;
  const int64_t in = int64_t(blockIdx.x) * ldi;
  uint4 gv[kChunks], uv[kChunks], ov[kChunks];
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int64_t c = in + threadIdx.x * 8 + i * stride;
    gv[i] = *reinterpret_cast<const uint4*>(g + c);
    uv[i] = *reinterpret_cast<const uint4*>(u + c);
  }
  const SiluMul<bf16> op;
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    ov[i] = apply8(gv[i], uv[i], op);
    amax = fp8q::amax8(amax, ov[i]);
  }
  const fp8q::RowScale s = fp8q::row_scale(fp8q::block_max(amax, red));
  if (threadIdx.x == 0) q.scales[blockIdx.x] = s.s;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int64_t c = base + threadIdx.x * 8 + i * stride;
    if (!q.skip_out) *reinterpret_cast<uint4*>(out + c) = ov[i];
    *reinterpret_cast<uint2*>(q.codes + c) = fp8q::codes8<false>(ov[i], s);
  }
}

bool vec16(const void* a, const void* b, const void* c, int64_t n) {
  return n % 8 == 0 && aligned16(a) && aligned16(b) && aligned16(c);
}

template <typename T>
__global__ void div_scalar_kernel(T* x, float d, int64_t n) {
  pdl_begin();  // launch_pdl: before any read or write
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = cvt<T>(ld(x[i]) / d);
}

__global__ void div_scalar_f32_kernel(float* x, float d, int64_t n) {
  pdl_begin();  // launch_pdl: before any read or write
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = rb(x[i] / d);
}

// Logits: fp32 GEMM output rounded to bf16 values (SPEC §4.7), kept as fp32.
__global__ void round_f32_kernel(float* x, int64_t n) {
  pdl_begin();  // launch_pdl: before any read or write
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = rb(x[i]);
}

// Rotate-half RoPE in place (SPEC §7). cos/sin of the fp32 angle evaluated in double and
// rounded to fp32, as the CPU backend does.                 grid: T, block: 128, smem 2*half
template <typename T>
__global__ void rope_kernel(T* x, int64_t cols, int head_dim, const int32_t* __restrict__ pos,
                            const float* __restrict__ inv_freq) {
  pdl_begin();  // launch_pdl: before any read or write
  extern __shared__ float cs[];
  const int half = head_dim / 2;
  const int64_t t = blockIdx.x;
  rope_table(cs, half, pos[t], inv_freq);
  T* row = x + t * cols;
  const int64_t pairs = cols / head_dim * half;
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int64_t h = p / half;
    const int j = int(p % half);
    T* v = row + h * head_dim;
    const float x1 = ld(v[j]), x2 = ld(v[j + half]);
    const float c = cs[j], s = cs[half + j];
    v[j] = cvt<T>(x1 * c - x2 * s);
    v[j + half] = cvt<T>(x2 * c + x1 * s);
  }
}

// Lightning q/k: per-head RMSNorm then RoPE, in place (the numbers of rmsnorm_warp_kernel
// followed by rope_kernel). One block per row; warps take the row's q heads, then k heads
// (head_norm_rope, which the fused lightning kernel runs too).
//                                          grid: T, block: 256, smem: (1 + warps) * head_dim
template <typename T>
__global__ void qk_norm_rope_kernel(T* q, T* k, const T* __restrict__ qn,
                                    const T* __restrict__ kn, int64_t cols, int head_dim,
                                    float eps, const int32_t* __restrict__ pos,
                                    const float* __restrict__ inv_freq) {
  pdl_begin();  // launch_pdl: before any read or write
  extern __shared__ float sm[];
  const int D = head_dim;
  const int warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  float* cs = sm;                  // [D]: cos, sin
  float* buf = sm + D + warp * D;  // [D] this warp's normalised head
  const int64_t t = blockIdx.x;
  rope_table(cs, D / 2, pos[t], inv_freq);
  const int heads = int(cols / D);
  for (int hh = warp; hh < 2 * heads; hh += nwarps) {
    T* v = (hh < heads ? q : k) + t * cols + int64_t(hh % heads) * D;
    head_norm_rope<T>(v, hh < heads ? qn : kn, D, eps, cs, buf,
                      [&](int i, float y) { v[i] = cvt<T>(y); });
  }
}

// qk_norm_rope_kernel for head_dim D = 64 / 128 (head_norm_rope_regs): one block per row;
// warps take the row's q heads, then its k heads, with the lane's norm weights and RoPE
// factors in registers.                          grid: T, block: 256, smem: D floats (cs)
template <typename T, int D>
__global__ void qk_norm_rope_regs_kernel(T* q, T* k, const T* __restrict__ qn,
                                         const T* __restrict__ kn, int64_t cols, float eps,
                                         const int32_t* __restrict__ pos,
                                         const float* __restrict__ inv_freq) {
  pdl_begin();  // launch_pdl: before any read or write
  __shared__ float cs[D];
  const int warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  const int64_t t = blockIdx.x;
  rope_table(cs, D / 2, pos[t], inv_freq);
  const int heads = int(cols / D);
#pragma unroll 1
  for (int side = 0; side < 2; ++side) {
    T* row = (side == 0 ? q : k) + t * cols;
    float w[D / 32], c[D / 64], s[D / 64];
    head_norm_rope_regs_load<T, D>(side == 0 ? qn : kn, cs, w, c, s);
    for (int h = warp; h < heads; h += nwarps) {
      T* v = row + h * D;
      head_norm_rope_regs<T, D>(v, w, eps, c, s, [&](int i, float y) { v[i] = cvt<T>(y); });
    }
  }
}

template <typename T>
__global__ void gather_rows_kernel(const T* x, int64_t cols, const int32_t* rows, T* out) {
  pdl_begin();  // launch_pdl: before any read or write
  const int64_t r = blockIdx.x;
  const T* src = x + int64_t(rows[r]) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[r * cols + c] = src[c];
}

int grid_for(int64_t n, int block = 256) {
  return int(std::clamp<int64_t>((n + block - 1) / block, 1, 132 * 16));
}

// Compiled like every kernel of the backend: its PTX version says whether this build's
// kernels have griddepcontrol.wait on the current device.
__global__ void pdl_probe_kernel() {}

}  // namespace

bool pdl_launch_enabled() {
  static const bool on = [] {
    int dev = 0, major = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    cudaFuncAttributes fa{};
    CUDA_CHECK(cudaFuncGetAttributes(&fa, pdl_probe_kernel));
    return major >= 9 && fa.ptxVersion >= 90;
  }();
  return on;
}

template <typename T>
void launch_embedding(const T* table, const int32_t* ids, int64_t rows, int64_t cols, float scale,
                      T* out, cudaStream_t st) {
  if (rows == 0) return;
  launch_pdl(embedding_kernel<T>, unsigned(rows), 256, 0, st, table, ids, cols, scale, out);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_silu_mul(const T* g, const T* u, T* out, int64_t n, cudaStream_t st) {
  if (n == 0) return;
  const bool vec = std::is_same_v<T, bf16> && vec16(g, u, out, n);
  launch_pdl(binary_kernel<T, SiluMul<T>>, grid_for(vec ? n / 8 : n), 256, 0, st, g, u, out, n,
             vec, SiluMul<T>{});
  CUDA_CHECK_LAUNCH();
}

namespace {

// silu_mul_fp8's kernels over g, u [rows, ldi] (cols used), out [rows, cols].
void silu_mul_fp8_rows(const bf16* g, const bf16* u, int64_t ldi, bf16* out, int64_t rows,
                       int64_t cols, Fp8Act q, cudaStream_t st) {
  const bool vec = vec16(g, u, out, cols) && ldi % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(q.codes) % 8 == 0;
  // Rows of 8 · 32 · k columns, k ≤ 4 chunks per thread, ≤ 512 threads: the register kernel
  // (the MLP's 16384: 512 threads of 4 chunks); otherwise the kernel that reads `out` back.
  const int64_t chunks = cols / 8;
  for (int k : {1, 2, 4}) {
    if (!vec || chunks % (32 * k) != 0 || chunks / k > 512) continue;
    const auto kernel = k == 1   ? silu_mul_fp8_regs_kernel<1>
                        : k == 2 ? silu_mul_fp8_regs_kernel<2>
                                 : silu_mul_fp8_regs_kernel<4>;
    launch_pdl(kernel, unsigned(rows), unsigned(chunks / k), 0, st, g, u, ldi, out, cols, q);
    CUDA_CHECK_LAUNCH();
    return;
  }
  launch_pdl(silu_mul_fp8_kernel, unsigned(rows), 512, 0, st, g, u, ldi, out, cols, vec, q);
  CUDA_CHECK_LAUNCH();
}

// Blocks along a row of n elements (chunks of 8 when vec) for the 256-thread row kernels.
unsigned row_blocks(int64_t n, bool vec) {
  const int64_t per = vec ? 8 * 256 : 256;
  return unsigned(std::max<int64_t>(1, (n + per - 1) / per));
}

}  // namespace

void launch_silu_mul_fp8(const bf16* g, const bf16* u, bf16* out, int64_t rows, int64_t cols,
                         Fp8Act q, cudaStream_t st) {
  if (rows == 0) return;
  silu_mul_fp8_rows(g, u, cols, out, rows, cols, q, st);
}

void launch_silu_mul_halves_fp8(const bf16* x, int64_t T, int64_t I, bf16* out, Fp8Act q,
                                cudaStream_t st) {
  if (T == 0) return;
  silu_mul_fp8_rows(x, x + I, 2 * I, out, T, I, q, st);
}

void launch_split_cols(const bf16* x, int64_t T, int64_t N, const GemvOut& s, cudaStream_t st) {
  if (T == 0) return;
  bool vec = N % 8 == 0 && aligned16(x);
  for (int p = 0; p < s.nparts; ++p) vec = vec && s.end[p] % 8 == 0 && aligned16(s.y[p]);
  launch_pdl(split_cols_kernel, dim3(row_blocks(N, vec), unsigned(T)), 256, 0, st, x, N, s, vec);
  CUDA_CHECK_LAUNCH();
}

void launch_silu_mul_halves(const bf16* x, int64_t T, int64_t I, bf16* out, cudaStream_t st) {
  if (T == 0) return;
  const bool vec = I % 8 == 0 && aligned16(x) && aligned16(out);
  launch_pdl(silu_mul_halves_kernel, dim3(row_blocks(I, vec), unsigned(T)), 256, 0, st, x, I,
             out, vec);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_mul_sigmoid(const T* a, const T* gate, T* out, int64_t n, cudaStream_t st) {
  if (n == 0) return;
  const bool vec = std::is_same_v<T, bf16> && vec16(gate, a, out, n);
  launch_pdl(binary_kernel<T, MulSigmoid<T>>, grid_for(vec ? n / 8 : n), 256, 0, st, gate, a, out,
             n, vec, MulSigmoid<T>{});
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_div_scalar(T* x, float d, int64_t n, cudaStream_t st) {
  if (n == 0) return;
  launch_pdl(div_scalar_kernel<T>, grid_for(n), 256, 0, st, x, d, n);
  CUDA_CHECK_LAUNCH();
}

void launch_div_scalar_f32(float* x, float d, int64_t n, cudaStream_t st) {
  if (n == 0) return;
  launch_pdl(div_scalar_f32_kernel, grid_for(n), 256, 0, st, x, d, n);
  CUDA_CHECK_LAUNCH();
}

void launch_round_f32(float* x, int64_t n, cudaStream_t st) {
  if (n == 0) return;
  launch_pdl(round_f32_kernel, grid_for(n), 256, 0, st, x, n);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_rope(T* x, int64_t rows, int64_t cols, int head_dim, const int32_t* pos,
                 const float* inv_freq, cudaStream_t st) {
  if (rows == 0) return;
  launch_pdl(rope_kernel<T>, unsigned(rows), 128, size_t(head_dim) * 4, st, x, cols, head_dim, pos,
             inv_freq);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_qk_norm_rope(T* q, T* k, const T* qn, const T* kn, int64_t rows, int64_t cols,
                         int head_dim, float eps, const int32_t* pos, const float* inv_freq,
                         cudaStream_t st) {
  if (rows == 0) return;
  constexpr int kThreads = 256;
  const size_t smem = size_t(1 + kThreads / 32) * size_t(head_dim) * 4;
  if (head_dim == 128)
    launch_pdl(qk_norm_rope_regs_kernel<T, 128>, unsigned(rows), kThreads, 0, st, q, k, qn, kn,
               cols, eps, pos, inv_freq);
  else if (head_dim == 64)
    launch_pdl(qk_norm_rope_regs_kernel<T, 64>, unsigned(rows), kThreads, 0, st, q, k, qn, kn,
               cols, eps, pos, inv_freq);
  else
    launch_pdl(qk_norm_rope_kernel<T>, unsigned(rows), kThreads, smem, st, q, k, qn, kn, cols,
               head_dim, eps, pos, inv_freq);
  CUDA_CHECK_LAUNCH();
}

void launch_gather_rows(const void* x, int64_t cols, int elem_size, const int32_t* rows, int R,
                        void* out, cudaStream_t st) {
  if (R == 0) return;
  if (elem_size == 2)
    launch_pdl(gather_rows_kernel<uint16_t>, unsigned(R), 256, 0, st,
               static_cast<const uint16_t*>(x), cols, rows, static_cast<uint16_t*>(out));
  else
    launch_pdl(gather_rows_kernel<uint32_t>, unsigned(R), 256, 0, st,
               static_cast<const uint32_t*>(x), cols, rows, static_cast<uint32_t*>(out));
  CUDA_CHECK_LAUNCH();
}

// The two storage types of the templated launchers (cuda_kernels.h).
#define SALA_OPS_INSTANTIATE(T)                                                                   \
  template void launch_embedding<T>(const T*, const int32_t*, int64_t, int64_t, float, T*,       \
                                    cudaStream_t);                                                \
  template void launch_silu_mul<T>(const T*, const T*, T*, int64_t, cudaStream_t);              \
  template void launch_mul_sigmoid<T>(const T*, const T*, T*, int64_t, cudaStream_t);           \
  template void launch_div_scalar<T>(T*, float, int64_t, cudaStream_t);                          \
  template void launch_rope<T>(T*, int64_t, int64_t, int, const int32_t*, const float*,          \
                               cudaStream_t);                                                     \
  template void launch_qk_norm_rope<T>(T*, T*, const T*, const T*, int64_t, int64_t, int, float, \
                                       const int32_t*, const float*, cudaStream_t);
SALA_OPS_INSTANTIATE(bf16)
SALA_OPS_INSTANTIATE(float)
#undef SALA_OPS_INSTANTIATE

}  // namespace sala::cuda
