// What the stand-alone kernel A/B harnesses of scripts/kernel_ab share: a CUDA error check,
// the PDL switch the backend's launchers ask (these binaries are built for sm_90a only), a
// deterministic generator, and a timer of launches.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace sala::cuda {
bool pdl_launch_enabled() { return true; }  // defined once: one harness source per binary
}  // namespace sala::cuda

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

namespace kernel_ab {

inline uint32_t rng(uint64_t& s) {
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return uint32_t(s >> 33);
}

// Median µs per launch over 30 timings (after 5 warm-ups) of `reps` launches back to back.
template <typename F>
float median_us(F&& launch, cudaStream_t st, int reps) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> us;
  for (int i = 0; i < 35; ++i) {
    CK(cudaEventRecord(e0, st));
    for (int r = 0; r < reps; ++r) launch();
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 5) us.push_back(ms * 1000.f / float(reps));
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace kernel_ab
