// The InfLLM-v2 selection rules of SPEC §9 / golden README §6, as plain functions shared by
// the CPU backend and the tests (the CUDA kernels implement the same rules). The entry
// counts n1 / n2 of a level come from backend/cache_layout.h (num_entries).
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

namespace sala::infllm {

// How many entries (a prefix 0..count-1) query position t sees at a level with n entries.
// first_call: the call started on an empty sequence (one-shot prefill or first chunk) of
// T = L tokens: the kernel's bottom-right formula with its quirk at T ≡ -1 (mod s).
// Otherwise the absolute rule: entry j visible iff its window ends at or before t.
inline int64_t visible_count(int64_t t, int64_t n, int64_t T, int w, int s, bool first_call) {
  int64_t c;
  if (first_call) {
    // C integer division (truncation toward zero), as the CUDA kernel computes it.
    c = (t + 1) / s - 1 + n - (T - s + 1) / s;
  } else {
    c = t + 1 >= w ? (t + 1 - w) / s + 1 : 0;
  }
  return std::clamp<int64_t>(c, 0, n);
}

// Block scores from level-1 scores (SPEC §9.5): forced blocks +inf, others the max over the
// r+1 level-1 entries overlapping the block (r = block/stride), -inf if none exist.
inline void pool_blocks(const float* score, int64_t n1, int64_t nb, int64_t qb, int r,
                        int init_blocks, int local_blocks, float* block_score) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t b = 0; b < nb; ++b) {
    if (b < init_blocks || (b >= qb - local_blocks && b <= qb)) {
      block_score[b] = inf;
      continue;
    }
    const int64_t lo = std::max<int64_t>(b * r - 1, 0);
    const int64_t hi = std::min<int64_t>(b * r + r, n1);
    float m = -inf;
    for (int64_t j = lo; j < hi; ++j) m = std::max(m, score[j]);
    block_score[b] = m;
  }
}

// Top-k with ties to the lower block index, then blocks after qb dropped; ascending.
inline void select_topk(const float* block_score, int64_t nb, int64_t qb, int k,
                        std::vector<int32_t>& idx, std::vector<int32_t>& out) {
  idx.resize(size_t(nb));
  std::iota(idx.begin(), idx.end(), 0);
  const int64_t K = std::min<int64_t>(k, nb);
  std::partial_sort(idx.begin(), idx.begin() + K, idx.end(), [&](int32_t a, int32_t b) {
    if (block_score[a] != block_score[b]) return block_score[a] > block_score[b];
    return a < b;
  });
  out.clear();
  for (int64_t i = 0; i < K; ++i)
    if (idx[size_t(i)] <= qb) out.push_back(idx[size_t(i)]);
  std::sort(out.begin(), out.end());
}

}  // namespace sala::infllm
