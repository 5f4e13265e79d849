// W4A16 on the GPU (issue 22): the skinny GEMM of decode and verify rows (M <= kGemvMaxRows =
// 64) on packed int4 weights, and the dequantization of a weight to a bf16 / fp32 matrix for
// the prefill GEMMs (GemmDispatch::linear_int4, cuda_gemm_int4.cpp). The twin of
// CpuBackend::linear_int4 (cpu_int4.cpp): W[n, k] = q[n, k] · s[n, k / group].
//
// Device layout (load-time repack, launch_int4_repack; rows stay rows, so Weight::slice_rows
// still finds a stacked weight's parts): the checkpoint's words [N, K / 8] (compressed-tensors
// pack-quantized: k % 8 in nibble k % 8, value q + 8) with the nibbles of every word permuted
// so that nibble j holds k 2j and nibble j + 4 holds k 2j + 1 (j = 0..3). Then one lop3 per
// pair (q >> 4j) & 0x000f000f | 0x4300'4300 is the bf16x2 (128 + q_2j + 8, 128 + q_2j+1 + 8)
// of two consecutive k, and fma(·, 1, -136) gives the exact bf16 pair (q_2j, q_2j+1): 11
// instructions per word of 8 weights, no conversion tables. Scales stay fp32 [N, K / group].
//
// Numerics of the GEMV. mma.sync m16n8k16 bf16 with the codes q (exact in bf16) as A and the x
// rows as B, fp32 accumulation: per group of 128 k the products q · x (exact in fp32) are
// summed into fresh registers, multiplied by the group's scale and added to the fp32 totals
// (acc = fma(part, s, acc)): y = Σ_g s_g · Σ_{k in g} q_k x_k, the CPU's Σ_k (q_k s_g) x_k in
// another fp32 order (the CPU multiplies q · s exactly first). The 8 warps' partials are summed
// in warp order and rounded once, as the bf16 GEMV.
//
// Layout of the arithmetic. A 16-byte chunk of a weight row is 4 words = 32 k. Lane (g, t) of a
// warp takes chunk 4v + t (v = 0..3) of weight rows g and g + 8 of each 16-row half of the
// tile, i.e. the four lanes t of an mma together cover chunks 4v .. 4v + 3 = one group of 128
// k (so a group size must be a multiple of 128: one scale per mma partial). Word i of the chunk
// feeds two k16 MMAs: pairs (2t, 2t+1) / (2t+8, 2t+9) of the fragments are the word's pairs 0 /
// 1, then 2 / 3, and the x rows' uint4 of the same 8 k as B: k is permuted identically in A and
// B, so the dot products are unchanged.
//
// Row invariance: every output (n, m) is one accumulator column; its mma sequence, the group
// partials, the scale fma and the K split depend only on K; the epilogue sums in warp order.
// Other rows of x only feed other columns of B: a row's result is bit-identical for any M in
// 1..64 (the speculative verify path relies on it: tests/ops CudaInt4Gemv.RowInvariance).
//
// Streaming: cuda_gemv.cu's persistent ring (cuda_gemv_ring.cuh: one CTA per SM, each warp its
// fixed K slice through a private 3-stage ring of 32 rows x 256 B = 512 k), plus a
// second small ring for the scales: with every stage, each lane copies the four group scales
// of one of the stage's 32 rows (one cp.async of 16 B with group 128 and aligned rows, else
// four of 4 B), so a scale is in shared memory when its stage is (a register prefetch would
// have to rotate registers that loads are still writing). The
// epilogue runs in passes of 8 columns (finish<..., 8>) to make room: 229,376 B in all.
// M <= 16: x of the next chunk group is loaded during the current one; M > 16: per n-tile
// group and 16-row half (from L1), the codes of each half dequantized once.
//
// PDL (sm_90+): each CTA issues its first two stages, then griddepcontrol.wait; x is read and y
// written only after it. No fallback kernel: on GPUs without 229 KB of shared memory per block
// (A100) gemv_int4_supported says no and GemmDispatch dequantizes to bf16 and runs the bf16
// path.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv_int4.cuh"
#include "backend/cuda/cuda_gemv_int4_math.cuh"
#include "backend/cuda/cuda_gemv_ring.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_smem_optin.h"

