#include "backend/token_mask.h"

#include <limits>

namespace sala {

void mask_logits_row(float* row, int64_t n, const uint32_t* mask, int32_t words) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    const int64_t w = j >> 5;
    if (w >= words || !((mask[w] >> (j & 31)) & 1u)) row[j] = neg_inf;
  }
}

}  // namespace sala
