// Sampling on the device (Backend::sample_rows; the host twin is HostSampler, backend/sampling.h):
// one 1024-thread block per logit row, so a sampled decode step moves R ids to the host
// instead of R × 73,448 floats.
//
// Per row: raw logits → scratch row with the request's edits and penalties (the host's float
// operations, no FMA contraction) → max and argmax (greedy rows end here) → weights
// w = expf((l − max) / T) as fixed-point integers W = floor(w · 2^46), so every sum is exact
// and independent of the order of the threads (seeded rows give the same token on every run
// and in any batch) → top-k, top-p and the draw as *selections in descending-logit order*
// (ties to the lower id, the host's order): the element at which the running count / mass of
// the candidates first exceeds a target (the draw in id order, as the host, when neither
// top-k nor top-p is set: one summing pass and one warp's scan).
//
// A selection is bucketed (below): the weights are computed once into the scratch row, one
// pass buckets the candidates by logit (2,048 buckets in descending-logit order, counts and
// masses), a block scan finds the target's bucket, one pass collects that bucket's few
// candidates and a shared-memory sort orders them. Top-p's pick truncates the buckets, so the
// draw usually reuses them and the sorted list: a top-p row costs ~5 passes over its 73,448
// logits. A bucket of more than 2,048 candidates (long runs of equal logits) takes the radix
// select instead (cuda_sample_row.cuh: 4 passes of 8-bit histograms over an order-preserving
// key, then the j-th tied id), which picks the same element. Session 11's kernel ran the
// radix select for every selection: ~15 passes, ~600 us per row on an H200 whatever the batch.
//
// Differences from the host (hence a statistical test, tests/ops/test_cuda_sample.cpp): CUDA's
// expf is within 2 ulp of glibc's; weights below 2^-46 of the maximum's are 0 (never drawn);
// sums are exact integers where the host sums floats in double. The same u picks the same
// token except where these move a boundary. NaN logits are never drawn (the host falls back
// to the argmax).
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_sample.h"
#include "backend/cuda/cuda_sample_row.cuh"

