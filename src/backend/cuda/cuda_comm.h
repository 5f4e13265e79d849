// The device side of tensor parallelism's CUDA communicators (cuda_comm_*.cpp; the interface
// is backend/comm.h): the kernels they launch. Included by .cu files (no fmt).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace sala::cuda {

inline constexpr int kMaxCommRanks = 8;
inline constexpr int kPeerMaxBlocks = 64;

// The peer group's buffers as one rank's kernels see them (cuda_comm_peer.cpp): every rank's
// staging buffer (two halves of half_bytes: a call uses the half of its epoch's parity, so a
// rank may fill the next call's half while the others still read this one's) and flags
// ([kPeerMaxBlocks] uint32, one per block), all readable from this rank's GPU (the same GPU,
// or peer access); this rank's per-block call counters ([kPeerMaxBlocks], the epochs).
struct PeerView {
  char* staging[kMaxCommRanks];
  uint32_t* flags[kMaxCommRanks];
  uint32_t* epochs;
  size_t half_bytes;
  int ranks, rank;
};

// The all-reduce of x [n] (bf16 or fp32) on every rank: each block copies its slice into this
// rank's staging half, meets the same block of every rank (release / acquire flags at system
// scope; a rank that never arrives traps instead of hanging), then writes x[i] = Σ_k staging
// of rank k, summed in fp32 in rank order and rounded once (for two ranks NCCL's bf16 sum;
// for any number the CPU's bf16 emulation, CpuCommGroup). No host synchronisation: it can be
// recorded in a CUDA graph. Every rank must launch it with the same n.
void launch_peer_all_reduce(const PeerView& v, void* x, int64_t n, bool bf16, cudaStream_t st);

// Column boundaries of a gather: rank k's part has rows x (col0[k + 1] - col0[k]) elements.
struct GatherCols {
  int64_t col0[kMaxCommRanks + 1];
  int64_t rows;
};
// Gather of every rank's contiguous local [rows, w_r] into full [rows, col0[ranks]] (columns
// col0[r] ..) on the ranks with `receive` (every rank stages and meets the others, receiving
// or not). elem_bytes 2 or 4 (bit copies). Recordable, as launch_peer_all_reduce.
void launch_peer_gather(const PeerView& v, const void* local, const GatherCols& g,
                        int elem_bytes, void* full, bool receive, cudaStream_t st);

// Each row's maximum of a vocabulary slice: ids[r] = vocab_offset + the first maximum's column
// of logits [rows, cols] fp32 (NaN never wins), vals[r] = its value.
void launch_argmax_pairs(const float* logits, int64_t rows, int64_t cols, int64_t vocab_offset,
                         int32_t* ids, float* vals, cudaStream_t stream);

}  // namespace sala::cuda
