// GraphCache: CUDA graphs of recorded steps by the model's key (Model::graph_step): decode steps per
// batch-size bucket, speculative verify steps per padded layout of rows per call.
// The first step of a key runs eagerly (kernel attributes, cuBLASLt algorithms and tables are
// set up outside any recording), the second is recorded and launched, later ones launch the
// recording. A recording holds device pointers: whoever moves a buffer that a recorded step
// reads (a workspace or the step-metadata buffer growing) calls drop() first.
#pragma once
#include <cuda_runtime.h>

#include <map>

namespace sala::cuda_host {

class GraphCache {
 public:
  GraphCache(bool enabled, cudaStream_t stream) : on_(enabled), stream_(stream) {}
  ~GraphCache() { drop(); }
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  bool enabled() const { return on_; }
  bool capturing() const { return capturing_; }  // between capture_begin and capture_end
  bool launch(int key);         // true: the recording of key was launched
  bool capture_begin(int key);  // true: the stream records until capture_end
  void capture_end(int key);    // instantiates the recording and launches it once
  void drop();                  // destroys every recording

 private:
  struct Entry {
    int seen = 0;
    cudaGraphExec_t exec = nullptr;
  };
  bool on_;
  cudaStream_t stream_;
  bool capturing_ = false;
  std::map<int, Entry> graphs_;
};

}  // namespace sala::cuda_host
