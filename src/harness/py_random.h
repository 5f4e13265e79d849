// Python's `random` module, just enough to reproduce `random.seed(n); random.shuffle(x)`
// (MT19937 seeded by init_by_array from the integer's 32-bit words, _randbelow by rejection
// on getrandbits). sglang.bench_serving shuffles the custom dataset this way before taking
// requests, so using the same seed sends the requests in the same order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace sala::harness {

class PyRandom {
 public:
  explicit PyRandom(uint64_t seed);
  uint32_t genrand_uint32();
  uint64_t getrandbits(int k);  // k in [0, 64]
  uint64_t randbelow(uint64_t n);  // n > 0
  template <typename T>
  void shuffle(std::vector<T>& x) {
    for (size_t i = x.size(); i-- > 1;) {
      size_t j = static_cast<size_t>(randbelow(i + 1));
      std::swap(x[i], x[j]);
    }
  }

 private:
  void init_genrand(uint32_t s);
  void init_by_array(const std::vector<uint32_t>& key);
  uint32_t mt_[624];
  int mti_ = 625;
};

}  // namespace sala::harness
