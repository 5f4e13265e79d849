#include "cli/bench_mixed.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "backend/cache_layout.h"
#include "core/check.h"

namespace sala::cli {

namespace {
int32_t pages_of(int64_t tokens, int32_t page_size) {
  return int32_t(cache_layout::pages_for(tokens, page_size));
}
}  // namespace

void plan_mixed_prefill(ModelLimits& lim, int64_t max_len, int64_t chunk, int decoding,
                        int64_t context) {
  const int32_t ps = lim.caches.page_size;
  const int64_t steps = (max_len + chunk - 1) / chunk;
  lim.max_step_tokens = std::max<int32_t>(lim.max_step_tokens, int32_t(chunk) + decoding);
  lim.max_logit_rows = std::max(lim.max_logit_rows, decoding + 1);
  lim.caches.num_slots = std::max(lim.caches.num_slots, decoding + 1);
  lim.caches.num_pages = std::max<int32_t>(
      lim.caches.num_pages, pages_of(max_len, ps) + decoding * pages_of(context + steps, ps));
}

std::pair<nlohmann::json, std::string> MixedPrefill::result(double plain_seconds) const {
  nlohmann::json row = {{"kind", "long_prefill_beside"}, {"batch", 1}, {"input_len", len},
                        {"chunk", chunk}, {"decoding", decoding}, {"decode_context", context},
                        {"seconds", seconds}, {"steps", steps}, {"plain_seconds", plain_seconds},
                        {"ratio_to_plain", seconds / plain_seconds}};
  std::string line = fmt::format(
      "prefill B=1   L={:<8} {:>9.3f} s beside {} decodes (C={}): {:.3f}x the plain prefill, "
      "{:+.2f} ms per chunk step", len, seconds, decoding, context, seconds / plain_seconds,
      1e3 * (seconds - plain_seconds) / double(steps));
  return {std::move(row), std::move(line)};
}

MixedPrefill time_prefill_beside_decodes(Model& model, const std::vector<int32_t>& prompt,
                                         int64_t len, int64_t chunk, int decoding,
                                         int64_t context, int32_t first_page) {
  SALA_CHECK(decoding > 0 && context > 0 && chunk > 0 && len > 0 &&
                 int64_t(prompt.size()) >= std::max(len, context),
             "mixed prefill: {} decoding, context {}, chunk {}, length {}", decoding, context,
             chunk, len);
  const int32_t ps = model.limits().caches.page_size;
  const int64_t n_steps = (len + chunk - 1) / chunk;
  const int32_t per_seq = pages_of(context + n_steps, ps);
  std::vector<int32_t> long_pages(size_t(pages_of(len, ps)));
  for (size_t i = 0; i < long_pages.size(); ++i) long_pages[i] = int32_t(i);
  std::vector<std::vector<int32_t>> dec_pages(static_cast<size_t>(decoding));
  for (int d = 0; d < decoding; ++d)
    for (int32_t i = 0; i < per_seq; ++i)
      dec_pages[size_t(d)].push_back(first_page + d * per_seq + i);

  // The decoding sequences' prompts, one call each (not timed); their next tokens.
  std::vector<float> logits;
  std::vector<int32_t> next(static_cast<size_t>(decoding)), out;
  for (int d = 0; d < decoding; ++d) {
    StepMeta m;
    m.add_seq(prompt.data(), int32_t(context), 0, 1 + d, dec_pages[size_t(d)], false, true);
    model.forward(m, logits, nullptr, &out);
    next[size_t(d)] = out.at(0);
  }
  MixedPrefill r{len, chunk, context, decoding};
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n_steps; ++i) {
    const int64_t off = i * chunk, n = std::min(chunk, len - off);
    StepMeta m;  // decode rows first: their ids are out[0, decoding)
    for (int d = 0; d < decoding; ++d)
      m.add_seq(&next[size_t(d)], 1, context + i, 1 + d, dec_pages[size_t(d)], false, true);
    m.add_seq(prompt.data() + off, int32_t(n), off, 0, long_pages, false, i + 1 == n_steps);
    model.forward(m, logits, nullptr, &out);
    for (int d = 0; d < decoding; ++d) next[size_t(d)] = out.at(size_t(d));
    ++r.steps;
    fmt::print(stderr, "\rprefill {} beside {} decodes: chunk {}/{}", len, decoding, i + 1, n_steps);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print(stderr, "\n");
  return r;
}

}  // namespace sala::cli
