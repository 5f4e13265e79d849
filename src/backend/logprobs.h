// Log-probabilities of one fp32 logits row on the host: the CPU backend's logprobs_rows and
// Backend's default (which downloads the rows first) share it, so both give the same bits.
#pragma once
#include <cstdint>

namespace sala {

// The most top-N alternatives a request may ask for (OpenAI's top_logprobs bound).
inline constexpr int kMaxTopLogprobs = 20;

// log_softmax(row)[target] (NaN when target < 0) into *logprob, and the top_n (<= 20) ids of
// the largest logits, largest first, ties to the lowest id, with their log-probabilities, into
// top_ids[0..top_n) / top_logprobs[0..top_n). log_softmax(x)_i = x_i - m - log Σ exp(x_j - m)
// with m = max x and the sum in double: exact to fp32 rounding.
void logprobs_of_row(const float* row, int64_t vocab, int32_t target, int top_n, float* logprob,
                     int32_t* top_ids, float* top_logprobs);

}  // namespace sala
