#include "backend/cuda/cuda_rope_tables.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "core/check.h"

namespace sala::cuda_host {

float* RopeTables::make(int head_dim, double theta) {
  const int half = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int j = 0; j < half; ++j)
    inv[size_t(j)] = 1.0f / std::pow(float(theta), float(2 * j) / float(head_dim));
  float* p = static_cast<float*>(arena_.device(std::max<size_t>(inv.size(), 1) * 4));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  CUDA_CHECK(cudaMemcpy(p, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  return p;
}

void RopeTables::add(int head_dim, double theta) {
  const std::pair<int, double> key{head_dim, theta};
  if (!tables_.count(key)) tables_[key] = make(head_dim, theta);
}

const float* RopeTables::get(int head_dim, double theta) {
  auto it = tables_.find({head_dim, theta});
  if (it == tables_.end()) {
    // Not the model's own table (tests): build it once, as init_caches does.
    SALA_CHECK(!graphs_.capturing(), "RoPE table built while recording a step");
    it = tables_.emplace(std::make_pair(head_dim, theta), make(head_dim, theta)).first;
  }
  return it->second;
}

}  // namespace sala::cuda_host