namespace sala::cuda {
namespace {
using namespace gemv;

// ---- ring kernel ----
// x has no __restrict__: under PDL it is written by the preceding grid while this one runs.
template <int NT>
__global__ void __launch_bounds__(kThreads, 1)
    gemv4_ring_kernel(const bf16* x, int64_t ldx, const uint32_t* __restrict__ w,
                      const float* __restrict__ ws, int64_t N, int K, int group, int M, GemvOut o,
                      int ntiles) {
  constexpr int G = NT < kGroupNT ? NT : kGroupNT, NG = NT / G;
  extern __shared__ __align__(128) unsigned char smem[];
  pdl_trigger();  // a GEMV after this one may start its weight prologue
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  Int4Ring<bulk_rows(NT)> r(smem, w, ws, N, K, group, o.silu_pair, ntiles);  // first stages
  const Slice& s = r.s;
  const Walk& wk = r.wk;
  pdl_wait();  // every CTA, tiles or not: x and y only after the preceding grid completed
  const XLane xl(reinterpret_cast<const uint8_t*>(x), ldx * 2, M, g);
  const uint32_t lo = lane_off(g, t);  // ring reads at immediate offsets from it
  int u = 0;
  for (int ti = 0; ti < wk.ntc; ++ti) {
    float acc[2][NT][4] = {};
    for (int st = 0; st < wk.nst; ++st, ++u) {
      const int c0 = s.cb + st * kCps;
      uint4 X[G][4];
      if constexpr (NG == 1)  // chunk group 0, in flight while waiting for the stage
        load_x<G>(X, xl, 0, c0 + t, c0 < s.ce);
      r.wait<kStages - 2>(u);  // stage u landed; slot (u - 1) % S read
      r.issue();  // stage u + 2
      const uint32_t base = r.base(u), sbase = r.sbase(u);
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        if (c0 + 4 * v >= s.ce) break;  // uniform: the slice ends at a whole chunk group
        const int cl = 4 * v + t;
        uint4 Wr[2][2];  // [half rt][row g / g + 8]
        float sc[2][2];
#pragma unroll
        for (int rt = 0; rt < 2; ++rt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = rt * 16 + g + 8 * h;
            Wr[rt][h] = lds(base + lo + row_off(rt * 16 + 8 * h) + v * 64);
            sc[rt][h] = lds_f32(sbase + r * 16 + v * 4);
          }
        [[maybe_unused]] uint4 Xn[G][4];
        if constexpr (NG == 1)  // the next chunk group's x while this one computes
          load_x<G>(Xn, xl, 0, c0 + 4 * (v + 1) + t, v < 3 && c0 + 4 * (v + 1) < s.ce);
        // Each half's codes are dequantized once per chunk group; M > 16: its n-tile groups
        // then load their x in turn (from L1 again for the second half, which costs less than
        // dequantizing per n-tile group).
#pragma unroll
        for (int rt = 0; rt < 2; ++rt) {
          uint32_t a[4][4], b[4][4];
          dequant_chunk(Wr[rt][0], Wr[rt][1], a, b);
#pragma unroll
          for (int q = 0; q < NG; ++q) {
            if (8 * G * q >= M) break;  // n-tiles wholly past M (uniform)
            if constexpr (NG > 1) load_x<G>(X, xl, G * q, c0 + cl, true);
            float part[G][4] = {};
            chunk_mma<G>(part, a, b, X);
            add_scaled<G>(acc[rt], G * q, part, sc[rt]);
          }
        }
        if constexpr (NG == 1)
#pragma unroll
          for (int j = 0; j < G; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) X[j][i] = Xn[j][i];
      }
    }
    finish<kRows, 2, NT, Unscaled, kPass>(r.red, acc, int64_t(wk.tile(ti)) * kRows, N, M, o,
                                          wk.epi(ti), r.gate, Unscaled{});
    __syncthreads();  // red is reused by the next tile
  }
  cp_wait<0>();  // only empty groups can remain
}

// ---- load-time repack and dequantization ----
// Nibble position of k % 8 in a repacked word: k 2j -> j, k 2j + 1 -> j + 4.
__host__ __device__ constexpr int repacked_nibble(int k8) { return k8 / 2 + 4 * (k8 % 2); }

__global__ void int4_repack_kernel(uint32_t* w, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t a = w[i];
    uint32_t r = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) r |= ((a >> (4 * k)) & 0xfu) << (4 * repacked_nibble(k));
    w[i] = r;
  }
}

