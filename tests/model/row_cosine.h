// Row-wise cosine similarity of two logit (or hidden-state) matrices, for the bf16 criteria of
// the golden README (row cosine min / median): the tensor-parallel tests on the CPU
// (test_tensor_parallel.cpp) and on the GPU (tests/ops/test_cuda_tp.cpp). Header-only.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace sala::test {

// The cosine similarity between rows of `cols` elements of a and b, row by row (the rows
// both have).
inline std::vector<double> row_cos(const std::vector<float>& a, const std::vector<float>& b,
                                   int64_t cols) {
  std::vector<double> c;
  for (size_t r = 0; (r + 1) * size_t(cols) <= std::min(a.size(), b.size()); ++r) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t j = r * size_t(cols); j < (r + 1) * size_t(cols); ++j)
      ab += double(a[j]) * b[j], aa += double(a[j]) * a[j], bb += double(b[j]) * b[j];
    c.push_back(ab / std::sqrt(std::max(aa * bb, 1e-300)));
  }
  return c;
}
inline double min_of(std::vector<double> c) { return *std::min_element(c.begin(), c.end()); }
inline double median_of(std::vector<double> c) {
  std::nth_element(c.begin(), c.begin() + std::ptrdiff_t(c.size() / 2), c.end());
  return c[c.size() / 2];
}

}  // namespace sala::test
