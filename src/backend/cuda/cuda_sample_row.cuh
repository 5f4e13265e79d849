// The per-row building blocks of cuda_sample.cu's kernel (one block of kThreads threads per
// logit row): the row's candidate predicate over the scratch logits and their precomputed
// weights, block sums, and the exact radix select over order-preserving logit keys (4 passes
// of 8 bits, then the j-th tied id) that the bucketed selection falls back to when its target
// bucket holds more than kListCap candidates. Included by cuda_sample.cu only.
#pragma once
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <cstdint>

namespace sala::cuda::sample_detail {

using ull = unsigned long long;
constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr uint32_t kNoBin = 0xffffffffu;

struct Smem {
  ull hist[256];
  ull red[kWarps];
  uint32_t redv[kWarps];
  float redf[kWarps];
  int32_t redi[kWarps];
  ull bcast;
  uint32_t digit;
  ull rem;
  int32_t found_warp, found_rem, found_id;
};

// Larger float → larger key; -0 and +0 are one key (the host compares them equal).
__device__ __forceinline__ uint32_t order_key(float l) {
  if (l == 0.0f) l = 0.0f;
  const uint32_t u = __float_as_uint(l);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// The row's state: scratch logits lp [V] after edits and penalties, their weights wp [V]
// (weight_of, computed once per row), and which ids are candidates.
struct RowCtx {
  const float* lp;
  const float* wp;
  int32_t V;
  float mx, inv_t, min_p;
  bool use_min_p;
  // Top-k / top-p prefix: a candidate has key > ck, or key == ck and id <= cl.
  uint32_t ck;
  int32_t cl;
  float bscale;  // cuda_sample.cu's bucket of a logit: (mx - l) · inv_t · bscale
};

// The host's exp((l - mx) * inv_t).
__device__ __forceinline__ float weight_of(float l, const RowCtx& c) {
  return expf(__fmul_rn(__fsub_rn(l, c.mx), c.inv_t));
}
// Its fixed-point value: 0 for -inf logits and NaN.
__device__ __forceinline__ ull fixed_of(float w) {
  if (!(w > 0.0f)) return 0;
  return ull(double(w) * 70368744177664.0);  // 2^46: ≤ 2^46 per id, < 2^64 for V < 2^18
}
__device__ __forceinline__ ull fixed_weight(float l, const RowCtx& c) {
  return fixed_of(weight_of(l, c));
}

// Whether id i is a candidate; its key and fixed-point weight.
__device__ __forceinline__ bool elem(const RowCtx& c, int32_t i, uint32_t& key, ull& W) {
  const float l = c.lp[i];
  const float w = c.wp[i];
  W = fixed_of(w);
  key = order_key(l);
  if (W == 0) return false;
  if (c.use_min_p && w < c.min_p && !(l == c.mx)) return false;  // the host's min-p rule
  return key > c.ck || (key == c.ck && i <= c.cl);
}

__device__ __forceinline__ ull warp_sum(ull v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(kFull, v, off);
  return v;
}

// Sum over the block (every thread gets it).
__device__ ull block_sum(ull v, Smem& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) sm.red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = warp_sum(sm.red[lane]);
    if (lane == 0) sm.bcast = v;
  }
  __syncthreads();
  v = sm.bcast;
  __syncthreads();
  return v;
}

// hist[d] += v over the warp's lanes with in == true (d == kNoBin where !in); lanes with the
// same bin add once: __match_any_sync groups them, redux.sync sums each group (v < 2^47 in
// three 22-bit parts, so the 32-bit sums of up to 32 lanes are exact) and the group's first
// lane adds. Called by all 32 lanes.
__device__ __forceinline__ void hist_add(Smem& sm, uint32_t d, ull v) {
  const unsigned peers = __match_any_sync(kFull, d);
  if (d == kNoBin) return;  // a group of inactive lanes only
  const unsigned r0 = __reduce_add_sync(peers, unsigned(v & 0x3fffffu));
  const unsigned r1 = __reduce_add_sync(peers, unsigned((v >> 22) & 0x3fffffu));
  const unsigned r2 = __reduce_add_sync(peers, unsigned(v >> 44));
  if (int(threadIdx.x & 31) == __ffs(peers) - 1)
    atomicAdd(&sm.hist[d], ull(r0) + (ull(r1) << 22) + (ull(r2) << 44));
}

