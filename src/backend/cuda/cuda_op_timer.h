// OpTimer: GPU time per op (BackendOptions::profile_ops, `sala bench offline --profile-ops N`).
// An event is recorded after every op of a timed step; the time between consecutive events
// is the op's. Summed by op name and printed to stderr by report() (Backend::report_op_profile)
// and when the backend is destroyed. Steps being recorded as CUDA graphs are never timed
// (events cannot be read back from a recording), so decode steps are timed only with graphs
// off.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_graph_cache.h"

namespace sala::cuda_host {

class OpTimer {
 public:
  // rows_filter: 0 off; N > 0 times the steps of at least N rows (1: every step); N < 0 the
  // steps of at most -N rows.
  OpTimer(int64_t rows_filter, cudaStream_t stream, const GraphCache& graphs)
      : filter_(rows_filter), stream_(stream), graphs_(graphs) {}
  ~OpTimer();  // prints what report() has not (the owner synchronised the stream)
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

  bool enabled() const { return filter_ != 0; }
  void begin_step(int64_t rows);  // sums the previous step's ticks, decides for this one
  void tick(const char* op);      // the op issued since the previous tick is `op`
  void resolve();                 // waits for the last tick and sums the step's op times
  void report(const char* label);  // prints the table of the steps since the last one, clears it

 private:
  int64_t filter_;
  cudaStream_t stream_;
  const GraphCache& graphs_;
  bool step_timed_ = false;
  std::vector<cudaEvent_t> pool_;
  std::vector<std::pair<const char*, cudaEvent_t>> ticks_;
  std::map<std::string, std::pair<double, int64_t>> op_ms_;  // name -> (ms, calls)
  int64_t steps_timed_ = 0;
};

}  // namespace sala::cuda_host
