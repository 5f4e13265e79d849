// Kernels of the CUDA communicators (cuda_comm.h): the peer group's all-reduce and gather
// (device flags, no host synchronisation) and the per-rank half of the vocab-parallel argmax.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_argmax.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_comm.h"

namespace sala::cuda {
namespace {

constexpr int kThreads = 512;
// Polls of a peer's flag before a block gives up (a missing rank: __trap, a CUDA error, rather
// than a hang); a poll takes ~0.5-2 µs, so this is tens of seconds.
constexpr uint64_t kMaxPolls = uint64_t(1) << 25;

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Block b of this rank meets block b of every rank at `epoch`: its staging writes are visible
// to them, theirs to it.
__device__ void peer_barrier(const PeerView& v, uint32_t epoch) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    st_release_sys(v.flags[v.rank] + blockIdx.x, epoch);
    for (int k = 0; k < v.ranks; ++k) {
      if (k == v.rank) continue;
      uint64_t polls = 0;
      while (int32_t(ld_acquire_sys(v.flags[k] + blockIdx.x) - epoch) < 0)
        if (++polls > kMaxPolls) __trap();
    }
  }
  __syncthreads();
}

// This call's epoch for the block (its counter + 1; stored back at the end).
__device__ __forceinline__ uint32_t block_epoch(const PeerView& v) {
  return v.epochs[blockIdx.x] + 1;
}
__device__ __forceinline__ void end_block(const PeerView& v, uint32_t epoch) {
  __syncthreads();
  if (threadIdx.x == 0) v.epochs[blockIdx.x] = epoch;
}

// Block b's slice [a, b) of count elements.
__device__ __forceinline__ void block_slice(int64_t count, int64_t& a, int64_t& b) {
  const int64_t per = (count + gridDim.x - 1) / gridDim.x;
  a = min(count, int64_t(blockIdx.x) * per);
  b = min(count, a + per);
}

template <typename T>
__device__ __forceinline__ float to_f32(T v) {
  if constexpr (sizeof(T) == 2) return __bfloat162float(v);
  else return v;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) peer_all_reduce_kernel(PeerView v, T* x, int64_t n) {
  const uint32_t epoch = block_epoch(v);
  const size_t half = size_t(epoch & 1u) * v.half_bytes;
  int64_t a, b;
  block_slice(n, a, b);
  T* mine = reinterpret_cast<T*>(v.staging[v.rank] + half);
  for (int64_t i = a + threadIdx.x; i < b; i += blockDim.x) mine[i] = x[i];
  peer_barrier(v, epoch);
  for (int64_t i = a + threadIdx.x; i < b; i += blockDim.x) {
    // L2 loads (.cg): another rank's (or GPU's) writes are not in this SM's L1.
    float s = to_f32(__ldcg(reinterpret_cast<const T*>(v.staging[0] + half) + i));
    for (int k = 1; k < v.ranks; ++k)
      s += to_f32(__ldcg(reinterpret_cast<const T*>(v.staging[k] + half) + i));
    if constexpr (sizeof(T) == 2) x[i] = __float2bfloat16_rn(s);
    else x[i] = s;
  }
  end_block(v, epoch);
}

template <typename E>
__global__ void __launch_bounds__(kThreads) peer_gather_kernel(PeerView v, const E* local,
                                                               GatherCols g, E* full,
                                                               bool receive) {
  const uint32_t epoch = block_epoch(v);
  const size_t half = size_t(epoch & 1u) * v.half_bytes;
  const int64_t W = g.col0[v.ranks];
  int64_t a, b;
  block_slice(g.rows * (g.col0[v.rank + 1] - g.col0[v.rank]), a, b);
  E* mine = reinterpret_cast<E*>(v.staging[v.rank] + half);
  for (int64_t i = a + threadIdx.x; i < b; i += blockDim.x) mine[i] = local[i];
  peer_barrier(v, epoch);
  if (receive)
    for (int k = 0; k < v.ranks; ++k) {
      const int64_t w = g.col0[k + 1] - g.col0[k];
      if (w == 0) continue;
      block_slice(g.rows * w, a, b);  // the slice block b of rank k staged
      const E* src = reinterpret_cast<const E*>(v.staging[k] + half);
      for (int64_t i = a + threadIdx.x; i < b; i += blockDim.x)
        full[(i / w) * W + g.col0[k] + i % w] = __ldcg(src + i);
    }
  end_block(v, epoch);
}

// One thread per row: the value at the row's argmax, and the id moved to the whole vocabulary.
__global__ void argmax_values_kernel(const float* __restrict__ logits, int64_t rows, int64_t cols,
                                     int64_t vocab_offset, int32_t* __restrict__ ids,
                                     float* __restrict__ vals) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const int32_t j = ids[r];
  vals[r] = logits[r * cols + j];
  ids[r] = int32_t(vocab_offset + j);
}

}  // namespace

void launch_peer_all_reduce(const PeerView& v, void* x, int64_t n, bool bf16, cudaStream_t st) {
  if (n == 0) return;
  // The same grid on every rank (block b meets block b): from n alone.
  const unsigned blocks = unsigned(std::clamp<int64_t>((n + 8191) / 8192, 1, kPeerMaxBlocks));
  if (bf16)
    peer_all_reduce_kernel<<<blocks, kThreads, 0, st>>>(v, static_cast<__nv_bfloat16*>(x), n);
  else
    peer_all_reduce_kernel<<<blocks, kThreads, 0, st>>>(v, static_cast<float*>(x), n);
  CUDA_CHECK_LAUNCH();
}

void launch_peer_gather(const PeerView& v, const void* local, const GatherCols& g,
                        int elem_bytes, void* full, bool receive, cudaStream_t st) {
  // A fixed grid: a non-receiving rank does not know the others' widths.
  const unsigned blocks = kPeerMaxBlocks;
  if (elem_bytes == 2)
    peer_gather_kernel<<<blocks, kThreads, 0, st>>>(v, static_cast<const uint16_t*>(local), g,
                                                    static_cast<uint16_t*>(full), receive);
  else
    peer_gather_kernel<<<blocks, kThreads, 0, st>>>(v, static_cast<const uint32_t*>(local), g,
                                                    static_cast<uint32_t*>(full), receive);
  CUDA_CHECK_LAUNCH();
}

void launch_argmax_pairs(const float* logits, int64_t rows, int64_t cols, int64_t vocab_offset,
                         int32_t* ids, float* vals, cudaStream_t stream) {
  if (rows == 0) return;
  launch_argmax_rows(logits, rows, cols, ids, stream);  // the slice's first maximum
  argmax_values_kernel<<<unsigned((rows + 127) / 128), 128, 0, stream>>>(logits, rows, cols,
                                                                        vocab_offset, ids, vals);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sala::cuda
