// Host-safe part of the CUDA backend's helpers (compiled by g++ and nvcc): fail-fast
// CUDA/cuBLAS checks that print file:line, and the per-sequence step record the kernels
// read. fmt/SALA_CHECK stay out of .cu files (nvcc 13 rejects fmt 9's consteval checks).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>

#include <cstdio>
#include <cstdlib>

#define CUDA_CHECK(expr)                                                                \
  do {                                                                                  \
    cudaError_t err_ = (expr);                                                          \
    if (err_ != cudaSuccess) [[unlikely]] {                                             \
      std::fprintf(stderr, "%s:%d: CUDA error %s (%s) in %s\n", __FILE__, __LINE__,     \
                   cudaGetErrorName(err_), cudaGetErrorString(err_), #expr);            \
      std::fflush(stderr);                                                              \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

// After every kernel launch: launch-configuration errors surface here.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(expr)                                                              \
  do {                                                                                  \
    cublasStatus_t st_ = (expr);                                                        \
    if (st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                                    \
      std::fprintf(stderr, "%s:%d: cuBLAS error %d (%s) in %s\n", __FILE__, __LINE__,   \
                   int(st_), cublasLtGetStatusString(st_), #expr);                        \
      std::fflush(stderr);                                                              \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

namespace sala::cuda {

inline int ceil_div(long long a, long long b) { return int((a + b - 1) / b); }

// Per-sequence slice of a step as the kernels see it (backend/step.h SeqSlice).
struct DevSeq {
  int32_t token_begin;
  int32_t num_tokens;
  int32_t state_slot;
  int32_t page_begin;
  int32_t num_pages;
  int32_t sparse;  // sparse-layer mode of this call: 1 = InfLLM-v2, 0 = dense
  // Calls of at most kSplitCallRows rows (decode rows, speculative verify rows) split each
  // row's keys into parts (attention) and entries (selection) as a decode row does: the
  // index of the call's first row among the step's split rows (their partials' slots); -1
  // for longer calls.
  int32_t split_row;
  // Lightning layers: the slot the state after the call goes to (SeqSlice::state_dst_slot;
  // state_slot itself for an in-place call).
  int32_t state_dst_slot;
  long long past_len;
};

}  // namespace sala::cuda
