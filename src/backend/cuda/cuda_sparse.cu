// Sparse (minicpm4) layers on the GPU (SPEC §9, golden README §6): paged bf16 (or FP8: codes
// of cuda_kv_fp8.cuh with the layer's K / V scales) KV append,
// incremental two-level key compression (fp32 mean rounded to bf16), and the attention of
// dense rows (L < dense_len): one kernel over the key blocks 0..qb of each (row, kv head),
// flash-style online softmax in fp32, split over key blocks when the step has few rows
// (decode). Long dense prefill calls run on the tensor cores (cuda_flash.cu); InfLLM-v2
// rows (selection and stage 2) in cuda_infllm_select.cu / cuda_infllm_attn.cu.
// fp32 mode: every kernel here is templated on the storage type T (bf16 or float: fp32 cache,
// compressed keys and outputs, nothing rounded); attention_kernel<float, true> is also stage 2
// of the InfLLM-v2 rows, over the blocks cuda_f32_select.cu selected (flash and the
// tensor-core InfLLM-v2 kernels are bf16 only).
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_kv_fp8.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_norm.cuh"
#include "backend/cuda/cuda_smem_optin.h"

namespace sala::cuda {

namespace {

// 1. k, v rows into the paged cache (FP8 caches: their codes, KvScale sc).
//                                                            grid: T, block: 128
template <typename T, int KF>
__global__ void append_kv_kernel(const T* __restrict__ k, const T* __restrict__ v,
                                 const int32_t* __restrict__ row_seq, const DevSeq* __restrict__ seqs,
                                 const int32_t* __restrict__ page_table, CacheGeom g, KvScale sc,
                                 KvElem<KF, T>* kc, KvElem<KF, T>* vc) {
  pdl_begin();  // launch_pdl: before any read or write
  const int64_t r = blockIdx.x;
  const DevSeq s = seqs[row_seq[r]];
  const int64_t p = s.past_len + (r - s.token_begin);
  const int64_t dst = token_off(g, page_table + s.page_begin, p);
  for (int64_t e = threadIdx.x; e < g.row; e += blockDim.x) {
    if constexpr (KF == kKvAct) {
      kc[dst + e] = k[r * g.row + e];
      vc[dst + e] = v[r * g.row + e];
    } else {
      kc[dst + e] = kv_encode<KF>(ld(k[r * g.row + e]), sc.k);
      vc[dst + e] = kv_encode<KF>(ld(v[r * g.row + e]), sc.v);
    }
  }
}

// 2. Compressed entries completed by the new tokens: entry j of a level (window w, stride
// st) is emitted by the token at p = j*st + w - 1. fp32 sum in token order of the cached
// keys (FP8: their values code · sc.k, as the CPU reads them back), / w, rounded to T, then
// (FP8) coded with the K scale.                              grid: (T, 2), block: 128
template <typename T, int KF>
__global__ void compress_kernel(const int32_t* __restrict__ row_seq, const DevSeq* __restrict__ seqs,
                                const int32_t* __restrict__ page_table, CacheGeom g, KvScale sc,
                                const KvElem<KF, T>* __restrict__ kc, KvElem<KF, T>* c1,
                                KvElem<KF, T>* c2) {
  pdl_begin();  // launch_pdl: before any read or write
  const int64_t r = blockIdx.x;
  const DevSeq s = seqs[row_seq[r]];
  const int64_t p = s.past_len + (r - s.token_begin);
  const int w = blockIdx.y == 0 ? g.k1 : g.k2, st = blockIdx.y == 0 ? g.s1 : g.s2;
  const int64_t j = cache_layout::entry_completed_at(p, w, st);
  if (j < 0) return;
  const int32_t* pages = page_table + s.page_begin;
  KvElem<KF, T>* dst = (blockIdx.y == 0 ? c1 : c2) + entry_off(g, pages, j, st);
  for (int64_t e = threadIdx.x; e < g.row; e += blockDim.x) {
    float acc = 0.f;
    for (int64_t x = j * st; x < j * st + w; ++x)
      acc += kv_value<KF>(kc[token_off(g, pages, x) + e], sc.k);
    if constexpr (KF == kKvAct)
      dst[e] = cvt<T>(acc / float(w));
    else
      dst[e] = kv_encode<KF>(rnd<T>(acc / float(w)), sc.k);
  }
}

// Tests: kv_encode / kv_code_f32 on n values.                grid-stride, block 256
template <int KF>
__global__ void kv_fp8_roundtrip_kernel(const float* __restrict__ x, int64_t n, float scale,
                                        uint8_t* __restrict__ codes, float* __restrict__ back) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint8_t c = kv_encode<KF>(x[i], scale);
    codes[i] = c;
    back[i] = kv_value<KF>(c, scale);
  }
}

