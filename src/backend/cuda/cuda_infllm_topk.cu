// InfLLM-v2 block selection, step 3 (SPEC §9.5; CPU twin: backend/cpu/infllm_rules.h) and the
// entry point of the whole stage: launch_infllm_select runs the level-2 / level-1 scoring
// kernels (cuda_infllm_select.cu), then select_topk_kernel per (row, KV head): forced blocks
// (+inf), the SPEC §9.5 pool maximum completed with the entry tiles' edges, top-k by
// (score desc, index asc) as a 16-bit radix select over the bf16 scores, blocks after the
// query's dropped, the rest written in ascending order to sel / sel_cnt.
#include <cub/block/block_scan.cuh>

#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_smem_optin.h"

namespace sala::cuda {
namespace {

constexpr int kW = kSparseTileRows;  // rows per tile
constexpr int kET = kEntryTile;      // entries per entry tile of the scoring kernels

// bf16 bits -> 16-bit key in float order (larger float, larger key).
__device__ __forceinline__ uint32_t order_key(float v) {
  const bf16 b = f2b(v);
  const uint32_t x = *reinterpret_cast<const uint16_t*>(&b);
  return (x & 0x8000u) ? (~x & 0xffffu) : (x | 0x8000u);
}

// Threads of a top-k block: 128 for steps of prompt rows (one block per row, many rows);
// 512 for steps with decode rows, where a handful of blocks scan every block of a long
// context (2048 at 128K) and the kernel's latency is the step's.
constexpr int kTopkThreads = 128, kTopkThreadsDecode = 512;

// The bin (of 256) holding the need-th largest key: returns it, and in *above the number of
// keys in higher bins. Warp 0 scans; lane i owns bins 255 − 8i .. 248 − 8i.
__device__ __forceinline__ void find_bin(const int* hist, int need, int* out_bin, int* out_above) {
  const int lane = threadIdx.x % 32;
  int c = 0;
  for (int k = 0; k < 8; ++k) c += hist[255 - 8 * lane - k];
  int incl = c;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  const unsigned hit = __ballot_sync(0xffffffffu, incl >= need);
  if (lane == __ffs(hit) - 1) {
    int acc = incl - c;
    for (int k = 0; k < 8; ++k) {
      const int bin = 255 - 8 * lane - k;
      if (acc + hist[bin] >= need) {
        *out_bin = bin;
        *out_above = acc;
        break;
      }
      acc += hist[bin];
    }
  }
}

//                                    grid: (tiles · kW, kvh), block: NT
template <int NT>
__global__ void __launch_bounds__(NT) select_topk_kernel(
    StepRows R, const int2* __restrict__ tiles, int tile_begin, SelectParams P,
    const bf16* __restrict__ bscore, const float* __restrict__ edge, int32_t* __restrict__ sel,
    int32_t* __restrict__ sel_cnt) {
  pdl_begin();  // launch_pdl: before any read or write
  extern __shared__ uint16_t keys[];  // [nb_stride]
  __shared__ int hist[256];
  __shared__ int sh_bin, sh_above;
  using Scan = cub::BlockScan<int, NT>;
  __shared__ typename Scan::TempStorage scan_tmp;
  const int w = blockIdx.x % kW, g = blockIdx.y, tid = threadIdx.x;
  const int2 tile = tiles[tile_begin + blockIdx.x / kW];
  if (w >= tile.y) return;
  const int64_t row = tile.x + w;
  const DevSeq s = R.seqs[R.row_seq[row]];
  if (!s.sparse) return;
  const CacheGeom& G = P.g;
  const long long t = s.past_len + (row - s.token_begin), L = s.past_len + s.num_tokens;
  const int nb = int((L + G.bs - 1) / G.bs), qb = int(t / G.bs), r = G.bs / G.s1;
  const long long n1 = num_entries(L, G.k1, G.s1);
  const int K = min(P.total_topk, nb);
  int32_t* out = sel + (row * G.kvh + g) * P.total_topk;
  if (K == nb) {  // every block is selected; those after the query's are dropped
    for (int b = tid; b <= qb; b += NT) out[b] = b;
    if (tid == 0) sel_cnt[row * G.kvh + g] = qb + 1;
    return;
  }
  const int64_t lrow = int64_t(blockIdx.x / kW) * kW + w;
  const bf16* brow = bscore + (lrow * G.kvh + g) * P.nb_stride;
  const float* erow = edge + (lrow * G.kvh + g) * P.et_stride;
  for (int b = tid; b < nb; b += NT) {
    float v;
    if (b < P.init_blocks || (b >= qb - P.local_blocks && b <= qb)) {
      v = INFINITY;
    } else if (max(1LL * b * r - 1, 0LL) >= n1) {
      v = -INFINITY;  // no level-1 entry overlaps the block
    } else {
      v = 1LL * b * r < n1 ? b2f(brow[b]) : -INFINITY;
      if (b > 0 && (b * r) % kET == 0) v = fmaxf(v, erow[(b * r) / kET - 1]);
    }
    keys[b] = uint16_t(order_key(v));
  }
  for (int i = tid; i < 256; i += NT) hist[i] = 0;
  __syncthreads();
  for (int b = tid; b < nb; b += NT) atomicAdd(&hist[keys[b] >> 8], 1);
  __syncthreads();
  if (tid < 32) find_bin(hist, K, &sh_bin, &sh_above);
  __syncthreads();
  const int hi = sh_bin, above1 = sh_above;
  __syncthreads();
  for (int i = tid; i < 256; i += NT) hist[i] = 0;
  __syncthreads();
  for (int b = tid; b < nb; b += NT)
    if ((keys[b] >> 8) == hi) atomicAdd(&hist[keys[b] & 255], 1);
  __syncthreads();
  if (tid < 32) find_bin(hist, K - above1, &sh_bin, &sh_above);
  __syncthreads();
  const uint32_t thr = uint32_t(hi << 8 | sh_bin);
  const int ties_take = K - above1 - sh_above;  // keys equal to thr taken, lowest index first
  // Each thread a contiguous range of blocks, so ranks and output follow the block order.
  const int per = (nb + NT - 1) / NT;
  const int b0 = min(nb, tid * per), b1 = min(nb, b0 + per);
  int ties = 0;
  for (int b = b0; b < b1; ++b) ties += keys[b] == thr;
  int tie_rank;
  Scan(scan_tmp).ExclusiveSum(ties, tie_rank);
  __syncthreads();
  int n_out = 0;
  for (int b = b0, tr_ = tie_rank; b < b1; ++b) {
    const bool take = keys[b] > thr || (keys[b] == thr && tr_++ < ties_take);
    n_out += take && b <= qb;
  }
  int pos, total;
  Scan(scan_tmp).ExclusiveSum(n_out, pos, total);
  for (int b = b0, tr_ = tie_rank; b < b1; ++b) {
    const bool take = keys[b] > thr || (keys[b] == thr && tr_++ < ties_take);
    if (take && b <= qb) out[pos++] = b;
  }
  if (tid == 0) sel_cnt[row * G.kvh + g] = total;
}

template <int NT>
void launch_topk(const StepRows& s, const int2* tiles, int tile_begin, int n_tiles,
                 const SelectParams& p, const SelectWork& w, int32_t* sel, int32_t* sel_cnt,
                 cudaStream_t st) {
  const size_t smem = select_topk_smem_bytes(p.nb_stride);
  static SmemOptIn optin;  // per device; static shared memory counts too: ask for what is needed
  optin.raise(select_topk_kernel<NT>, smem);
  launch_pdl(select_topk_kernel<NT>, dim3(unsigned(n_tiles * kW), unsigned(p.g.kvh)), NT, smem, st,
             s, tiles, tile_begin, p, w.bscore, w.edge, sel, sel_cnt);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool infllm_head_dim_supported(int d) { return d == 16 || d == 32 || d == 64 || d == 128; }

size_t select_topk_smem_bytes(int nb_stride) { return size_t(nb_stride) * 2; }

void launch_infllm_select(int d, const bf16* q, const StepRows& s, const int2* tiles,
                          int tile_begin, int n_tiles, const void* c1, const void* c2,
                          const SelectParams& p, const SelectWork& w, int32_t* sel,
                          int32_t* sel_cnt, cudaStream_t st, int kf) {
  if (n_tiles <= 0 || !infllm_head_dim_supported(d)) return;
  launch_infllm_select_scores(d, q, s, tiles, tile_begin, n_tiles, c1, c2, p, w, st, kf);
  // lse_splits > 1: the step has decode rows (see SelectParams).
  if (p.lse_splits > 1)
    launch_topk<kTopkThreadsDecode>(s, tiles, tile_begin, n_tiles, p, w, sel, sel_cnt, st);
  else
    launch_topk<kTopkThreads>(s, tiles, tile_begin, n_tiles, p, w, sel, sel_cnt, st);
}

}  // namespace sala::cuda
