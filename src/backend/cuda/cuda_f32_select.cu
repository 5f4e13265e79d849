// fp32 mode's InfLLM-v2 block selection (SPEC §9.4–9.5, golden README §4 fp32 contract) on
// CUDA cores, with CpuBackend's fp32 numbers: the tensor-core kernels of
// cuda_infllm_select.cu take bf16 operands and round the block scores to bf16, which the fp32
// contract forbids. One block per (row, KV head); no rounding anywhere:
//
//  1. level-2 normaliser of each of the G query heads of the KV head: m_h = max_j s2_h[j],
//     l_h = Σ_j exp(s2_h[j] − m_h) in double over the visible level-2 entries (CpuBackend
//     takes the max first; here it is online, l rescaled in double: equal to ~1e-16);
//  2. level-1 scores score[j] = Σ_h float(exp(double(s1_h[j]) − m_h) / l_h), summed in fp32 in
//     head order as the CPU does, NaN → 0, all 0 when no level-2 entry is visible;
//  3. block max-pooling with forced init / local blocks (+inf), top-k by (score desc, index
//     asc) as K rounds of a block-wide argmax, blocks after the query's dropped, ascending.
// s·_h[j] = tau · (q_h · c_j) in fp32. Stage 2 is attention_kernel<float, true>
// (cuda_sparse.cu).
#include <cmath>

#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_smem_optin.h"

namespace sala::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 64;  // compressed entries per shared-memory tile

// Shared memory (4-byte words; the doubles first): lh [G] double, qs [G][d], tile [64][d+1],
// ps [G][64], mh [G], scores [n1_cap], bscore [nb_cap], best [2 warps], taken [nb_cap] bytes.
struct Layout {
  int G, d, n1_cap, nb_cap;
  __host__ __device__ size_t words() const {
    return size_t(2 * G) + size_t(G) * d + size_t(kTile) * (d + 1) + size_t(G) * kTile + G +
           size_t(n1_cap) + size_t(nb_cap) + 2 * kWarps + (size_t(nb_cap) + 3) / 4;
  }
};

// Entries [j0, j0 + nk) of a compressed cache (KV head g) into tile[j][x] (row stride d + 1),
// then ps[h][j] = tau · q_h · entry_j. Ends with a barrier.
__device__ void score_tile(const float* cache, const CacheGeom& G, const int32_t* pages,
                           long long j0, int nk, int stride, int g, const float* qs, int nq,
                           float tau, float* tile, float* ps) {
  const int d = G.d;
  __syncthreads();  // the previous tile's ps / tile fully consumed
  for (int e = threadIdx.x; e < nk * d; e += kThreads) {
    const int j = e / d, x = e % d;
    tile[j * (d + 1) + x] = cache[entry_off(G, pages, j0 + j, stride) + int64_t(g) * d + x];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < nq * nk; e += kThreads) {
    const int h = e / nk, j = e % nk;
    const float* qh = qs + h * d;
    const float* cj = tile + j * (d + 1);
    float dot = 0.f;
    for (int x = 0; x < d; ++x) dot += qh[x] * cj[x];
    ps[h * kTile + j] = tau * dot;
  }
  __syncthreads();
}

