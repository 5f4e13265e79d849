// Structured output's token masks on the logits (engine → Model::forward →
// Backend::mask_logits): a bitmask per logit row, bit (id % 32) of word (id / 32) set where
// the request's grammar allows token id next. Disallowed tokens get -inf before the argmax /
// the download for sampling, so neither can pick them.
#pragma once
#include <cstdint>
#include <vector>

namespace sala {

struct LogitMasks {
  int32_t words = 0;             // words per mask: ceil(vocab / 32)
  std::vector<int32_t> rows;     // logit rows (indexes into StepMeta::logit_rows) to mask
  std::vector<uint32_t> bits;    // [rows.size(), words]
  bool empty() const { return rows.empty(); }
  void clear() {
    rows.clear();
    bits.clear();
  }
};

// The host twin of every backend's mask: row[j] = -inf for each j < n whose bit in mask is
// clear (ids at or beyond 32 * words count as clear). The CPU backend's mask_logits and the
// CUDA op test's reference.
void mask_logits_row(float* row, int64_t n, const uint32_t* mask, int32_t words);

}  // namespace sala