namespace sala::cuda {
namespace {

using namespace sample_detail;

// ---- bucketed selection ----
// Candidates fall into kBuckets buckets by b(l) = min(kBuckets - 1, int((mx - l) · inv_t ·
// bscale)), non-increasing in l (each rounded operation is monotone), so bucket 0, 1, ... is
// descending-key order and equal logits share a bucket; bscale spreads the row's candidate
// logits [lo, mx] over all buckets. One pass fills the buckets' counts and fixed-point masses;
// a block scan finds the bucket holding the target rank / mass; one pass collects that bucket's
// candidates (at most kListCap) and a bitonic sort orders them (key descending, id ascending):
// the host's order, so the pick is exactly radix_select's. A narrowing pick (top-k, top-p)
// truncates the buckets to the new prefix, so later selections and totals need no new pass.
constexpr int kBuckets = 2048;
constexpr int kListCap = 2048;
constexpr int kPerThread = kBuckets / kThreads;
static_assert(kPerThread * kThreads == kBuckets, "each thread owns kPerThread buckets");

struct BucketSmem {
  ull mass[kBuckets];
  uint32_t count[kBuckets];
  ull list[kListCap];  // (~key << 32) | id of the collected bucket, sorted ascending
  ull wsum[kWarps];
  int32_t list_bucket, list_n;  // list holds list_n sorted candidates of list_bucket (-1: none)
  int32_t n, bucket;
  ull rem, scan_total;
  int32_t pick;
};

__device__ __forceinline__ int bucket_of(const RowCtx& c, float l) {
  const float t = __fmul_rn(__fmul_rn(__fsub_rn(c.mx, l), c.inv_t), c.bscale);
  return t < float(kBuckets - 1) ? int(t) : kBuckets - 1;
}

// Counts and masses of the candidates per bucket (every thread calls it).
__device__ void fill_buckets(const RowCtx& c, BucketSmem& bs) {
  for (int b = threadIdx.x; b < kBuckets; b += kThreads) bs.mass[b] = 0, bs.count[b] = 0;
  if (threadIdx.x == 0) bs.list_bucket = -1;
  __syncthreads();
  for (int32_t i = threadIdx.x; i < c.V; i += kThreads) {
    uint32_t key;
    ull W;
    if (elem(c, i, key, W)) {
      const int b = bucket_of(c, c.lp[i]);
      atomicAdd(&bs.mass[b], W);
      atomicAdd(&bs.count[b], 1u);
    }
  }
  __syncthreads();
}

// Inclusive block scan of one value per thread (thread order); the block total in *total.
__device__ ull block_scan(ull v, BucketSmem& bs, ull* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  ull incl = v;
  for (int off = 1; off < 32; off <<= 1) {
    const ull o = __shfl_up_sync(kFull, incl, off);
    if (lane >= off) incl += o;
  }
  if (lane == 31) bs.wsum[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    ull w = bs.wsum[lane], wi = w;
    for (int off = 1; off < 32; off <<= 1) {
      const ull o = __shfl_up_sync(kFull, wi, off);
      if (lane >= off) wi += o;
    }
    bs.wsum[lane] = wi - w;  // exclusive prefix of the warps
    if (lane == 31) bs.scan_total = wi;
  }
  __syncthreads();
  incl += bs.wsum[warp];
  *total = bs.scan_total;
  __syncthreads();
  return incl;
}

struct Totals {
  ull mass, count;
};
__device__ Totals bucket_totals(BucketSmem& bs) {
  ull m = 0, n = 0;
  for (int q = 0; q < kPerThread; ++q) {
    m += bs.mass[threadIdx.x * kPerThread + q];
    n += bs.count[threadIdx.x * kPerThread + q];
  }
  Totals t;
  block_scan(m, bs, &t.mass);
  block_scan(n, bs, &t.count);
  return t;
}

// The bucket in which the running count / mass first exceeds x (clamped to the total - 1, the
// draw's rounding guard) and the remainder inside it: bs.bucket, bs.rem.
__device__ void find_bucket(BucketSmem& bs, bool by_mass, ull x) {
  if (threadIdx.x == 0) bs.bucket = 0, bs.rem = 0;  // (no candidate: cannot happen)
  ull own[kPerThread], v = 0;
  for (int q = 0; q < kPerThread; ++q) {
    const int b = threadIdx.x * kPerThread + q;
    own[q] = by_mass ? bs.mass[b] : ull(bs.count[b]);
    v += own[q];
  }
  ull total;
  const ull incl = block_scan(v, bs, &total);
  if (total > 0 && x >= total) x = total - 1;
  ull run = incl - v;
  if (run <= x && x < incl) {  // exactly one thread
    for (int q = 0; q < kPerThread; ++q) {
      if (x < run + own[q]) {
        bs.bucket = threadIdx.x * kPerThread + q;
        bs.rem = x - run;
        break;
      }
      run += own[q];
    }
  }
  __syncthreads();
}

// Bucket b's candidates into bs.list, sorted (key descending, id ascending); bs.list_n.
__device__ void collect_sorted(const RowCtx& c, BucketSmem& bs, int b) {
  if (threadIdx.x == 0) bs.n = 0;
  __syncthreads();
  for (int32_t i = threadIdx.x; i < c.V; i += kThreads) {
    uint32_t key;
    ull W;
    if (elem(c, i, key, W) && bucket_of(c, c.lp[i]) == b) {
      const int slot = atomicAdd(&bs.n, 1);
      if (slot < kListCap) bs.list[slot] = (ull(~key) << 32) | uint32_t(i);
    }
  }
  __syncthreads();
  const int n = min(bs.n, kListCap);  // == bs.count[b] <= kListCap (the caller checked)
  int P = 1;
  while (P < n) P <<= 1;
  for (int i = n + int(threadIdx.x); i < P; i += kThreads) bs.list[i] = ~0ull;
  __syncthreads();
  for (int k = 2; k <= P; k <<= 1)  // bitonic sort, ascending
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < P; i += kThreads) {
        const int l = i ^ j;
        if (l > i) {
          const ull a = bs.list[i], d = bs.list[l];
          if (((i & k) == 0) == (a > d)) bs.list[i] = d, bs.list[l] = a;
        }
      }
      __syncthreads();
    }
  if (threadIdx.x == 0) bs.list_bucket = b, bs.list_n = n;
  __syncthreads();
}

