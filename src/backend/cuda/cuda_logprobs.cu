// Log-probabilities on the device (Backend::logprobs_rows; the host twin is logprobs_of_row,
// backend/logprobs.cpp): one 512-thread block per requested logit row, so a step that returns
// logprobs moves n · (1 + 2 · top_n) numbers to the host instead of n × 73,448 floats.
//
// Per row, the host's arithmetic in the host's operation order:
//   m   = max of the row (fmaxf: a NaN is skipped, as std::max(m, NaN) keeps m; all -inf or
//         all NaN: -inf)
//   sum = Σ exp(double(x_j) - double(m))  in double (CUDA's exp(double), ≤ 1 ulp; glibc's is
//         correctly rounded in nearly all cases)
//   lse = double(m) + log(sum)            (CUDA's log(double), ≤ 1 ulp)
//   logprob(t) = float(double(x_t) - lse) (NaN for t < 0; the host's quiet NaN bits)
// Where the bits may differ: the sum is a fixed tree over the block's threads (per-thread
// partial sums, then warp shuffles) where the host adds left to right, and exp / log may differ
// by one double ulp. So lse differs by a few double ulps at most and the fp32 results are the
// host's except where the double lands within that distance of an fp32 rounding boundary (about
// one value in 10^8; tests/ops/test_cuda_logprobs.cpp allows one fp32 ulp and counts the
// identical ones). A row with no finite maximum (all -inf, or a +inf) gives NaN everywhere, as
// on the host (exp(-inf - -inf) = NaN).
//
// Top-n: the n largest logits in the total order (value descending, id ascending): exactly the
// host's insertion list, which keeps the lower id on ties and compares -0 and +0 equal. The
// order compares raw fp32 logits only (no arithmetic), so the ids are the host's bit for bit,
// ties included. Each thread keeps its K best ranks in registers (K = 1, 5 or 20 >= top_n), a
// rank being (order-preserving key << 32) | ~id, so distinct ids have distinct ranks and the
// larger rank wins; each warp then merges its lanes' lists in top_n rounds of a warp maximum,
// and warp 0 merges the warps' lists the same way. The one difference: a NaN logit is never a
// top entry (the host's insertion list treats NaN position-dependently; such a row's
// log-probabilities are NaN on both sides).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_logprobs.h"

