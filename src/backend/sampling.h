// Sampling one token per logit row, the host reference (the oracle of Backend::sample_rows and
// the engine's Sampler). SGLang's order: the request's logit edits (logit_bias, the min_tokens
// stop-token mask), penalties (repetition over prompt + generated tokens, HF semantics;
// frequency / presence over generated tokens, OpenAI semantics), temperature, top-k, top-p,
// min-p, then one draw: the inverse CDF at u·sum over the candidates in descending-logit order
// (ties to the lower id; id order when neither top-k nor top-p is set, the same distribution).
// Greedy (temperature <= 0 or top_k == 1) is the argmax of the edited, penalised row, ties to
// the lowest id; so is a row with no finite logit.
#pragma once
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sala {

// Index of the largest value, ties to the lowest index (NaN never wins over index 0's value).
int32_t argmax(const float* x, int32_t n);

// One logit row's sampling parameters for a step (Backend::sample_rows). Plain old data: the
// CUDA backend copies an array of them to the device as is.
struct RowSampling {
  float temperature = 1.0f;  // <= 0: greedy
  int32_t top_k = -1;        // <= 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  // The row's penalty table (Backend::load_penalties), -1: no penalties. The sampled token is
  // counted in it (one more generated occurrence).
  int32_t penalty_slot = -1;
  int32_t edit_begin = 0, edit_count = 0;  // the row's LogitEdits in the call's edit array
  double u = 0;  // the draw, uniform in [0, 1) (the request's random stream); unused if greedy
};

// A change the request makes to one logit before penalties (engine adjust_logits): every
// bias added in the request's order, then -inf if any edit of the id masks it (min_tokens: a
// stop token before min_new_tokens tokens were generated). The edits of one id form a chain
// from its first edit (first = 1) through `next` (an index into the call's edit array, -1
// last), so a backend may give each id one thread and still add its biases in order.
struct LogitEdit {
  int32_t id = 0;
  float bias = 0.0f;
  uint8_t mask = 0;
  uint8_t first = 1;
  uint16_t pad_ = 0;
  int32_t next = -1;
};

// The CUDA backend copies arrays of both to the device as they are.
static_assert(sizeof(RowSampling) == 48 && sizeof(LogitEdit) == 16, "RowSampling / LogitEdit layout");

// Penalty table entries, one int32 per vocabulary id: generated occurrences in the low 30
// bits, kInPrompt if the id occurs in the prompt.
constexpr int32_t kPenaltyInPrompt = 1 << 30;
constexpr int32_t kPenaltyCountMask = kPenaltyInPrompt - 1;
// One id's logit after penalties, entry its (non-zero) table entry. Repetition (HF): prompt
// + generated ids, divides positive logits, multiplies negative ones. Frequency / presence
// (OpenAI): generated ids only. (cuda_sample.cu repeats these float operations.)
inline float penalized(float l, int32_t entry, float repetition, float frequency, float presence) {
  const int32_t c = entry & kPenaltyCountMask;
  if (repetition != 1.0f) l = l > 0 ? l / repetition : l * repetition;
  if (c > 0) l -= frequency * float(c) + presence;
  return l;
}
// A slot's table: prompt ids flagged, generated ids counted (ids outside [0, vocab) skipped).
std::vector<int32_t> penalty_table(int32_t vocab, const int32_t* prompt, int64_t n_prompt,
                                   const int32_t* generated, int64_t n_generated);

// Edits then penalties, in place on one row (the CPU sampler's exact float operations).
void apply_edits_and_penalties(float* logits, int32_t vocab, const RowSampling& rs,
                               const LogitEdit* edits, const int32_t* penalty /* [vocab] or null */);

// The candidates of one row and their weights, kept between calls (no allocation per token).
struct SampleScratch {
  std::vector<std::pair<float, int32_t>> cand;  // (logit, id), in draw order
  std::vector<float> probs;                     // unnormalised weights exp((l - max) / T)
};

// Temperature, top-k, top-p and min-p over logits [vocab]: the candidates s.cand[0, n) and
// weights s.probs (summing to `sum`); -1 when sampling is the argmax (greedy parameters, or
// no positive weight).
int64_t weigh_candidates(const float* logits, int32_t vocab, float temperature, int32_t top_k,
                         float top_p, float min_p, SampleScratch& s, double& sum);
// The first candidate whose running weight exceeds target (= u · sum), skipping zero weights;
// the last positive one if rounding leaves none.
int32_t draw_candidate(const SampleScratch& s, size_t n, double target);

// The host implementation of Backend::sample_rows and load_penalties (the CPU backend's, and
// the oracle of the CUDA kernel): penalty tables by slot, one row at a time.
class HostSampler {
 public:
  void load_penalties(int32_t slot, int32_t vocab, const int32_t* prompt, int64_t n_prompt,
                      const int32_t* generated, int64_t n_generated);
  // out[i] = the token of row rows[i] of logits [*, vocab] (host memory, not modified).
  void sample_rows(const float* logits, int32_t vocab, const int32_t* rows, int64_t n,
                   const RowSampling* params, const LogitEdit* edits, int32_t* out);
  // One row (raw logits [vocab], not modified); counts the token in `penalty` when given.
  int32_t sample_row(const float* raw, int32_t vocab, const RowSampling& rs,
                     const LogitEdit* edits, int32_t* penalty);

 private:
  std::unordered_map<int32_t, std::vector<int32_t>> tables_;
  std::vector<float> row_;
  SampleScratch scratch_;
};

}  // namespace sala
