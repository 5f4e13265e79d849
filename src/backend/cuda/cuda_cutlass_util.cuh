// Shared by the CUTLASS GEMMs (cuda_gemm_fp8_sm90.cu, cuda_gemm_int4_sm90.cu): the device
// check their launchers make and the abort on a CUTLASS failure after can_implement.
#pragma once
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "cutlass/cutlass.h"

namespace sala::cuda {

// The process uses one device; its compute capability does not change.
inline bool device_is_sm90() {
  static const bool sm90 = [] {
    int dev = 0, major = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ==
               cudaSuccess &&
           major == 9;
  }();
  return sm90;
}

// After can_implement accepted the problem, initialize / run failing is a broken invariant.
inline void check_cutlass(cutlass::Status status, const char* what, const char* file, int line) {
  if (status == cutlass::Status::kSuccess) [[likely]] return;
  std::fprintf(stderr, "%s:%d: CUTLASS %s failed: %s\n", file, line, what,
               cutlass::cutlassGetStatusString(status));
  std::fflush(stderr);
  std::abort();
}

}  // namespace sala::cuda