// The candidate at rank / mass x in descending-key order (radix_select's pick), from the
// buckets. narrow: it becomes the prefix's end (c.ck, c.cl) and the buckets are truncated to
// the new candidates.
__device__ int32_t select_bucketed(RowCtx& c, BucketSmem& bs, Smem& sm, bool by_mass, ull x,
                                   bool narrow) {
  find_bucket(bs, by_mass, x);
  const int b = bs.bucket;
  if (bs.count[b] > uint32_t(kListCap)) {  // a crowded bucket: the radix select's passes
    uint32_t key;
    int32_t id;
    radix_select(c, by_mass, x, sm, key, id);
    if (narrow) {
      c.ck = key;
      c.cl = id;
      fill_buckets(c, bs);
    }
    return id;
  }
  if (bs.list_bucket != b) collect_sorted(c, bs, b);
  const int lane = threadIdx.x & 31, n = bs.list_n;
  if (threadIdx.x < 32) {  // warp 0 walks the sorted list
    const ull rem = bs.rem;
    ull run = 0;
    int pick = n > 0 ? n - 1 : 0;  // the rounding guard's last candidate
    for (int base = 0; base < n; base += 32) {
      const int i = base + lane;
      ull v = 0;
      if (i < n) v = by_mass ? fixed_of(c.wp[uint32_t(bs.list[i])]) : 1ull;
      ull incl = v;
      for (int off = 1; off < 32; off <<= 1) {
        const ull o = __shfl_up_sync(kFull, incl, off);
        if (lane >= off) incl += o;
      }
      incl += run;
      const unsigned ball = __ballot_sync(kFull, i < n && incl > rem);
      if (ball) {
        pick = base + __ffs(ball) - 1;
        break;
      }
      run = __shfl_sync(kFull, incl, 31);
    }
    if (lane == 0) bs.pick = pick;
  }
  __syncthreads();
  const int pick = bs.pick;
  const ull sel = bs.list[pick];
  const int32_t id = int32_t(uint32_t(sel));
  if (narrow) {
    c.ck = ~uint32_t(sel >> 32);
    c.cl = id;
    if (threadIdx.x < 32) {  // the picked bucket keeps the list's first pick + 1 candidates
      ull m = 0;
      for (int i = lane; i <= pick; i += 32) m += fixed_of(c.wp[uint32_t(bs.list[i])]);
      m = warp_sum(m);
      if (lane == 0) {
        bs.mass[b] = m;
        bs.count[b] = uint32_t(pick + 1);
        bs.list_n = pick + 1;
      }
    }
    for (int q = b + 1 + int(threadIdx.x); q < kBuckets; q += kThreads) bs.mass[q] = 0, bs.count[q] = 0;
    __syncthreads();
  }
  return id;
}