// The id of the j-th (0-based) candidate with key `key`, in id order (-1 if there is none).
// Warp w scans ids [w·seg, (w+1)·seg) in 32-id chunks.
__device__ int32_t nth_with_key(const RowCtx& c, uint32_t key, int32_t j, Smem& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int32_t seg = (c.V + kThreads - 1) / kThreads * 32;
  const int32_t lo = warp * seg, hi = min(c.V, lo + seg);
  auto flag = [&](int32_t i) {
    uint32_t k;
    ull W;
    return i < hi && elem(c, i, k, W) && k == key;
  };
  int32_t cnt = 0;
  for (int32_t b = lo; b < lo + seg; b += 32) cnt += __popc(__ballot_sync(kFull, flag(b + lane)));
  if (lane == 0) sm.redi[warp] = cnt;
  if (threadIdx.x == 0) sm.found_id = -1;
  __syncthreads();
  if (warp == 0) {
    const int32_t v = sm.redi[lane];
    int32_t incl = v;
    for (int off = 1; off < 32; off <<= 1) {
      const int32_t o = __shfl_up_sync(kFull, incl, off);
      if (lane >= off) incl += o;
    }
    const unsigned ball = __ballot_sync(kFull, incl > j);
    if (lane == 0) sm.found_warp = ball ? __ffs(ball) - 1 : -1;
    if (ball && lane == __ffs(ball) - 1) sm.found_rem = j - (incl - v);
  }
  __syncthreads();
  if (warp == sm.found_warp) {
    int32_t r = sm.found_rem;
    for (int32_t b = lo; b < lo + seg; b += 32) {
      unsigned m = __ballot_sync(kFull, flag(b + lane));
      const int32_t n = __popc(m);
      if (r < n) {  // uniform over the warp
        for (int32_t k = 0; k < r; ++k) m &= m - 1;
        if (lane == 0) sm.found_id = b + __ffs(m) - 1;
        break;
      }
      r -= n;
    }
  }
  __syncthreads();
  const int32_t id = sm.found_id;
  __syncthreads();
  return id;
}

// The candidate at which the running mass in id order first exceeds x (the host's draw when
// neither top-k nor top-p orders the candidates). Warp w sums ids [w·seg, (w+1)·seg); warp 0
// finds the warp; that warp walks its 32-id chunks with an inclusive scan.
__device__ int32_t draw_in_id_order(const RowCtx& c, ull x, Smem& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int32_t seg = (c.V + kThreads - 1) / kThreads * 32;
  const int32_t lo = warp * seg, hi = min(c.V, lo + seg);
  auto weight = [&](int32_t i) -> ull {
    uint32_t k;
    ull W;
    return i < hi && elem(c, i, k, W) ? W : 0ull;
  };
  auto scan = [&](ull v) {  // inclusive prefix sum over the warp's lanes
    for (int off = 1; off < 32; off <<= 1) {
      const ull o = __shfl_up_sync(kFull, v, off);
      if (lane >= off) v += o;
    }
    return v;
  };
  ull s = 0;
  for (int32_t b = lo; b < lo + seg; b += 32) s += weight(b + lane);
  s = warp_sum(s);
  if (lane == 0) sm.red[warp] = s;
  if (threadIdx.x == 0) sm.found_id = -1;
  __syncthreads();
  if (warp == 0) {
    const ull v = sm.red[lane];
    const ull incl = scan(v);
    const ull total = __shfl_sync(kFull, incl, 31);
    if (total > 0 && x >= total) x = total - 1;  // rounding guard
    const unsigned ball = __ballot_sync(kFull, incl > x);
    if (lane == 0) sm.found_warp = ball ? __ffs(ball) - 1 : -1;
    if (ball && lane == __ffs(ball) - 1) sm.rem = x - (incl - v);
  }
  __syncthreads();
  if (warp == sm.found_warp) {
    ull r = sm.rem;
    for (int32_t b = lo; b < lo + seg; b += 32) {
      const ull incl = scan(weight(b + lane));
      const ull tot = __shfl_sync(kFull, incl, 31);
      if (r < tot) {  // uniform over the warp
        const unsigned ball = __ballot_sync(kFull, incl > r);
        if (lane == __ffs(ball) - 1) sm.found_id = b + lane;
        break;
      }
      r -= tot;
    }
  }
  __syncthreads();
  const int32_t id = sm.found_id;
  __syncthreads();
  return id;
}

