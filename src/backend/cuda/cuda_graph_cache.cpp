#include "backend/cuda/cuda_graph_cache.h"

#include "backend/cuda/cuda_check.h"

namespace sala::cuda_host {

void GraphCache::drop() {
  for (auto& [key, g] : graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
}

bool GraphCache::launch(int key) {
  auto it = graphs_.find(key);
  if (!on_ || it == graphs_.end() || !it->second.exec) return false;
  CUDA_CHECK(cudaGraphLaunch(it->second.exec, stream_));
  return true;
}

bool GraphCache::capture_begin(int key) {
  if (!on_) return false;
  // The first step of a shape runs directly: kernel attributes, cuBLASLt algorithms and
  // tables are set up outside any recording.
  if (graphs_[key].seen++ == 0) return false;
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
  return true;
}

void GraphCache::capture_end(int key) {
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  capturing_ = false;
  Entry& g = graphs_[key];
  if (g.exec) CUDA_CHECK(cudaGraphExecDestroy(g.exec));
  CUDA_CHECK(cudaGraphInstantiate(&g.exec, graph, 0));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
}

}  // namespace sala::cuda_host
