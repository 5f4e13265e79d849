// Shim of the CUDA device environment for scripts/select_sim (see run.sh): the selection
// kernels' own source compiled by g++. A block's threads are fibers (ucontext) run by one
// host thread until each reaches a barrier, so __syncthreads, __syncwarp and the warp-wide
// operations (mma.sync m16n8k16, ldmatrix.x4, shuffles, ballot) are exact barriers without
// OS threads; a barrier no thread can pass aborts (a divergent barrier on the GPU).
// Stands in for backend/cuda/cuda_common.cuh and cuda_mma.cuh; cuda_kernels.h, cuda_check.h
// and cuda_kv_fp8.cuh are the real headers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>
#undef __global__
#define __global__
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __device__
#define __device__
#undef __host__
#define __host__
#undef __shared__
#define __shared__ static
#undef __align__
#define __align__(n)
#include "backend/cache_layout.h"

namespace sim {
// ---- fibers ----
struct Fiber {
  ucontext_t ctx;
  dim3 tid;
  bool done = false;
};
inline ucontext_t g_main;
inline std::vector<Fiber> g_fib;
inline std::vector<std::vector<char>> g_stacks;
inline int g_cur = 0;
inline long g_progress = 0;
inline std::function<void()> g_fn;
inline void yield() {
  swapcontext(&g_fib[size_t(g_cur)].ctx, &g_main);
}
struct Bar {
  int n = 0, count = 0;
  unsigned gen = 0;
  void wait() {
    const unsigned g = gen;
    if (++count == n) {
      count = 0;
      ++gen;
      ++g_progress;
      return;
    }
    while (gen == g) yield();
  }
};
struct Warp {
  Bar bar;
  uint32_t x[2][32][6];
  const void* addr[2][32];
  int ctr[32];
  long mma = 0, ldsm = 0, shfl = 0;
};
inline Bar g_block_bar;
inline Warp g_warp[16];
}  // namespace sim

inline dim3 threadIdx, blockIdx, gridDim, blockDim;

namespace sim {
inline void entry() {
  g_fn();
  g_fib[size_t(g_cur)].done = true;
  ++g_progress;
}
// Runs fn as every thread of every block of grid (blocks one at a time, as the kernels'
// static "shared memory" requires).
inline void launch(dim3 grid, int nthreads, std::function<void()> fn) {
  g_fn = std::move(fn);
  gridDim = grid;
  blockDim = dim3(unsigned(nthreads), 1, 1);
  constexpr size_t kStack = 256 * 1024;
  while (g_stacks.size() < size_t(nthreads)) g_stacks.emplace_back(kStack);
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        blockIdx = dim3(bx, by, bz);
        g_block_bar = Bar{nthreads};
        for (int w = 0; w < nthreads / 32; ++w) {
          g_warp[w].bar = Bar{32};
          std::memset(g_warp[w].ctr, 0, sizeof g_warp[w].ctr);
        }
        g_fib.assign(size_t(nthreads), Fiber{});
        for (int t = 0; t < nthreads; ++t) {
          Fiber& f = g_fib[size_t(t)];
          f.tid = dim3(unsigned(t), 0, 0);
          getcontext(&f.ctx);
          f.ctx.uc_stack.ss_sp = g_stacks[size_t(t)].data();
          f.ctx.uc_stack.ss_size = kStack;
          f.ctx.uc_link = &g_main;
          makecontext(&f.ctx, entry, 0);
        }
        for (;;) {
          bool all = true;
          const long p0 = g_progress;
          for (int t = 0; t < nthreads; ++t) {
            if (g_fib[size_t(t)].done) continue;
            all = false;
            g_cur = t;
            threadIdx = g_fib[size_t(t)].tid;
            swapcontext(&g_main, &g_fib[size_t(t)].ctx);
          }
          if (all) break;
          if (g_progress == p0) {
            std::fprintf(stderr, "select_sim: barrier deadlock\n");
            std::abort();
          }
        }
      }
}
// One warp-wide exchange: every lane posts `n` words (and an address), waits for the warp,
// then reads any lane's. Two slots: a lane can post op k + 1 while others read op k.
template <class F>
inline void warp_xchg(const uint32_t* v, int n, const void* addr, F&& read) {
  const int lane = int(threadIdx.x % 32);
  Warp& W = g_warp[threadIdx.x / 32];
  const int s = W.ctr[lane]++ & 1;
  for (int i = 0; i < n; ++i) W.x[s][lane][i] = v[i];
  W.addr[s][lane] = addr;
  W.bar.wait();
  read(W.x[s], W.addr[s], lane);
}
}  // namespace sim