// Warp 0: the bin, from the top, where the running total of hist first exceeds rem; the
// remainder inside that bin. Lane l holds bins 255 - 8l .. 248 - 8l.
__device__ void pick_digit(Smem& sm, ull rem) {
  const int lane = threadIdx.x & 31;
  ull s = 0;
  for (int q = 0; q < 8; ++q) s += sm.hist[255 - 8 * lane - q];
  ull incl = s;
  for (int off = 1; off < 32; off <<= 1) {
    const ull o = __shfl_up_sync(kFull, incl, off);
    if (lane >= off) incl += o;
  }
  const ull total = __shfl_sync(kFull, incl, 31);
  if (total == 0) {  // no candidate left under the prefix (cannot happen; keeps the bins valid)
    if (lane == 0) sm.digit = 0, sm.rem = 0;
    return;
  }
  if (rem >= total) rem = total - 1;  // the draw's rounding guard
  const unsigned ball = __ballot_sync(kFull, incl > rem);
  if (lane == __ffs(ball) - 1) {
    ull r = rem - (incl - s);
    for (int q = 0; q < 8; ++q) {
      const int d = 255 - 8 * lane - q;
      if (r < sm.hist[d]) {
        sm.digit = uint32_t(d);
        sm.rem = r;
        break;
      }
      r -= sm.hist[d];
    }
  }
}

// The candidate at which the running count (by_mass false) or mass of the candidates in
// descending key order, ties by ascending id, first exceeds x; its key and id.
__device__ void radix_select(const RowCtx& c, bool by_mass, ull x, Smem& sm, uint32_t& key_out,
                       int32_t& id_out) {
  uint32_t prefix = 0, pmask = 0;
  ull rem = x;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) sm.hist[b] = 0;
    __syncthreads();
    for (int32_t base = 0; base < c.V; base += kThreads) {  // the same trip count in every lane
      const int32_t i = base + int32_t(threadIdx.x);
      uint32_t key = 0;
      ull W = 0;
      const bool in = i < c.V && elem(c, i, key, W) && (key & pmask) == prefix;
      hist_add(sm, in ? (key >> shift) & 255u : kNoBin, by_mass ? W : 1ull);
    }
    __syncthreads();
    if (threadIdx.x < 32) pick_digit(sm, rem);
    __syncthreads();
    prefix |= sm.digit << shift;
    pmask |= 255u << shift;
    rem = sm.rem;
  }
  // rem: the offset inside the tie group (key == prefix), whose members weigh the same.
  const ull per = by_mass ? fixed_weight(key_value(prefix), c) : 1ull;
  const ull group = sm.hist[prefix & 255u];
  ull j = per ? rem / per : 0;
  if (per && j >= group / per) j = group / per - 1;
  __syncthreads();  // hist is cleared by the next select
  key_out = prefix;
  id_out = nth_with_key(c, prefix, int32_t(j), sm);
}

struct Best {
  float v;
  int32_t i;
};
__device__ __forceinline__ Best better(Best a, Best b) {
  if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;  // NaN never wins; ties to the lower id
  return a;
}


}  // namespace sala::cuda::sample_detail