// Tests: kv_codes8_bf16 on n8 groups of 8 codes -> out [8 n8] bf16 bits.  grid-stride, block 256
template <int KF>
__global__ void kv_codes8_kernel(const uint2* __restrict__ codes, int64_t n8,
                                 uint4* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = kv_codes8_bf16<KF>(codes[i]);
}

// One sequence's pages 0 .. n_pages of an FP8 cache as bf16 code values (kv_codes8_bf16,
// the exact values the stage-2 producers convert into their ring) in shadow pages base ..
// base + n_pages, and page_table[page_begin + i] -> base + i into shadow_pt. A page is
// page_bytes contiguous codes ([page_size, kvh, d]); thread i of block (x, page) converts 8
// codes of K and of V; block rows walk pages y, y + gridDim.y, ...
// grid: (ceil(page_bytes / 8 / 256), min(n_pages, 65535)), block 256
template <int KF>
__global__ void kv_pages_bf16_kernel(const int32_t* __restrict__ page_table, int page_begin,
                                     int n_pages, int base, int64_t page_bytes,
                                     const uint8_t* __restrict__ kc,
                                     const uint8_t* __restrict__ vc, uint16_t* __restrict__ ks,
                                     uint16_t* __restrict__ vs, int32_t* __restrict__ shadow_pt) {
  const int64_t e = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  for (int i = int(blockIdx.y); i < n_pages; i += int(gridDim.y)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) shadow_pt[page_begin + i] = base + i;
    if (e >= page_bytes) continue;
    const int64_t src = int64_t(page_table[page_begin + i]) * page_bytes + e;
    const int64_t dst = int64_t(base + i) * page_bytes + e;
    *reinterpret_cast<uint4*>(ks + dst) =
        kv_codes8_bf16<KF>(*reinterpret_cast<const uint2*>(kc + src));
    *reinterpret_cast<uint4*>(vs + dst) =
        kv_codes8_bf16<KF>(*reinterpret_cast<const uint2*>(vc + src));
  }
}

constexpr int kKeyTile = 64;

// 3. Attention of the G query heads of one kv head for one dense row over its key blocks
//    0..qb, keys p <= t. Split z of gridDim.z takes a contiguous part of the blocks (rows
//    of split calls only, DevSeq::split_row); with one split it writes T output directly,
//    else fp32 partials (acc, m, l) per split row for combine_kernel. kSel (fp32 mode's InfLLM-v2 stage
//    2): the sparse rows instead, over their selected blocks sel[r, g, 0 .. sel_cnt[r, g])
//    (ascending), keys p <= t of each. KF: FP8 caches, read as code · P.scale (the CPU's values).
//    grid: (T, kvh, splits), block: 256
template <typename T, bool kSel, int KF = kKvAct>
__global__ void __launch_bounds__(256) attention_kernel(
    const T* __restrict__ q, const int32_t* __restrict__ row_seq, const DevSeq* __restrict__ seqs,
    const int32_t* __restrict__ page_table, const KvElem<KF, T>* __restrict__ kc,
    const KvElem<KF, T>* __restrict__ vc,
    AttnParams P, const int32_t* __restrict__ sel, const int32_t* __restrict__ sel_cnt,
    T* __restrict__ out, float* __restrict__ part, float* __restrict__ ml) {
  pdl_begin();  // launch_pdl: before any read or write
  const int64_t r = blockIdx.x;
  const int g = blockIdx.y;
  const int si = row_seq[r];
  const DevSeq s = seqs[si];
  if constexpr (kSel) {
    if (!s.sparse) return;  // dense rows: attention_kernel<T, false>
  } else {
    if (s.sparse || s.num_tokens >= P.flash_min) return;  // sparse_attn / flash_prefill rows
  }
  // Rows of split calls (decode, verify; DevSeq::split_row) split over grid.z, all others
  // not: a row's numbers depend only on its own row.
  const int split = blockIdx.z, nsplit = s.split_row >= 0 ? int(gridDim.z) : 1;
  if (split >= nsplit) return;
  const CacheGeom& G = P.g;
  const int d = G.d, GH = P.G;
  const int32_t* pages = page_table + s.page_begin;
  const long long t = s.past_len + (r - s.token_begin);
  const int qb = int(t / G.bs);
  const int32_t* blocks = kSel ? sel + (r * G.kvh + g) * int64_t(P.total_topk) : nullptr;
  const int n_list = kSel ? sel_cnt[r * G.kvh + g] : qb + 1;
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
    qs[e] = ld(q[r * int64_t(P.nh) * d + int64_t(g) * GH * d + e]);
    acc[e] = 0.f;
  }
  for (int h = tid; h < GH; h += nt) mrow[h] = -INFINITY, lrow[h] = 0.f;

  for (int i = i0; i < i1; ++i) {
    const long long kb0 = 1LL * (kSel ? blocks[i] : i) * G.bs;
    const long long kend = min(kb0 + G.bs, t + 1);
    for (long long p0 = kb0; p0 < kend; p0 += kKeyTile) {
      const int nk = int(kend - p0 < kKeyTile ? kend - p0 : kKeyTile);
      __syncthreads();  // previous tile fully consumed
      for (int e = tid; e < nk * d; e += nt) {
        const int j = e / d, x = e % d;
        const int64_t off = token_off(G, pages, p0 + j) + int64_t(g) * d + x;
        ks[j * DP + x] = kv_value<KF>(kc[off], P.scale.k);
        vs[j * d + x] = kv_value<KF>(vc[off], P.scale.v);
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
      out[r * int64_t(P.nh) * d + int64_t(g) * GH * d + e] = cvt<T>(acc[e] / lrow[h]);
    }
  } else {
    const int64_t srow = s.split_row + (r - s.token_begin);  // the row's partials slot
    for (int e = tid; e < GH * d; e += nt) {
      const int h = e / d, x = e % d;
      const int64_t item = (srow * P.nh + int64_t(g) * GH + h) * nsplit + split;
      part[item * d + x] = acc[e];
    }
    for (int h = tid; h < GH; h += nt) {
      const int64_t item = (srow * P.nh + int64_t(g) * GH + h) * nsplit + split;
      ml[2 * item] = mrow[h];
      ml[2 * item + 1] = lrow[h];
    }
  }
}