// out[n, k] = q[n, k] · s[n, k / group] (fp32, exact), stored as T (bf16: rounded to nearest
// even). Rows over blockIdx.y, words over x: one thread per word (8 outputs, one 16-byte bf16
// store), 32-bit index arithmetic inside a row.
template <typename T>
__global__ void int4_dequant_kernel(const uint32_t* __restrict__ w, const float* __restrict__ ws,
                                    int64_t rows, int64_t K, int group, T* __restrict__ out) {
  const int wpr = int(K / 8), gpr = int(K / group);
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const uint32_t* wr = w + r * wpr;
    const float* sr = ws + r * gpr;
    T* orow = out + r * K;
    for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < wpr;
         i += int(gridDim.x * blockDim.x)) {
      const uint32_t a = wr[i];
      const int k0 = 8 * i;
      alignas(16) T v[8];
      if (group % 8 == 0) {  // one scale for the word's 8 values
        const float sc = sr[k0 / group];
#pragma unroll
        for (int k = 0; k < 8; ++k)
          v[k] = cvt<T>(float(int((a >> (4 * repacked_nibble(k))) & 0xfu) - 8) * sc);
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k)
          v[k] = cvt<T>(float(int((a >> (4 * repacked_nibble(k))) & 0xfu) - 8) *
                        sr[(k0 + k) / group]);
      }
      T* dst = orow + k0;
      if constexpr (sizeof(T) == 2) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(v);
      } else {
        reinterpret_cast<float4*>(dst)[0] = *reinterpret_cast<const float4*>(v);
        reinterpret_cast<float4*>(dst)[1] = *reinterpret_cast<const float4*>(v + 4);
      }
    }
  }
}

// The model's shapes (K and group multiples of 32): each thread takes 4 words (32 k of one
// group: one 16-byte load, one scale, four or eight 16-byte stores) over the flattened
// [rows, K / 32] index, the grid striding over it. The one-word-per-thread kernel above made
// blocks of 1 KB of codes each; it ran a 9B forward's weights at ≈ 2.96 TB/s of reads plus
// writes (7.78 ms, CudaInt4Gemv.DequantSpeed, session 11). The same values.
template <typename T>
__global__ void int4_dequant32_kernel(const uint4* __restrict__ w, const float* __restrict__ ws,
                                      uint32_t rows, uint32_t cpr, int gpr, int group,
                                      T* __restrict__ out) {
  const uint32_t total = rows * cpr;  // < 2^31 (checked by the launcher)
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const uint32_t r = i / cpr, c = i - r * cpr;
    const uint4 q = w[i];  // words 4c .. 4c + 3 of row r: rows are cpr uint4 long
    const float sc = ws[size_t(r) * gpr + (32 * c) / group];
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
    T* dst = out + size_t(i) * 32;  // row r, k 32 c: rows are 32 cpr = K long
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      alignas(16) T v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k)
        v[k] = cvt<T>(float(int((words[j] >> (4 * repacked_nibble(k))) & 0xfu) - 8) * sc);
      if constexpr (sizeof(T) == 2) {
        reinterpret_cast<uint4*>(dst)[j] = *reinterpret_cast<const uint4*>(v);
      } else {
        reinterpret_cast<float4*>(dst)[2 * j] = *reinterpret_cast<const float4*>(v);
        reinterpret_cast<float4*>(dst)[2 * j + 1] = *reinterpret_cast<const float4*>(v + 4);
      }
    }
  }
}

int grid_for(int64_t n) { return int(std::min<int64_t>((n + 255) / 256, 132 * 16)); }

// ---- host side ----
using Setup = RingDevice;

const Setup& setup() {
  static const Setup s = ring_device(kRingSmem);
  static OncePerDevice attributes;  // per device: a TP rank's backend may run on another GPU
  if (s.ring)
    attributes([] {
      for (auto* k : {gemv4_ring_kernel<1>, gemv4_ring_kernel<2>, gemv4_ring_kernel<4>,
                      gemv4_ring_kernel<8>})
        CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kRingSmem));
    });
  return s;
}

}  // namespace

void gemv_int4_init() { setup(); }

bool gemv_int4_supported(const void* w, int64_t K, int64_t group, int64_t M) {
  return setup().ring && M >= 1 && M <= kGemvMaxRows && K > 0 && K % kGroupK == 0 &&
         group > 0 && group % kGroupK == 0 && K % group == 0 && K <= (int64_t(1) << 30) &&
         aligned16(w);
}

bool gemv_int4_silu_pair_supported(int64_t N) { return setup().ring && N % (2 * kRows) == 0; }