// Grid: one block per sampled row. logits [*, V] fp32 (read only); scratch [gridDim.x, 2, V]:
// the row's edited logits, then their weights.
__global__ void __launch_bounds__(kThreads)
    sample_rows_kernel(const float* __restrict__ logits, int32_t V, const int32_t* __restrict__ rows,
                       const RowSampling* __restrict__ params, const LogitEdit* __restrict__ edits,
                       int32_t* __restrict__ pen_table, float* __restrict__ scratch,
                       int32_t* __restrict__ out) {
  __shared__ Smem sm;
  __shared__ BucketSmem bs;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const RowSampling rs = params[blockIdx.x];
  const float* raw = logits + int64_t(rows[blockIdx.x]) * V;
  float* lp = scratch + int64_t(blockIdx.x) * 2 * V;
  float* wp = lp + V;
  int32_t* pen = rs.penalty_slot >= 0 ? pen_table + int64_t(rs.penalty_slot) * V : nullptr;

  // 1. Edits (bias, then the min_tokens mask), then penalties: the host's float operations.
  for (int32_t i = threadIdx.x; i < V; i += kThreads) lp[i] = raw[i];
  if (rs.edit_count > 0) {
    __syncthreads();
    for (int32_t e = threadIdx.x; e < rs.edit_count; e += kThreads) {
      const LogitEdit ed = edits[rs.edit_begin + e];
      if (!ed.first) continue;  // one thread per id walks the id's chain in order
      float l = lp[ed.id];
      bool mask = false;
      for (int32_t k = rs.edit_begin + e; k >= 0; k = edits[k].next) {
        if (edits[k].mask) mask = true;
        else l = __fadd_rn(l, edits[k].bias);
      }
      lp[ed.id] = mask ? -INFINITY : l;
    }
    __syncthreads();
  }
  float mx = -INFINITY;
  Best b{-FLT_MAX, INT32_MAX};
  for (int32_t i = threadIdx.x; i < V; i += kThreads) {
    float l = lp[i];
    if (pen) {
      const int32_t e = pen[i];
      if (e != 0) {
        const int32_t cnt = e & kPenaltyCountMask;
        if (rs.repetition_penalty != 1.0f)
          l = l > 0 ? __fdiv_rn(l, rs.repetition_penalty) : __fmul_rn(l, rs.repetition_penalty);
        if (cnt > 0)
          l = __fsub_rn(l, __fadd_rn(__fmul_rn(rs.frequency_penalty, float(cnt)), rs.presence_penalty));
        lp[i] = l;
      }
    }
    mx = fmaxf(mx, l);
    b = better(b, Best{l, i});
  }
  for (int off = 16; off > 0; off >>= 1) {
    mx = fmaxf(mx, __shfl_down_sync(kFull, mx, off));
    b = better(b, Best{__shfl_down_sync(kFull, b.v, off), __shfl_down_sync(kFull, b.i, off)});
  }
  if (lane == 0) {
    sm.redf[warp] = mx;
    sm.redi[warp] = b.i;
    sm.redv[warp] = __float_as_uint(b.v);
  }
  __syncthreads();
  if (warp == 0) {
    mx = sm.redf[lane];
    b = Best{__uint_as_float(sm.redv[lane]), sm.redi[lane]};
    for (int off = 16; off > 0; off >>= 1) {
      mx = fmaxf(mx, __shfl_down_sync(kFull, mx, off));
      b = better(b, Best{__shfl_down_sync(kFull, b.v, off), __shfl_down_sync(kFull, b.i, off)});
    }
    if (lane == 0) {
      sm.redf[0] = mx;
      sm.found_id = b.i == INT32_MAX ? 0 : b.i;  // all -inf: id 0, as the host's argmax
    }
  }
  __syncthreads();
  mx = sm.redf[0];
  const int32_t amax = sm.found_id;
  __syncthreads();

  int32_t tok = amax;
  const bool greedy = rs.temperature <= 0.0f || rs.top_k == 1;
  if (!greedy && isfinite(mx)) {  // else the host's argmax fallback
    RowCtx c{lp, wp, V, mx, __fdiv_rn(1.0f, rs.temperature), rs.min_p, false, 0u, INT32_MAX, 0.f};
    // 2. Every weight once (wp), and the lowest candidate logit: the buckets' spread.
    float lo = mx;
    for (int32_t i = threadIdx.x; i < V; i += kThreads) {
      const float l = lp[i], w = weight_of(l, c);
      wp[i] = w;
      if (fixed_of(w) > 0) lo = fminf(lo, l);
    }
    for (int off = 16; off > 0; off >>= 1) lo = fminf(lo, __shfl_down_sync(kFull, lo, off));
    if (lane == 0) sm.redf[warp] = lo;
    __syncthreads();  // also: wp is complete
    if (warp == 0) {
      lo = sm.redf[lane];
      for (int off = 16; off > 0; off >>= 1) lo = fminf(lo, __shfl_down_sync(kFull, lo, off));
      if (lane == 0) sm.redf[0] = lo;
    }
    __syncthreads();
    const float range = __fmul_rn(__fsub_rn(mx, sm.redf[0]), c.inv_t);
    c.bscale = range > 0.0f ? __fdiv_rn(float(kBuckets), range) : 0.0f;
    // 3. Top-k, then top-p over its candidates, then min-p, then the draw: the host's order.
    const bool use_k = rs.top_k > 0 && rs.top_k < V;
    const bool use_p = rs.top_p > 0.0f && rs.top_p < 1.0f;
    fill_buckets(c, bs);
    Totals t = bucket_totals(bs);
    if (use_k && t.count > ull(rs.top_k)) {  // the k-th candidate ends the prefix
      select_bucketed(c, bs, sm, false, ull(rs.top_k - 1), true);
      t = bucket_totals(bs);
    }
    if (use_p) {  // the smallest prefix whose mass reaches top_p of the candidates'
      const double target = ceil(double(rs.top_p) * double(t.mass));
      ull x = target >= 1.0 ? ull(target) - 1 : 0;
      if (x >= t.mass) x = t.mass - 1;
      select_bucketed(c, bs, sm, true, x, true);
      t = bucket_totals(bs);
    }
    if (rs.min_p > 0.0f) {
      c.use_min_p = true;
      fill_buckets(c, bs);
      t = bucket_totals(bs);
    }
    ull u = ull(rs.u * double(t.mass));
    if (u >= t.mass) u = t.mass - 1;
    int32_t id;
    if (use_k || use_p) id = select_bucketed(c, bs, sm, true, u, false);  // descending logits
    else id = draw_in_id_order(c, u, sm);                                // the host's id order
    if (id >= 0) tok = id;
  }
  if (threadIdx.x == 0) {
    out[blockIdx.x] = tok;
    if (pen && (pen[tok] & kPenaltyCountMask) < kPenaltyCountMask) ++pen[tok];
  }
}

}  // namespace

void launch_sample_rows(const float* logits, int32_t vocab, const int32_t* rows, int64_t n,
                        const RowSampling* params, const LogitEdit* edits, int32_t* pen_table,
                        float* scratch, int32_t* out, cudaStream_t stream) {
  if (n == 0) return;
  sample_rows_kernel<<<unsigned(n), kThreads, 0, stream>>>(logits, vocab, rows, params, edits,
                                                           pen_table, scratch, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sala::cuda