// Row r's merge of its nsplit partials from item0 (items (row slot · nh + h) · nsplit + z).
template <typename T>
__device__ __forceinline__ void combine_row(int64_t r, int64_t item0, int h,
                                            const float* __restrict__ part,
                                            const float* __restrict__ ml, int nsplit, int nh,
                                            int d, const T* __restrict__ gate,
                                            T* __restrict__ out) {
  // The parts' (m, l) go through shared memory, one load per thread, and each part's factor
  // is computed once: the per-thread loops were chains of dependent global loads. Same
  // arithmetic and order as a per-thread loop over z.
  __shared__ float sm[kDecodeAttnSplits], sl[kDecodeAttnSplits], sc[kDecodeAttnSplits];
  for (int z = threadIdx.x; z < nsplit; z += blockDim.x) {
    sm[z] = ml[2 * (item0 + z)];
    sl[z] = ml[2 * (item0 + z) + 1];
  }
  __syncthreads();
  float M = -INFINITY;
  for (int z = 0; z < nsplit; ++z) M = fmaxf(M, sm[z]);
  for (int z = threadIdx.x; z < nsplit; z += blockDim.x)
    sc[z] = sm[z] == -INFINITY ? 0.f : expf(sm[z] - M);
  __syncthreads();
  for (int x = threadIdx.x; x < d; x += blockDim.x) {
    float l = 0.f, o = 0.f;
    for (int z = 0; z < nsplit; ++z) {
      if (sm[z] == -INFINITY) continue;
      l += sl[z] * sc[z];
      o += part[(item0 + z) * d + x] * sc[z];
    }
    const int64_t i = (r * nh + h) * d + x;
    // gate (sparse_attention_mul_sigmoid): mul_sigmoid's arithmetic on the rounded value
    out[i] = gate ? cvt<T>(MulSigmoid<T>{}(ld(gate[i]), rnd<T>(o / l))) : cvt<T>(o / l);
  }
}

// Merge of the split partials of the rows of split calls (DevSeq::split_row), row by row.
//                                                            grid: (S, nh), block: d
template <typename T>
__global__ void combine_kernel(const DevSeq* __restrict__ seqs, const float* __restrict__ part,
                               const float* __restrict__ ml, int nsplit, int nh, int d,
                               const T* __restrict__ gate, T* __restrict__ out) {
  pdl_begin();  // launch_pdl: before any read or write
  const DevSeq s = seqs[blockIdx.x];
  if (s.split_row < 0) return;
  for (int i = 0; i < s.num_tokens; ++i) {
    __syncthreads();  // the previous row's sm / sl / sc are read
    combine_row(s.token_begin + i, (int64_t(s.split_row + i) * nh + blockIdx.y) * nsplit,
                int(blockIdx.y), part, ml, nsplit, nh, d, gate, out);
  }
}

}  // namespace