void launch_gemv_int4(const bf16* x, int64_t ldx, const uint32_t* w, const float* w_scales,
                      int64_t N, int K, int group, int M, const GemvOut& o, cudaStream_t st) {
  if (!(gemv_int4_supported(w, K, group, M) && ldx % 8 == 0 && aligned16(x) && w_scales &&
        N >= 1) ||
      (o.silu_pair && !gemv_int4_silu_pair_supported(N))) {
    std::fprintf(stderr,
                 "%s:%d: int4 GEMV unsupported: M = %d, K = %d, group = %d, N = %lld, ldx = %lld, "
                 "silu_pair = %d\n",
                 __FILE__, __LINE__, M, K, group, static_cast<long long>(N),
                 static_cast<long long>(ldx), int(o.silu_pair));
    std::abort();
  }
  const Setup& s = setup();
  with_nt(M, [&]<int NT>() {
    const int ntiles = int((N + kRows - 1) / kRows);  // every CTA has >= 1 tile
    launch_pdl(gemv4_ring_kernel<NT>, dim3(unsigned(std::min(ntiles, s.sms))), dim3(kThreads),
               size_t(kRingSmem), st, x, ldx, w, w_scales, N, K, group, M, o, ntiles);
  });
}

void launch_int4_repack(uint32_t* w, int64_t words, cudaStream_t st) {
  if (words <= 0) return;
  int4_repack_kernel<<<grid_for(words), 256, 0, st>>>(w, words);
  CUDA_CHECK_LAUNCH();
}

// The sm_90 prefill GEMM's scales (cuda_gemm_int4_sm90.cu): scales_t[g * ld + n] =
// scales[n, g] as T (bf16 only for bf16 values, so exact); one thread per scale.
template <typename T>
__global__ void int4_scales_transposed_kernel(const float* __restrict__ ws, int64_t N, int64_t gpr,
                                              T* __restrict__ scales_t, int64_t ld) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * gpr;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / gpr, g = i - n * gpr;
    scales_t[g * ld + n] = cvt<T>(ws[i]);
  }
}

void launch_int4_scales_transposed(const float* w_scales, int64_t N, int64_t groups,
                                   void* scales_t, bool scales_bf16, int64_t ld,
                                   cudaStream_t st) {
  if (N <= 0 || groups <= 0) return;
  if (ld < N) {
    std::fprintf(stderr, "%s:%d: int4 scales: ld %lld < N %lld\n", __FILE__, __LINE__,
                 static_cast<long long>(ld), static_cast<long long>(N));
    std::abort();
  }
  const int grid = grid_for(N * groups);
  if (scales_bf16)
    int4_scales_transposed_kernel<<<grid, 256, 0, st>>>(w_scales, N, groups,
                                                        static_cast<bf16*>(scales_t), ld);
  else
    int4_scales_transposed_kernel<<<grid, 256, 0, st>>>(w_scales, N, groups,
                                                        static_cast<float*>(scales_t), ld);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_int4_dequantize(const uint32_t* w, const float* w_scales, int64_t rows, int64_t K,
                            int group, T* out, cudaStream_t st) {
  if (rows <= 0) return;
  if (!(K % 8 == 0 && group > 0 && K % group == 0 && K / 8 < (int64_t(1) << 31) &&
        aligned16(out))) {
    std::fprintf(stderr, "%s:%d: int4 dequantize: K = %lld, group = %d\n", __FILE__, __LINE__,
                 static_cast<long long>(K), group);
    std::abort();
  }
  if (K % 32 == 0 && group % 32 == 0 && rows * (K / 32) < (int64_t(1) << 31) && aligned16(w)) {
    const int64_t total = rows * (K / 32);
    int4_dequant32_kernel<T><<<grid_for(total), 256, 0, st>>>(
        reinterpret_cast<const uint4*>(w), w_scales, uint32_t(rows), uint32_t(K / 32),
        int(K / group), group, out);
    CUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t wpr = K / 8;
  const dim3 grid(unsigned(std::min<int64_t>((wpr + 255) / 256, 64)),
                  unsigned(std::min<int64_t>(rows, 16384)));
  int4_dequant_kernel<T><<<grid, 256, 0, st>>>(w, w_scales, rows, K, group, out);
  CUDA_CHECK_LAUNCH();
}
template void launch_int4_dequantize<bf16>(const uint32_t*, const float*, int64_t, int64_t, int,
                                           bf16*, cudaStream_t);
template void launch_int4_dequantize<float>(const uint32_t*, const float*, int64_t, int64_t, int,
                                            float*, cudaStream_t);

}  // namespace sala::cuda
