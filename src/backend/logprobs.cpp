#include "backend/logprobs.h"

#include <cmath>
#include <limits>

#include "core/check.h"

namespace sala {

void logprobs_of_row(const float* row, int64_t vocab, int32_t target, int top_n, float* logprob,
                     int32_t* top_ids, float* top_logprobs) {
  SALA_CHECK(vocab > 0 && top_n >= 0 && top_n <= kMaxTopLogprobs && target < vocab);
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < vocab; ++j) m = std::max(m, row[j]);
  double sum = 0;
  for (int64_t j = 0; j < vocab; ++j) sum += std::exp(double(row[j]) - double(m));
  const double lse = double(m) + std::log(sum);
  *logprob = target >= 0 ? float(double(row[target]) - lse) : std::numeric_limits<float>::quiet_NaN();
  if (top_n == 0) return;
  // Insertion into a sorted list of at most 20: one pass, and nearly every logit is rejected
  // by the first comparison with the current n-th largest.
  int32_t ids[kMaxTopLogprobs];
  float vals[kMaxTopLogprobs];
  int n = 0;
  for (int64_t j = 0; j < vocab; ++j) {
    const float v = row[j];
    if (n == top_n && !(v > vals[n - 1])) continue;  // ties keep the lower id already held
    int k = n < top_n ? n++ : n - 1;
    while (k > 0 && v > vals[k - 1]) {
      vals[k] = vals[k - 1];
      ids[k] = ids[k - 1];
      --k;
    }
    vals[k] = v;
    ids[k] = int32_t(j);
  }
  for (int i = 0; i < n; ++i) {
    top_ids[i] = ids[i];
    top_logprobs[i] = float(double(vals[i]) - lse);
  }
  for (int i = n; i < top_n; ++i) {  // a vocabulary smaller than top_n
    top_ids[i] = -1;
    top_logprobs[i] = -std::numeric_limits<float>::infinity();
  }
}

}  // namespace sala