template <typename T>
void launch_append_kv(const T* k, const T* v, const StepRows& s, const CacheGeom& g, T* kc, T* vc,
                      cudaStream_t st) {
  if (s.T == 0) return;
  launch_pdl(append_kv_kernel<T, kKvAct>, unsigned(s.T), 128, 0, st, k, v, s.row_seq, s.seqs,
             s.page_table, g, KvScale{}, kc, vc);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_compress(const StepRows& s, const CacheGeom& g, const T* kc, T* c1, T* c2,
                     cudaStream_t st) {
  if (s.T == 0) return;
  launch_pdl(compress_kernel<T, kKvAct>, dim3(unsigned(s.T), 2), 128, 0, st, s.row_seq, s.seqs,
             s.page_table, g, KvScale{}, kc, c1, c2);
  CUDA_CHECK_LAUNCH();
}

void launch_append_kv_fp8(int kf, const bf16* k, const bf16* v, const StepRows& s,
                          const CacheGeom& g, KvScale sc, uint8_t* kc, uint8_t* vc,
                          cudaStream_t st) {
  if (s.T == 0) return;
  const auto kern = kf == kKvE4m3 ? append_kv_kernel<bf16, kKvE4m3> : append_kv_kernel<bf16, kKvE5m2>;
  launch_pdl(kern, unsigned(s.T), 128, 0, st, k, v, s.row_seq, s.seqs, s.page_table, g, sc, kc,
             vc);
  CUDA_CHECK_LAUNCH();
}

void launch_compress_fp8(int kf, const StepRows& s, const CacheGeom& g, KvScale sc,
                         const uint8_t* kc, uint8_t* c1, uint8_t* c2, cudaStream_t st) {
  if (s.T == 0) return;
  const auto kern = kf == kKvE4m3 ? compress_kernel<bf16, kKvE4m3> : compress_kernel<bf16, kKvE5m2>;
  launch_pdl(kern, dim3(unsigned(s.T), 2), 128, 0, st, s.row_seq, s.seqs, s.page_table, g, sc, kc,
             c1, c2);
  CUDA_CHECK_LAUNCH();
}

void launch_kv_fp8_roundtrip(int kf, const float* x, int64_t n, float scale, uint8_t* codes,
                             float* back, cudaStream_t st) {
  if (n == 0) return;
  const unsigned blocks = unsigned(std::min<int64_t>((n + 255) / 256, 4096));
  if (kf == kKvE4m3)
    kv_fp8_roundtrip_kernel<kKvE4m3><<<blocks, 256, 0, st>>>(x, n, scale, codes, back);
  else
    kv_fp8_roundtrip_kernel<kKvE5m2><<<blocks, 256, 0, st>>>(x, n, scale, codes, back);
  CUDA_CHECK_LAUNCH();
}

void launch_kv_codes8_bf16(int kf, const uint8_t* codes, int64_t n8, uint16_t* out,
                           cudaStream_t st) {
  if (n8 == 0) return;
  const unsigned blocks = unsigned(std::min<int64_t>((n8 + 255) / 256, 4096));
  const auto* c = reinterpret_cast<const uint2*>(codes);
  auto* o = reinterpret_cast<uint4*>(out);
  if (kf == kKvE4m3)
    kv_codes8_kernel<kKvE4m3><<<blocks, 256, 0, st>>>(c, n8, o);
  else
    kv_codes8_kernel<kKvE5m2><<<blocks, 256, 0, st>>>(c, n8, o);
  CUDA_CHECK_LAUNCH();
}

void launch_kv_pages_bf16(int kf, const int32_t* page_table, int page_begin, int n_pages,
                          int base, const CacheGeom& g, const uint8_t* kc, const uint8_t* vc,
                          bf16* k_shadow, bf16* v_shadow, int32_t* shadow_pt, cudaStream_t st) {
  if (n_pages <= 0) return;
  const int64_t page_bytes = int64_t(g.page_size) * g.row;
  const dim3 grid(unsigned((page_bytes / 8 + 255) / 256), unsigned(std::min(n_pages, 65535)));
  auto* ks = reinterpret_cast<uint16_t*>(k_shadow);
  auto* vs = reinterpret_cast<uint16_t*>(v_shadow);
  if (kf == kKvE4m3)
    kv_pages_bf16_kernel<kKvE4m3><<<grid, 256, 0, st>>>(page_table, page_begin, n_pages, base,
                                                       page_bytes, kc, vc, ks, vs, shadow_pt);
  else
    kv_pages_bf16_kernel<kKvE5m2><<<grid, 256, 0, st>>>(page_table, page_begin, n_pages, base,
                                                       page_bytes, kc, vc, ks, vs, shadow_pt);
  CUDA_CHECK_LAUNCH();
}

size_t attention_smem_bytes(int G, int d) {
  return (size_t(G) * d * 2 + size_t(kKeyTile) * (d + 1) + size_t(kKeyTile) * d +
          size_t(G) * kKeyTile + 3 * size_t(G)) * 4;
}

template <typename T, bool kSel, int KF = kKvAct>
void attention_launch(const T* q, const StepRows& s, const KvElem<KF, T>* kc,
                      const KvElem<KF, T>* vc, const AttnParams& p, const int32_t* sel,
                      const int32_t* sel_cnt, int splits, T* out, float* part, float* ml,
                      int max_smem, cudaStream_t st) {
  if (s.T == 0) return;
  const size_t smem = attention_smem_bytes(p.G, p.g.d);
  static SmemOptIn optin;  // one per instantiation, per device
  if (smem > 48 * 1024) optin.raise(attention_kernel<T, kSel, KF>, size_t(max_smem));
  launch_pdl(attention_kernel<T, kSel, KF>, dim3(unsigned(s.T), unsigned(p.g.kvh), unsigned(splits)),
             256, smem, st, q, s.row_seq, s.seqs, s.page_table, kc, vc, p, sel, sel_cnt, out, part,
             ml);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_attention(const T* q, const StepRows& s, const T* kc, const T* vc, const AttnParams& p,
                      int splits, T* out, float* part, float* ml, int max_smem, cudaStream_t st) {
  attention_launch<T, false>(q, s, kc, vc, p, nullptr, nullptr, splits, out, part, ml, max_smem, st);
}

void launch_attention_fp8(int kf, const bf16* q, const StepRows& s, const uint8_t* kc,
                          const uint8_t* vc, const AttnParams& p, int splits, bf16* out,
                          float* part, float* ml, int max_smem, cudaStream_t st) {
  if (kf == kKvE4m3)
    attention_launch<bf16, false, kKvE4m3>(q, s, kc, vc, p, nullptr, nullptr, splits, out, part, ml,
                                           max_smem, st);
  else
    attention_launch<bf16, false, kKvE5m2>(q, s, kc, vc, p, nullptr, nullptr, splits, out, part, ml,
                                           max_smem, st);
}

void launch_attention_selected_f32(const float* q, const StepRows& s, const float* kc,
                                   const float* vc, const AttnParams& p, const int32_t* sel,
                                   const int32_t* sel_cnt, int splits, float* out, float* part,
                                   float* ml, int max_smem, cudaStream_t st) {
  attention_launch<float, true>(q, s, kc, vc, p, sel, sel_cnt, splits, out, part, ml, max_smem, st);
}

template <typename T>
void launch_combine(const DevSeq* seqs, int S, const float* part, const float* ml, int splits,
                    int nh, int d, const T* gate, T* out, cudaStream_t st) {
  if (S == 0 || splits <= 1) return;
  launch_pdl(combine_kernel<T>, dim3(unsigned(S), unsigned(nh)), d < 256 ? d : 256, 0, st, seqs, part,
             ml, splits, nh, d, gate, out);
  CUDA_CHECK_LAUNCH();
}

#define SALA_SPARSE_INSTANTIATE(T)                                                              \
  template void launch_append_kv<T>(const T*, const T*, const StepRows&, const CacheGeom&, T*,  \
                                    T*, cudaStream_t);                                           \
  template void launch_compress<T>(const StepRows&, const CacheGeom&, const T*, T*, T*,         \
                                   cudaStream_t);                                                \
  template void launch_attention<T>(const T*, const StepRows&, const T*, const T*,              \
                                    const AttnParams&, int, T*, float*, float*, int,             \
                                    cudaStream_t);                                               \
  template void launch_combine<T>(const DevSeq*, int, const float*, const float*, int, int, int, \
                                  const T*, T*, cudaStream_t);
SALA_SPARSE_INSTANTIATE(bf16)
SALA_SPARSE_INSTANTIATE(float)
#undef SALA_SPARSE_INSTANTIATE

}  // namespace sala::cuda
