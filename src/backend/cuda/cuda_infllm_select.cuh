// What the InfLLM-v2 stage-1 scoring kernels share (cuda_infllm_select.cu: mma.sync, sm_80+;
// cuda_infllm_select_sm90.cu: wgmma, Hopper's prompt rows): a tile row's position and counts,
// and where a compressed entry lives in its paged cache.
#pragma once
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_kv_fp8.cuh"
#include "backend/cuda/cuda_mma.cuh"

namespace sala::cuda::stage1 {

// Per block: the tile's sequence and the position / counts of this warp's row.
struct TileRow {
  DevSeq s;
  const int32_t* pages;
  int64_t row;     // this warp's row (the tile's first row for idle warps)
  long long t, L;  // row position, sequence length after the step
  bool active, first;
};

__device__ __forceinline__ bool tile_row(const StepRows& R, int2 tile, int warp, TileRow& tr) {
  tr.s = R.seqs[R.row_seq[tile.x]];
  if (!tr.s.sparse) return false;
  tr.pages = R.page_table + tr.s.page_begin;
  tr.active = warp < tile.y;
  tr.row = tile.x + (tr.active ? warp : 0);
  tr.t = tr.s.past_len + (tr.row - tr.s.token_begin);
  tr.L = tr.s.past_len + tr.s.num_tokens;
  tr.first = tr.s.past_len == 0;
  return true;
}

// Where one level's compressed entries live (cache_layout::entry_offset without its 64-bit
// divisions): a page holds epp = page_size / s whole entries (SparseRunner checks
// page_size % s == 0), so entry j is slot j % epp of page j / epp. Entry counts fit 32 bits.
struct EntryPages {
  const int32_t* pages;
  int epp, sh;  // sh = log2 epp when epp is a power of two, else -1
  int64_t row;  // elements per entry (kvh · d)
  __device__ __forceinline__ EntryPages(const int32_t* p, const CacheGeom& G, int s)
      : pages(p), epp(G.page_size / s), sh(-1), row(G.row) {
    if ((epp & (epp - 1)) == 0)
      for (sh = 0; (1 << sh) < epp;) ++sh;
  }
  __device__ __forceinline__ int64_t off(int j) const {
    const int pg = sh >= 0 ? j >> sh : j / epp;
    return (int64_t(pages[pg]) * epp + (j - pg * epp)) * row;
  }
};

// Consecutive entries j, j + 1, ... of one level, walked: the element offset EntryPages::off
// gives, kept up to date with one page-table read per page instead of the division, read and
// 64-bit multiply per entry (ncu, session 26: the wgmma score kernel's loader spent ≈ 40
// instructions per 16-byte copy on them). `ok` / `more`: whether the first / next entry is
// one the caller loads (a page past the sequence's last is never read).
struct EntryRun {
  int64_t off = 0;
  int pg = 0, ip = 0;  // page index in the sequence, slot in the page
  __device__ __forceinline__ EntryRun(const EntryPages& P, int j, bool ok) {
    pg = P.sh >= 0 ? j >> P.sh : j / P.epp;
    ip = j - pg * P.epp;
    if (ok) off = (int64_t(P.pages[pg]) * P.epp + ip) * P.row;
  }
  __device__ __forceinline__ void next(const EntryPages& P, bool more) {
    if (++ip < P.epp) {
      off += P.row;
    } else {
      ip = 0;
      ++pg;
      if (more) off = int64_t(P.pages[pg]) * P.epp * P.row;
    }
  }
};

// Chunk c (8 elements) of the kN consecutive entries jj .. jj + kN - 1 of the entry tile that
// starts at entry j0, from one KV head's compressed cache `base`, to dst(j) (j: the entry's
// index in the tile; the caller's shared-memory layout): bf16 by cp.async (the caller
// commits, waits and fences), FP8 codes by plain loads, every load before the first
// conversion, converted to their exact bf16 values (unscaled: the K scale is in
// SelectParams::tau). Entries at or past jend are zeros.
template <int KF, int kN, class Dst>
__device__ __forceinline__ void copy_entry_run(const Dst& dst, const KvElem<KF>* base,
                                               const EntryPages& P, int j0, int jj, int c,
                                               int jend) {
  EntryRun run(P, j0 + jj, j0 + jj < jend);
  if constexpr (KF == kKvAct) {
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const bool ok = j0 + jj + i < jend;
      cp_async16(dst(jj + i), ok ? base + run.off + c * 8 : base, ok ? 16 : 0);
      run.next(P, j0 + jj + i + 1 < jend);
    }
  } else {
    uint2 cw[kN];
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      cw[i] = j0 + jj + i < jend ? *reinterpret_cast<const uint2*>(base + run.off + c * 8)
                                 : make_uint2(0u, 0u);
      run.next(P, j0 + jj + i + 1 < jend);
    }
#pragma unroll
    for (int i = 0; i < kN; ++i)
      *reinterpret_cast<uint4*>(dst(jj + i)) = kv_codes8_bf16<KF>(cw[i]);
  }
}

// Parts of the entry tiles of a score launch of `blocks` blocks (tiles × KV heads) with
// `per_sm` resident per SM: the count minimising rounds / parts (rounds = ceil(blocks · parts
// / resident blocks)), up to 8, a larger count only if 3 % better. The parts change no number.
inline int score_entry_parts(long long blocks, int per_sm) {
  static int sms = 0;
  if (sms == 0) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  }
  const int slots = std::max(1, sms * per_sm);
  int parts = 1;
  double best = double(ceil_div(blocks, slots));
  for (int z = 2; z <= 8; ++z) {
    const double r = double(ceil_div(blocks * z, slots)) / z;
    if (r < 0.97 * best) best = r, parts = z;
  }
  return parts;
}

}  // namespace sala::cuda::stage1