namespace sala::cuda {
namespace {

using ull = unsigned long long;
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

// Larger float → larger key; -0 and +0 are one key (the host compares them equal).
__device__ __forceinline__ uint32_t order_key(float l) {
  if (l == 0.0f) l = 0.0f;
  const uint32_t u = __float_as_uint(l);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
// The rank of logit l at id i: larger is better, ties in l to the lower id; 0 (never a top
// entry) for NaN. Every other rank is > 0: the smallest key, of -inf, is 0x007fffff.
__device__ __forceinline__ ull rank_of(float l, int32_t i) {
  if (isnan(l)) return 0;
  return (ull(order_key(l)) << 32) | ull(~uint32_t(i));
}
__device__ __forceinline__ int32_t id_of(ull rank) { return int32_t(~uint32_t(rank)); }

__device__ __forceinline__ ull warp_max_u64(ull v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const ull w = __shfl_xor_sync(kFull, v, o);
    v = w > v ? w : v;
  }
  return v;
}

// A thread's K largest ranks, descending, in registers (every index is a constant after
// unrolling); 0 marks an empty place.
template <int K>
struct TopList {
  ull v[K];
  __device__ __forceinline__ void init() {
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = 0;
  }
  __device__ __forceinline__ void insert(ull c) {
    if (!(c > v[K - 1])) return;  // nearly every logit once the list is warm
#pragma unroll
    for (int k = K - 1; k > 0; --k) v[k] = c > v[k - 1] ? v[k - 1] : (c > v[k] ? c : v[k]);
    if (c > v[0]) v[0] = c;
  }
  __device__ __forceinline__ void pop() {
#pragma unroll
    for (int k = 0; k + 1 < K; ++k) v[k] = v[k + 1];
    v[K - 1] = 0;
  }
};

// Grid: one block per requested row. logits [*, V] fp32; rows, targets [gridDim.x]; out:
// logprob [gridDim.x], top_ids / top_logprobs [gridDim.x, top_n]. K: the per-thread list
// (0: no top entries), K >= top_n.
template <int K>
__global__ void __launch_bounds__(kThreads)
    logprobs_rows_kernel(const float* __restrict__ logits, int32_t V,
                         const int32_t* __restrict__ rows, const int32_t* __restrict__ targets,
                         int top_n, float* __restrict__ logprob, int32_t* __restrict__ top_ids,
                         float* __restrict__ top_logprobs) {
  __shared__ float red_f[kWarps];
  __shared__ double red_d[kWarps];
  __shared__ ull warp_top[kWarps][K > 0 ? K : 1];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* row = logits + int64_t(rows[blockIdx.x]) * V;

  // 1. The maximum and each thread's K best ranks, in one pass.
  float m = -INFINITY;
  TopList<(K > 0 ? K : 1)> top;
  top.init();
  for (int32_t i = threadIdx.x; i < V; i += kThreads) {
    const float x = row[i];
    m = fmaxf(m, x);
    if constexpr (K > 0) top.insert(rank_of(x, i));
  }
  m = warp_max(m);
  if (lane == 0) red_f[warp] = m;
  __syncthreads();
  m = warp_max(lane < kWarps ? red_f[lane] : -INFINITY);  // every warp: the same value

  // 2. The sum of exp(x - m) in double (per-thread partials, then a fixed tree).
  const double dm = double(m);
  double s = 0.0;
  for (int32_t i = threadIdx.x; i < V; i += kThreads) s += exp(double(row[i]) - dm);
  s = warp_sum_d(s);
  if (lane == 0) red_d[warp] = s;
  __syncthreads();
  s = warp_sum_d(lane < kWarps ? red_d[lane] : 0.0);
  const double lse = dm + log(s);
  const int32_t t = targets[blockIdx.x];
  if (threadIdx.x == 0)
    logprob[blockIdx.x] = t >= 0 ? float(double(row[t]) - lse) : __uint_as_float(0x7fc00000u);

  // 3. Top-n: each warp's top_n best ranks (a lane whose head wins pops it), then warp 0
  // merges the warps' sorted lists.
  if constexpr (K > 0) {
    for (int r = 0; r < top_n; ++r) {
      const ull h = top.v[0];
      const ull best = warp_max_u64(h);
      if (best != 0 && h == best) top.pop();  // ranks are distinct: one lane
      if (lane == 0) warp_top[warp][r] = best;
    }
    __syncthreads();
    if (warp == 0) {
      int pos = 0;  // lane w < kWarps: the next entry of warp w's list
      int32_t* ids = top_ids + int64_t(blockIdx.x) * top_n;
      float* lps = top_logprobs + int64_t(blockIdx.x) * top_n;
      for (int r = 0; r < top_n; ++r) {
        const ull h = lane < kWarps && pos < top_n ? warp_top[lane][pos] : 0;
        const ull best = warp_max_u64(h);
        if (best != 0 && h == best) ++pos;
        if (lane == 0) {
          // Fewer candidates than top_n (a vocabulary smaller than top_n): the host's -1, -inf.
          const int32_t id = best != 0 ? id_of(best) : -1;
          ids[r] = id;
          lps[r] = id >= 0 ? float(double(row[id]) - lse) : -INFINITY;
        }
      }
    }
  }
}

}  // namespace

void launch_logprobs_rows(const float* logits, int32_t vocab, const int32_t* rows,
                          const int32_t* targets, int64_t n, int top_n, float* logprob,
                          int32_t* top_ids, float* top_logprobs, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned grid = unsigned(n);
  if (top_n == 0)
    logprobs_rows_kernel<0><<<grid, kThreads, 0, stream>>>(logits, vocab, rows, targets, top_n,
                                                           logprob, top_ids, top_logprobs);
  else if (top_n == 1)
    logprobs_rows_kernel<1><<<grid, kThreads, 0, stream>>>(logits, vocab, rows, targets, top_n,
                                                           logprob, top_ids, top_logprobs);
  else if (top_n <= 5)
    logprobs_rows_kernel<5><<<grid, kThreads, 0, stream>>>(logits, vocab, rows, targets, top_n,
                                                           logprob, top_ids, top_logprobs);
  else
    logprobs_rows_kernel<20><<<grid, kThreads, 0, stream>>>(logits, vocab, rows, targets, top_n,
                                                            logprob, top_ids, top_logprobs);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sala::cuda
