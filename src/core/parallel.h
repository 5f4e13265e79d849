// Splitting a large host-side loop over the machine's cores (load-time conversion and
// quantization of a checkpoint's weights: a 9B model's projections are 9.2 G values, about a
// minute of one core per pass). Each part is independent, so the results do not depend on the
// split.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace sala {

// run(i0, i1) over [0, n) in contiguous parts, one thread each: as many as the machine has cores,
// with at least 1 M values of work per part (an item is `values_per_item` values); one part
// runs on the calling thread.
template <class F>
void parallel_parts(int64_t n, int64_t values_per_item, F&& run) {
  const int64_t threads =
      std::min<int64_t>({int64_t(std::max(1u, std::thread::hardware_concurrency())), n,
                         n * values_per_item / (int64_t(1) << 20) + 1});
  if (threads <= 1) return run(int64_t(0), n);
  std::vector<std::thread> pool;
  for (int64_t i = 1; i < threads; ++i)
    pool.emplace_back(run, n * i / threads, n * (i + 1) / threads);
  run(int64_t(0), n / threads);
  for (std::thread& t : pool) t.join();
}

// memcpy of a large buffer, split as parallel_parts splits.
inline void parallel_copy(void* dst, const void* src, size_t bytes) {
  parallel_parts(int64_t(bytes), 1, [&](int64_t b0, int64_t b1) {
    std::memcpy(static_cast<char*>(dst) + b0, static_cast<const char*>(src) + b0, size_t(b1 - b0));
  });
}

}  // namespace sala