namespace sala::cuda {
using bf16 = __nv_bfloat16;
inline float b2f(bf16 x) {
  return __bfloat162float(x);
}
inline bf16 f2b(float x) {
  return __float2bfloat16_rn(x);
}
inline float rb(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}
inline void pdl_begin() {}
inline void __syncthreads() {
  sim::g_block_bar.wait();
}
inline void __syncwarp(unsigned = 0xffffffffu) {
  sim::g_warp[threadIdx.x / 32].bar.wait();
}
using std::max;
using std::min;
inline int __ffs(int x) {
  return __builtin_ffs(x);
}
inline int atomicAdd(int* p, int v) {
  const int o = *p;
  *p += v;
  return o;
}

template <class T>
inline T shfl_read(T v, int (*src)(int lane, int arg), int arg) {
  static_assert(sizeof(T) == 4);
  uint32_t u;
  std::memcpy(&u, &v, 4);
  T out;
  sim::warp_xchg(&u, 1, nullptr, [&](uint32_t(*x)[6], const void* const*, int lane) {
    std::memcpy(&out, &x[src(lane, arg)][0], 4);
  });
  if (threadIdx.x % 32 == 0) ++sim::g_warp[threadIdx.x / 32].shfl;
  return out;
}
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int o) {
  return shfl_read(
      v, [](int l, int a) { return (l ^ a) & 31; }, o);
}
template <class T>
inline T __shfl_sync(unsigned, T v, int src) {
  return shfl_read(
      v, [](int, int a) { return a & 31; }, src);
}
template <class T>
inline T __shfl_up_sync(unsigned, T v, int o) {
  return shfl_read(
      v, [](int l, int a) { return l >= a ? l - a : l; }, o);
}
inline unsigned __ballot_sync(unsigned, bool p) {
  const uint32_t u = p;
  unsigned out = 0;
  sim::warp_xchg(&u, 1, nullptr, [&](uint32_t(*x)[6], const void* const*, int) {
    for (int l = 0; l < 32; ++l) out |= x[l][0] << l;
  });
  return out;
}

inline float lo16(uint32_t u) {
  uint32_t x = (u & 0xffffu) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline float hi16(uint32_t u) {
  uint32_t x = u & 0xffff0000u;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline uint32_t pack_raw(bf16 lo, bf16 hi) {
  uint16_t a, b;
  std::memcpy(&a, &lo, 2);
  std::memcpy(&b, &hi, 2);
  return uint32_t(a) | (uint32_t(b) << 16);
}
// PTX mma.m16n8k16 .row.col bf16 (g = lane/4, t = lane%4): A a0 (g, 2t..2t+1), a1 (g+8, 2t..),
// a2 (g, 2t+8..), a3 (g+8, 2t+8..); B b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g); C c0,c1
// (g, 2t..2t+1), c2,c3 (g+8, ..). Products exact, summed in double, one fp32 rounding.
inline void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  const uint32_t v[6] = {a[0], a[1], a[2], a[3], b0, b1};
  sim::warp_xchg(v, 6, nullptr, [&](uint32_t(*x)[6], const void* const*, int lane) {
    auto A = [&](int r, int k) {  // element (r, k) of A
      const int l = (r % 8) * 4 + (k % 8) / 2, reg = (r >= 8) + 2 * (k >= 8);
      return k % 2 ? hi16(x[l][reg]) : lo16(x[l][reg]);
    };
    auto B = [&](int k, int n) {
      const int l = n * 4 + (k % 8) / 2, reg = 4 + (k >= 8);
      return k % 2 ? hi16(x[l][reg]) : lo16(x[l][reg]);
    };
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; ++e) {
      const int r = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
      double s = 0;
      for (int k = 0; k < 16; ++k) s += double(A(r, k)) * double(B(k, col));
      c[e] = float(double(c[e]) + s);
    }
  });
  if (threadIdx.x % 32 == 0) ++sim::g_warp[threadIdx.x / 32].mma;
}
// ldmatrix.sync.aligned.m8n8.x4.shared.b16: lane l gives the address of row l % 8 of matrix
// l / 8 (8 contiguous b16, 16-byte aligned); lane l receives in r[i] matrix i's (row l / 4,
// cols 2(l % 4), 2(l % 4) + 1), low half first.
inline void ldmatrix_x4(uint32_t* r, const bf16* row_addr) {
  if ((reinterpret_cast<uintptr_t>(row_addr) & 15) != 0) {
    std::fprintf(stderr, "ldmatrix: unaligned\n");
    std::abort();
  }
  sim::warp_xchg(nullptr, 0, row_addr, [&](uint32_t(*)[6], const void* const* ad, int lane) {
    for (int i = 0; i < 4; ++i) {
      const bf16* p = static_cast<const bf16*>(ad[8 * i + lane / 4]) + 2 * (lane % 4);
      r[i] = pack_raw(p[0], p[1]);
    }
  });
  if (threadIdx.x % 32 == 0) ++sim::g_warp[threadIdx.x / 32].ldsm;
}
// cp.async as a plain copy (zeros for src_bytes 0); commit / wait are then no-ops.
inline void cp_async16(void* smem, const void* gmem, int src_bytes) {
  if ((reinterpret_cast<uintptr_t>(smem) & 15) != 0) {
    std::fprintf(stderr, "cp.async: unaligned\n");
    std::abort();
  }
  if (src_bytes == 16)
    std::memcpy(smem, gmem, 16);
  else
    std::memset(smem, 0, 16);
}
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __fdiv_rn(float a, float b) {
  return a / b;
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline void pdl_wait() {}
inline void pdl_trigger() {}
}  // namespace sala::cuda

// cub::BlockScan<int, NT>::ExclusiveSum through the block barrier.
namespace cub {
template <class T, int NT>
struct BlockScan {
  struct TempStorage {
    T v[NT];
  };
  TempStorage& s;
  explicit BlockScan(TempStorage& t) : s(t) {}
  void ExclusiveSum(T in, T& out) {
    T tot;
    ExclusiveSum(in, out, tot);
  }
  void ExclusiveSum(T in, T& out, T& total) {
    const int tid = int(threadIdx.x);
    s.v[tid] = in;
    sala::cuda::__syncthreads();
    out = 0, total = 0;
    for (int i = 0; i < NT; ++i) {
      if (i < tid) out += s.v[i];
      total += s.v[i];
    }
    sala::cuda::__syncthreads();
  }
};
}  // namespace cub
