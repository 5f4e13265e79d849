#include "backend/cuda/cuda_op_timer.h"

#include <algorithm>
#include <cstdio>

#include "backend/cuda/cuda_check.h"

namespace sala::cuda_host {

OpTimer::~OpTimer() {
  if (enabled() && (steps_timed_ > 0 || !ticks_.empty())) report("at exit");
  for (cudaEvent_t e : pool_) cudaEventDestroy(e);
}

void OpTimer::report(const char* label) {
  if (!enabled()) return;
  resolve();
  std::vector<std::pair<double, std::string>> v;
  double total = 0;
  for (auto& [name, t] : op_ms_) v.push_back({t.first, name}), total += t.first;
  std::sort(v.rbegin(), v.rend());
  std::fprintf(stderr, "\n[optime] %s: GPU time by op over %lld steps (eager steps only), %.3f ms total\n",
               label, (long long)steps_timed_, total);
  for (auto& [ms, name] : v)
    std::fprintf(stderr, "[optime] %-28s %10.3f ms %6.1f%%  %8lld calls\n", name.c_str(), ms,
                 100 * ms / std::max(total, 1e-9), (long long)op_ms_[name].second);
  op_ms_.clear();
  steps_timed_ = 0;
}

void OpTimer::begin_step(int64_t rows) {
  if (!enabled()) return;
  resolve();  // the previous step's, when it downloaded nothing
  step_timed_ = filter_ < 0 ? rows <= -filter_ : rows >= filter_;
  ticks_.clear();
  if (step_timed_) {
    ++steps_timed_;
    tick("begin_step");
  }
}

void OpTimer::tick(const char* op) {
  if (!enabled() || !step_timed_ || graphs_.capturing()) return;
  if (ticks_.size() >= pool_.size()) {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    pool_.push_back(e);
  }
  cudaEvent_t e = pool_[ticks_.size()];
  CUDA_CHECK(cudaEventRecord(e, stream_));
  ticks_.push_back({op, e});
}

void OpTimer::resolve() {
  if (ticks_.size() < 2) return ticks_.clear();
  CUDA_CHECK(cudaEventSynchronize(ticks_.back().second));
  for (size_t i = 1; i < ticks_.size(); ++i) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ticks_[i - 1].second, ticks_[i].second));
    auto& a = op_ms_[ticks_[i].first];
    a.first += ms;
    a.second += 1;
  }
  ticks_.clear();
}

}  // namespace sala::cuda_host
