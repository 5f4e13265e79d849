// Sparse (minicpm4) layers on the GPU (SPEC §9, golden README §6): paged bf16 KV append,
// incremental two-level key compression (fp32 mean rounded to bf16), and the attention of
// dense rows (L < dense_len): one kernel over the key blocks 0..qb of each (row, kv head),
// flash-style online softmax in fp32, split over key blocks when the step has few rows
// (decode). Long dense prefill calls run on the tensor cores (cuda_flash.cu); InfLLM-v2
// rows (selection and stage 2) in cuda_infllm_select.cu / cuda_infllm_attn.cu.
#include <cmath>

#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_mma.cuh"

namespace sala::cuda {

namespace {

// 1. k, v rows into the paged cache.                         grid: T, block: 128
__global__ void append_kv_kernel(const bf16* __restrict__ k, const bf16* __restrict__ v,
                                 const int32_t* __restrict__ row_seq, const DevSeq* __restrict__ seqs,
                                 const int32_t* __restrict__ page_table, CacheGeom g, bf16* kc,
                                 bf16* vc) {
  pdl_wait();  // launch_pdl: before any read or write
  pdl_trigger();
  const int64_t r = blockIdx.x;
  const DevSeq s = seqs[row_seq[r]];
  const int64_t p = s.past_len + (r - s.token_begin);
  const int64_t dst = token_off(g, page_table + s.page_begin, p);
  for (int64_t e = threadIdx.x; e < g.row; e += blockDim.x) {
    kc[dst + e] = k[r * g.row + e];
    vc[dst + e] = v[r * g.row + e];
  }
}

// 2. Compressed entries completed by the new tokens: entry j of a level (window w, stride
// st) is emitted by the token at p = j*st + w - 1. fp32 sum in token order, / w, bf16.
//                                                            grid: (T, 2), block: 128
__global__ void compress_kernel(const int32_t* __restrict__ row_seq, const DevSeq* __restrict__ seqs,
                                const int32_t* __restrict__ page_table, CacheGeom g,
                                const bf16* __restrict__ kc, bf16* c1, bf16* c2) {
  pdl_wait();  // launch_pdl: before any read or write
  pdl_trigger();
  const int64_t r = blockIdx.x;
  const DevSeq s = seqs[row_seq[r]];
  const int64_t p = s.past_len + (r - s.token_begin);
  const int w = blockIdx.y == 0 ? g.k1 : g.k2, st = blockIdx.y == 0 ? g.s1 : g.s2;
  if (p + 1 < w || (p + 1 - w) % st != 0) return;
  const int64_t j = (p + 1 - w) / st;
  const int32_t* pages = page_table + s.page_begin;
  bf16* dst = (blockIdx.y == 0 ? c1 : c2) + entry_off(g, pages, j, st);
  for (int64_t e = threadIdx.x; e < g.row; e += blockDim.x) {
    float acc = 0.f;
    for (int64_t x = j * st; x < j * st + w; ++x) acc += b2f(kc[token_off(g, pages, x) + e]);
    dst[e] = f2b(acc / float(w));
  }
}

constexpr int kKeyTile = 64;

// 3. Attention of the G query heads of one kv head for one dense row over its key blocks
//    0..qb, keys p <= t. Split z of gridDim.z takes a contiguous part of the blocks (rows
//    of one-token calls only); with one split it writes bf16 output directly, else fp32
//    partials (acc, m, l) per sequence for combine_kernel.
//    grid: (T, kvh, splits), block: 256
__global__ void __launch_bounds__(256) attention_kernel(
    const bf16* __restrict__ q, const int32_t* __restrict__ row_seq, const DevSeq* __restrict__ seqs,
    const int32_t* __restrict__ page_table, const bf16* __restrict__ kc, const bf16* __restrict__ vc,
    AttnParams P, bf16* __restrict__ out, float* __restrict__ part, float* __restrict__ ml) {
  pdl_wait();  // launch_pdl: before any read or write
  pdl_trigger();
  const int64_t r = blockIdx.x;
  const int g = blockIdx.y;
  const int si = row_seq[r];
  const DevSeq s = seqs[si];
  if (s.sparse || s.num_tokens >= P.flash_min) return;  // sparse_attn / flash_prefill rows
  // Rows of one-token calls (decode) split over grid.z, all others not: a row's numbers
  // depend only on its own call.
  const int split = blockIdx.z, nsplit = s.num_tokens == 1 ? int(gridDim.z) : 1;
  if (split >= nsplit) return;
  const CacheGeom& G = P.g;
  const int d = G.d, GH = P.G;
  const int32_t* pages = page_table + s.page_begin;
  const long long t = s.past_len + (r - s.token_begin);
  const int qb = int(t / G.bs);
  const int n_list = qb + 1;
  const int per = (n_list + nsplit - 1) / nsplit;
  const int i0 = split * per, i1 = min(n_list, i0 + per);

  extern __shared__ float sm[];
  const int DP = d + 1;
  float* qs = sm;                       // [GH][d]
  float* ks = qs + GH * d;              // [64][d+1]
  float* vs = ks + kKeyTile * DP;       // [64][d]
  float* ps = vs + kKeyTile * d;        // [GH][64]
  float* acc = ps + GH * kKeyTile;      // [GH][d]
  float* mrow = acc + GH * d;           // [GH]
  float* lrow = mrow + GH;              // [GH]
  float* corr = lrow + GH;              // [GH]
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid % 32, warp = tid / 32, nwarps = nt / 32;

  for (int e = tid; e < GH * d; e += nt) {
    qs[e] = b2f(q[r * int64_t(P.nh) * d + int64_t(g) * GH * d + e]);
    acc[e] = 0.f;
  }
  for (int h = tid; h < GH; h += nt) mrow[h] = -INFINITY, lrow[h] = 0.f;

  for (int i = i0; i < i1; ++i) {
    const long long kb0 = 1LL * i * G.bs;
    const long long kend = min(kb0 + G.bs, t + 1);
    for (long long p0 = kb0; p0 < kend; p0 += kKeyTile) {
      const int nk = int(kend - p0 < kKeyTile ? kend - p0 : kKeyTile);
      __syncthreads();  // previous tile fully consumed
      for (int e = tid; e < nk * d; e += nt) {
        const int j = e / d, x = e % d;
        const int64_t off = token_off(G, pages, p0 + j) + int64_t(g) * d + x;
        ks[j * DP + x] = b2f(kc[off]);
        vs[j * d + x] = b2f(vc[off]);
      }
      __syncthreads();
      for (int e = tid; e < GH * nk; e += nt) {
        const int h = e / nk, j = e % nk;
        const float* qh = qs + h * d;
        const float* kj = ks + j * DP;
        float dot = 0.f;
        for (int x = 0; x < d; ++x) dot += qh[x] * kj[x];
        ps[h * kKeyTile + j] = P.tau * dot;
      }
      __syncthreads();
      for (int h = warp; h < GH; h += nwarps) {
        float m = -INFINITY;
        for (int j = lane; j < nk; j += 32) m = fmaxf(m, ps[h * kKeyTile + j]);
        m = warp_max(m);
        const float m_new = fmaxf(mrow[h], m);
        float sum = 0.f;
        for (int j = lane; j < nk; j += 32) {
          const float pj = expf(ps[h * kKeyTile + j] - m_new);
          ps[h * kKeyTile + j] = pj;
          sum += pj;
        }
        sum = warp_sum(sum);
        if (lane == 0) {
          const float c = mrow[h] == -INFINITY ? 0.f : expf(mrow[h] - m_new);
          corr[h] = c;
          lrow[h] = lrow[h] * c + sum;
          mrow[h] = m_new;
        }
      }
      __syncthreads();
      for (int e = tid; e < GH * d; e += nt) {
        const int h = e / d, x = e % d;
        float a = acc[e] * corr[h];
        const float* ph = ps + h * kKeyTile;
        for (int j = 0; j < nk; ++j) a += ph[j] * vs[j * d + x];
        acc[e] = a;
      }
    }
  }
  __syncthreads();
  if (nsplit == 1) {
    for (int e = tid; e < GH * d; e += nt) {
      const int h = e / d;
      out[r * int64_t(P.nh) * d + int64_t(g) * GH * d + e] = f2b(acc[e] / lrow[h]);
    }
  } else {
    for (int e = tid; e < GH * d; e += nt) {
      const int h = e / d, x = e % d;
      const int64_t item = (int64_t(si) * P.nh + int64_t(g) * GH + h) * nsplit + split;
      part[item * d + x] = acc[e];
    }
    for (int h = tid; h < GH; h += nt) {
      const int64_t item = (int64_t(si) * P.nh + int64_t(g) * GH + h) * nsplit + split;
      ml[2 * item] = mrow[h];
      ml[2 * item + 1] = lrow[h];
    }
  }
}

// Merge of the split partials of one-token calls (indexed by sequence).
//                                                            grid: (S, nh), block: d
__global__ void combine_kernel(const DevSeq* __restrict__ seqs, const float* __restrict__ part,
                               const float* __restrict__ ml, int nsplit, int nh, int d,
                               bf16* __restrict__ out) {
  pdl_wait();  // launch_pdl: before any read or write
  pdl_trigger();
  const DevSeq s = seqs[blockIdx.x];
  if (s.num_tokens != 1) return;
  const int64_t r = s.token_begin;
  const int h = blockIdx.y;
  const int64_t item0 = (int64_t(blockIdx.x) * nh + h) * nsplit;
  float M = -INFINITY;
  for (int z = 0; z < nsplit; ++z) M = fmaxf(M, ml[2 * (item0 + z)]);
  for (int x = threadIdx.x; x < d; x += blockDim.x) {
    float l = 0.f, o = 0.f;
    for (int z = 0; z < nsplit; ++z) {
      const float m = ml[2 * (item0 + z)];
      if (m == -INFINITY) continue;
      const float c = expf(m - M);
      l += ml[2 * (item0 + z) + 1] * c;
      o += part[(item0 + z) * d + x] * c;
    }
    out[(r * nh + h) * d + x] = f2b(o / l);
  }
}

}  // namespace

void launch_append_kv(const bf16* k, const bf16* v, const StepRows& s, const CacheGeom& g, bf16* kc,
                      bf16* vc, cudaStream_t st) {
  if (s.T == 0) return;
  launch_pdl(append_kv_kernel, unsigned(s.T), 128, 0, st, k, v, s.row_seq, s.seqs, s.page_table, g,
             kc, vc);
  CUDA_CHECK_LAUNCH();
}

void launch_compress(const StepRows& s, const CacheGeom& g, const bf16* kc, bf16* c1, bf16* c2,
                     cudaStream_t st) {
  if (s.T == 0) return;
  launch_pdl(compress_kernel, dim3(unsigned(s.T), 2), 128, 0, st, s.row_seq, s.seqs, s.page_table,
             g, kc, c1, c2);
  CUDA_CHECK_LAUNCH();
}

size_t attention_smem_bytes(int G, int d) {
  return (size_t(G) * d * 2 + size_t(kKeyTile) * (d + 1) + size_t(kKeyTile) * d +
          size_t(G) * kKeyTile + 3 * size_t(G)) * 4;
}

void launch_attention(const bf16* q, const StepRows& s, const bf16* kc, const bf16* vc,
                      const AttnParams& p, int splits, bf16* out, float* part, float* ml,
                      int max_smem, cudaStream_t st) {
  if (s.T == 0) return;
  const size_t smem = attention_smem_bytes(p.G, p.g.d);
  static size_t smem_set = 48 * 1024;
  if (smem > smem_set) {
    CUDA_CHECK(cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
    smem_set = size_t(max_smem);
  }
  launch_pdl(attention_kernel, dim3(unsigned(s.T), unsigned(p.g.kvh), unsigned(splits)), 256, smem,
             st, q, s.row_seq, s.seqs, s.page_table, kc, vc, p, out, part, ml);
  CUDA_CHECK_LAUNCH();
}

void launch_combine(const DevSeq* seqs, int S, const float* part, const float* ml, int splits,
                    int nh, int d, bf16* out, cudaStream_t st) {
  if (S == 0 || splits <= 1) return;
  launch_pdl(combine_kernel, dim3(unsigned(S), unsigned(nh)), d < 256 ? d : 256, 0, st, seqs, part,
             ml, splits, nh, d, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sala::cuda