//                                                     grid: (T, kvh), block: kThreads
__global__ void __launch_bounds__(kThreads) f32_select_kernel(
    const float* __restrict__ q, StepRows R, const float* __restrict__ c1,
    const float* __restrict__ c2, SelectParams P, int n1_cap, int32_t* __restrict__ sel,
    int32_t* __restrict__ sel_cnt) {
  pdl_begin();  // launch_pdl: before any read or write
  const int64_t r = blockIdx.x;
  const int g = blockIdx.y;
  const DevSeq s = R.seqs[R.row_seq[r]];
  if (!s.sparse) return;
  const CacheGeom& G = P.g;
  const int d = G.d, nq = P.nh / G.kvh;
  const int32_t* pages = R.page_table + s.page_begin;
  const long long t = s.past_len + (r - s.token_begin), L = s.past_len + s.num_tokens;
  const bool first = s.past_len == 0;
  const long long n1 = num_entries(L, G.k1, G.s1), n2 = num_entries(L, G.k2, G.s2);
  const long long cnt1 = visible_count(t, n1, s.num_tokens, G.k1, G.s1, first);
  const long long cnt2 = visible_count(t, n2, s.num_tokens, G.k2, G.s2, first);
  const int nb = int((L + G.bs - 1) / G.bs), qb = int(t / G.bs), rr = G.bs / G.s1;

  extern __shared__ double smd[];
  double* lh = smd;                                   // [nq]
  float* qs = reinterpret_cast<float*>(lh + nq);      // [nq][d]
  float* tile = qs + nq * d;                          // [64][d+1]
  float* ps = tile + kTile * (d + 1);                 // [nq][64]
  float* mh = ps + nq * kTile;                        // [nq]
  float* scores = mh + nq;                            // [n1_cap]
  float* bscore = scores + n1_cap;                    // [nb_stride]
  float* best_v = bscore + P.nb_stride;                         // [kWarps]
  int* best_i = reinterpret_cast<int*>(best_v + kWarps);        // [kWarps]
  unsigned char* taken = reinterpret_cast<unsigned char*>(best_i + kWarps);  // [nb_stride]
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

  for (int e = tid; e < nq * d; e += kThreads)
    qs[e] = q[r * int64_t(P.nh) * d + int64_t(g) * nq * d + e];
  for (int h = tid; h < nq; h += kThreads) mh[h] = -INFINITY, lh[h] = 0.0;
  for (long long j = tid; j < n1; j += kThreads) scores[j] = 0.f;

  if (cnt2 > 0) {
    // 1. level-2 (max, sum) per head, online over tiles.
    for (long long j0 = 0; j0 < cnt2; j0 += kTile) {
      const int nk = int(cnt2 - j0 < kTile ? cnt2 - j0 : kTile);
      score_tile(c2, G, pages, j0, nk, G.s2, g, qs, nq, P.tau, tile, ps);
      for (int h = warp; h < nq; h += kWarps) {
        float m = -INFINITY;
        for (int j = lane; j < nk; j += 32) m = fmaxf(m, ps[h * kTile + j]);
        m = fmaxf(warp_max(m), mh[h]);
        double l = 0.0;
        for (int j = lane; j < nk; j += 32) l += exp(double(ps[h * kTile + j]) - double(m));
        l = warp_sum_d(l);
        __syncwarp();
        if (lane == 0) {
          lh[h] = (mh[h] == -INFINITY ? 0.0 : lh[h] * exp(double(mh[h]) - double(m))) + l;
          mh[h] = m;
        }
      }
    }
    // 2. level-1 scores of the visible entries.
    for (long long j0 = 0; j0 < cnt1; j0 += kTile) {
      const int nk = int(cnt1 - j0 < kTile ? cnt1 - j0 : kTile);
      score_tile(c1, G, pages, j0, nk, G.s1, g, qs, nq, P.tau, tile, ps);
      for (int j = tid; j < nk; j += kThreads) {
        float acc = 0.f;
        for (int h = 0; h < nq; ++h)
          acc += float(exp(double(ps[h * kTile + j]) - double(mh[h])) / lh[h]);
        scores[j0 + j] = isnan(acc) ? 0.f : acc;
      }
    }
  }
  __syncthreads();
  // 3. pooling (SPEC §9.5) and top-k.
  for (int b = tid; b < nb; b += kThreads) {
    taken[b] = 0;
    if (b < P.init_blocks || (b >= qb - P.local_blocks && b <= qb)) {
      bscore[b] = INFINITY;
      continue;
    }
    const long long lo = b * (long long)rr - 1 > 0 ? b * (long long)rr - 1 : 0;
    const long long hi = b * (long long)rr + rr < n1 ? b * (long long)rr + rr : n1;
    float m = -INFINITY;
    for (long long j = lo; j < hi; ++j) m = fmaxf(m, scores[j]);
    bscore[b] = m;
  }
  __syncthreads();
  const int K = P.total_topk < nb ? P.total_topk : nb;
  for (int k = 0; k < K; ++k) {
    // (value, index) of the best block not taken yet: higher value, then lower index.
    float bv = -INFINITY;
    int bi = -1;
    for (int b = tid; b < nb; b += kThreads)
      if (!taken[b] && (bi < 0 || bscore[b] > bv)) bv = bscore[b], bi = b;  // b ascends
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
    }
    if (lane == 0) best_v[warp] = bv, best_i[warp] = bi;
    __syncthreads();
    if (tid == 0) {
      float v = best_v[0];
      int i = best_i[0];
      for (int w = 1; w < kWarps; ++w)
        if (best_i[w] >= 0 && (i < 0 || best_v[w] > v || (best_v[w] == v && best_i[w] < i)))
          v = best_v[w], i = best_i[w];
      taken[i] = 1;
    }
    __syncthreads();
  }
  // Taken blocks up to the query's, ascending (warp 0, 32 blocks per ballot).
  if (warp == 0) {
    int32_t* out = sel + (r * G.kvh + g) * int64_t(P.total_topk);
    int cnt = 0;
    for (int b0 = 0; b0 < nb; b0 += 32) {
      const int b = b0 + lane;
      const bool take = b < nb && b <= qb && taken[b];
      const unsigned m = __ballot_sync(0xffffffffu, take);
      if (take) out[cnt + __popc(m & ((1u << lane) - 1))] = b;
      cnt += __popc(m);
    }
    if (lane == 0) sel_cnt[r * G.kvh + g] = cnt;
  }
}

Layout layout(int G, int d, int nb_stride, int r) { return {G, d, nb_stride * r, nb_stride}; }

}  // namespace

size_t f32_select_smem_bytes(int G, int d, int nb_stride, int r) {
  return layout(G, d, nb_stride, r).words() * 4;
}

void launch_f32_select(const float* q, const StepRows& s, const float* c1, const float* c2,
                       const SelectParams& p, int max_smem, int32_t* sel, int32_t* sel_cnt,
                       cudaStream_t st) {
  if (s.T == 0) return;
  const int G = p.nh / p.g.kvh, r = p.g.bs / p.g.s1;
  const size_t smem = f32_select_smem_bytes(G, p.g.d, p.nb_stride, r);
  static SmemOptIn optin;  // per device
  if (smem > 48 * 1024) optin.raise(f32_select_kernel, size_t(max_smem));
  launch_pdl(f32_select_kernel, dim3(unsigned(s.T), unsigned(p.g.kvh)), kThreads, smem, st, q, s,
             c1, c2, p, p.nb_stride * r, sel, sel_cnt);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sala::cuda
