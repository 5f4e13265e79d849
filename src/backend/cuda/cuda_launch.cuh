// Kernel launches with programmatic dependent launch (PDL, sm_90+). A kernel launched by
// launch_pdl may start while the kernel before it in the stream still runs (once every CTA of
// that one has called pdl_trigger()); it must call pdl_wait() (cuda_common.cuh) in every CTA
// before it reads anything an earlier kernel wrote and before it writes anything. The decode
// step is ~400 small kernels; this hides the launch and ramp of each behind its predecessor.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"  // pdl_wait, pdl_trigger

namespace sala::cuda {

// True when the device is sm_90+, this build's kernels were compiled for it (so their
// griddepcontrol.wait exists: code JIT-compiled from the sm_80 PTX has none). Decided once,
// for the current device.
bool pdl_launch_enabled();

// What a persistent GEMV ring (cuda_gemv_ring.cuh's users) needs of the current device, read
// once per process by each ring's setup() (the GPUs of one process are alike): whether `smem`
// bytes of shared memory per block fit (then PDL is decided now, outside any capture), and
// the SM count (one CTA per SM).
struct RingDevice {
  bool ring;
  int sms;
};
inline RingDevice ring_device(int smem) {
  int dev = 0, optin = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const RingDevice r{optin >= smem, sms};
  if (r.ring) pdl_launch_enabled();
  return r;
}

template <typename... P, typename... A>
void launch_pdl(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                A&&... args) {
  cudaLaunchAttribute at[1] = {};
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cfg.attrs = at;
  cfg.numAttrs = pdl_launch_enabled() ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...));
}

}  // namespace sala::cuda
