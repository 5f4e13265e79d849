// Device code shared by kernels of more than one file, so that a fused kernel computes the
// numbers of the kernels it replaces with the very same code (bit for bit, for T = bf16 and
// T = float):
//   MulSigmoid      the output gate: mul_sigmoid (cuda_ops.cu), rmsnorm_mul_sigmoid (cuda_norm.cu)
//   rope_cos_sin    RoPE cos / sin of one position and frequency: rope_table, the fused
//                   lightning kernel (gla_recurrent_kernel<T, D, true>, cuda_lightning.cu)
//   rope_table      RoPE cos / sin of one position: rope_kernel, qk_norm_rope_kernel (cuda_ops.cu)
//   head_norm_rope  the lightning q/k norm + RoPE of one head: qk_norm_rope_kernel, the fused
//                   lightning kernel (head_norm_rope_regs: the same for D = 64 / 128 with the
//                   head in registers, qk_norm_rope_regs_kernel and the fused kernel)
#pragma once
#include "backend/cuda/cuda_common.cuh"

namespace sala::cuda {

template <typename T>
struct MulSigmoid {  // T(a * T(sigmoid(gate)))
  __device__ float operator()(float gate, float a) const {
    return a * rnd<T>(1.f / (1.f + expf(-gate)));
  }
};

// rope_cos_sin: cos and sin of the fp32 angle pos · inv_freq, evaluated in double and
// rounded to fp32, as the CPU backend does. rope_table: cs[0, half) = cos, cs[half, 2 half) =
// sin of that angle with inv_freq[j]; ends with a block barrier.
__device__ __forceinline__ void rope_cos_sin(int32_t pos, float inv_freq, float& c, float& s) {
  const float ang = float(pos) * inv_freq;
  double sd, cd;
  sincos(double(ang), &sd, &cd);
  c = float(cd);
  s = float(sd);
}
__device__ __forceinline__ void rope_table(float* cs, int half, int32_t pos,
                                           const float* __restrict__ inv_freq) {
  for (int j = threadIdx.x; j < half; j += blockDim.x)
    rope_cos_sin(pos, inv_freq[j], cs[j], cs[half + j]);
  __syncthreads();
}

// One warp: RMSNorm of the head x[0, D) with weights w[D] (two roundings, SPEC §4.2; lanes
// sum c = lane, lane + 32, ... then warp_sum, as rmsnorm_warp_kernel), then rotate-half RoPE
// (SPEC §7) with the table cs of rope_table: store(i, y) gets the rotated value y of element
// i, before its rounding to T. buf: [D] floats of this warp's shared memory. x is read only
// before the first store, so store may write x in place.
// eps is added with __fadd_rn: where D is a compile-time constant, ss / D becomes an exact
// multiplication that the compiler could fuse with a plain add into one FMA (one rounding
// where a runtime D has two).
template <typename T, typename Store>
__device__ __forceinline__ void head_norm_rope(const T* x, const T* __restrict__ w, int D,
                                               float eps, const float* cs, float* buf,
                                               Store&& store) {
  const int lane = threadIdx.x % 32, half = D / 2;
  float ss = 0.f;
  for (int c = lane; c < D; c += 32) {
    const float v = ld(x[c]);
    ss += v * v;
  }
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(__fadd_rn(ss / float(D), eps));
  for (int c = lane; c < D; c += 32) buf[c] = rnd<T>(rnd<T>(ld(x[c]) * inv) * ld(w[c]));
  __syncwarp();
  for (int j = lane; j < half; j += 32) {
    const float x1 = buf[j], x2 = buf[j + half];
    const float c = cs[j], s = cs[half + j];
    store(j, x1 * c - x2 * s);
    store(j + half, x2 * c + x1 * s);
  }
  __syncwarp();
}

// head_norm_rope for D = 64 or 128 with the head in registers: lane l holds elements
// l + 32i (i < D/32) in v, so each RoPE pair (j, j + D/2) lies in one lane (j = l + 32i,
// i < D/64) and neither a shared buffer nor a warp barrier is needed. The same operations per
// element as head_norm_rope (the sum of squares over c = lane, lane + 32, ... then warp_sum;
// two roundings; rotate-half RoPE); w: the norm weights of the lane's elements, c / s: cos /
// sin of its pairs' frequencies (rope_table's cs[l + 32i], cs[D/2 + l + 32i]).
// qk_norm_rope's kernel and the fused lightning kernel use it for the same D, so their q and
// k agree bit for bit (the ~8 instructions per element of head_norm_rope's buffer and its
// 2-byte reloads bound qk_norm_rope: ncu, session 29).
template <typename T, int D, typename Store>
__device__ __forceinline__ void head_norm_rope_regs(const T* x, const float (&w)[D / 32],
                                                    float eps, const float (&c)[D / 64],
                                                    const float (&s)[D / 64], Store&& store) {
  static_assert(D == 64 || D == 128);
  constexpr int kPer = D / 32, kPairs = D / 64;
  const int lane = threadIdx.x % 32;
  float v[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) v[i] = ld(x[lane + 32 * i]);
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) ss += v[i] * v[i];
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(__fadd_rn(ss / float(D), eps));
#pragma unroll
  for (int i = 0; i < kPer; ++i) v[i] = rnd<T>(rnd<T>(v[i] * inv) * w[i]);
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const float x1 = v[i], x2 = v[i + kPairs];
    store(lane + 32 * i, x1 * c[i] - x2 * s[i]);
    store(lane + 32 * (i + kPairs), x2 * c[i] + x1 * s[i]);
  }
}

// The lane's norm weights and RoPE factors for head_norm_rope_regs, from w [D] and a
// rope_table cs [D].
template <typename T, int D>
__device__ __forceinline__ void head_norm_rope_regs_load(const T* __restrict__ wsrc,
                                                         const float* cs, float (&w)[D / 32],
                                                         float (&c)[D / 64], float (&s)[D / 64]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < D / 32; ++i) w[i] = ld(wsrc[lane + 32 * i]);
#pragma unroll
  for (int i = 0; i < D / 64; ++i) c[i] = cs[lane + 32 * i], s[i] = cs[D / 2 + lane + 32 * i];
}

}  // namespace sala::cuda
