// RopeTables: RoPE inverse frequencies on the device, one table per (head_dim, theta):
// inv_freq[j] = 1 / theta^(2j/d) in fp32 for j < d/2, computed on the host exactly as
// CpuBackend does. The model's table is built at init_caches; another (tests) on first use,
// never while a step is recorded.
#pragma once
#include <cuda_runtime.h>

#include <map>
#include <utility>

#include "backend/cuda/cuda_arena.h"
#include "backend/cuda/cuda_graph_cache.h"

namespace sala::cuda_host {

class RopeTables {
 public:
  RopeTables(cudaStream_t stream, DeviceArena& arena, const GraphCache& graphs)
      : stream_(stream), arena_(arena), graphs_(graphs) {}
  void add(int head_dim, double theta);            // builds the table if it is new
  const float* get(int head_dim, double theta);    // [head_dim / 2] fp32

 private:
  float* make(int head_dim, double theta);

  cudaStream_t stream_;
  DeviceArena& arena_;
  const GraphCache& graphs_;
  std::map<std::pair<int, double>, float*> tables_;
};

}  // namespace sala::cuda_host
