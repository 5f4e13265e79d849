// `sala bench offline`'s long-context rows (bench_offline.h): --long-prefill (one prompt per
// length, prefilled in --chunk chunks as the server does) and --long-decode-contexts (B
// sequences prefilled to C tokens, then timed greedy steps).
#include <fmt/core.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cli/bench_mixed.h"
#include "cli/bench_offline.h"

namespace sala::cli {

// Prefills prompt[0, len) into state slot `slot` and `pages` the way the server does: chunks
// ending at multiples of --chunk and at len, each a call with past_len = its offset; only the
// last asks for a logit row. Returns the greedy next token (argmax on the backend).
int32_t chunked_prefill(Bench& b, int64_t len, int slot, const std::vector<int32_t>& pages,
                        const std::string& label) {
  std::vector<float> logits;
  std::vector<int32_t> next;
  const int64_t chunk = b.a.chunk, n_chunks = (len + chunk - 1) / chunk;
  for (int64_t i = 0; i < n_chunks; ++i) {
    const int64_t off = i * chunk, n = std::min(chunk, len - off);
    sala::StepMeta m;
    m.add_seq(b.prompt.data() + off, int32_t(n), off, slot, pages, false, i + 1 == n_chunks);
    b.model.forward(m, logits, nullptr, &next);
    fmt::print(stderr, "\r{}: chunk {}/{}", label, i + 1, n_chunks);
  }
  return next.at(0);
}

// Prefill of one long prompt per --long-prefill length, batch 1, timed as a whole.
void bench_long_prefill(Bench& b) {
  if (b.a.long_prefill.empty()) return;
  {  // warm-up: one chunk, so that one-time set-up (workspaces, GEMM plans) is not timed
    const int64_t n = std::min<int64_t>(b.a.chunk, b.a.long_prefill[0]);
    sala::StepMeta warm;
    warm.add_seq(b.prompt.data(), int32_t(n), 0, 0, seq_pages(0, pages_for(n, b.page_size)),
                 false, true);
    std::vector<float> logits;
    b.model.forward(warm, logits);
    if (b.a.profile_ops != 0) b.model.backend().report_op_profile("before the long prefills");
  }
  for (int64_t L : b.a.long_prefill) {
    const auto t0 = BenchClock::now();
    chunked_prefill(b, L, 0, seq_pages(0, pages_for(L, b.page_size)), fmt::format("prefill {}", L));
    const double sec = since(t0);
    fmt::print(stderr, "\n");
    const double linear_flops = 2 * b.body_params * double(L) + 2 * b.head_params;
    const double attn_flops = prefill_attention_flops(b.cfg, L, b.a.chunk);
    const double floor_s = (linear_flops / b.peak_flops + attn_flops / kPeakFlops) / b.ranks;
    b.add({{"kind", "long_prefill"}, {"batch", 1}, {"input_len", L}, {"chunk", b.a.chunk},
           {"seconds", sec}, {"tok_s", double(L) / sec}, {"floor_seconds", floor_s},
           {"floor_linear_flops", linear_flops}, {"floor_attention_flops", attn_flops},
           {"fraction_of_floor", floor_s / sec}},
          fmt::format("prefill B=1   L={:<8} {:>9.3f} s       {:>10.1f} tok/s   floor {:.3f} s "
                      "({:.1f}% attention) -> {:5.1f}% of floor",
                      L, sec, double(L) / sec, floor_s,
                      100 * attn_flops / (linear_flops + attn_flops), 100 * floor_s / sec));
    // One op table per prompt length (the --profile-ops steps of this prefill).
    if (b.a.profile_ops != 0) b.model.backend().report_op_profile(fmt::format("prefill {}", L));
    const int N = b.a.long_prefill_beside;
    if (N <= 0) continue;
    auto [row, line] = time_prefill_beside_decodes(
        b.model, b.prompt, L, b.a.chunk, N, b.a.decode_in,
        pages_for(max_of(b.a.long_prefill), b.page_size)).result(sec);
    b.add(std::move(row), std::move(line));
    if (b.a.profile_ops != 0)
      b.model.backend().report_op_profile(fmt::format("prefill {} beside {} decodes", L, N));
  }
}

// Greedy decode of B sequences at each --long-decode-contexts C, for each
// --long-decode-batches B: the median step of --long-decode-steps.
void bench_long_decode(Bench& b) {
  const int steps = b.a.long_decode_steps;
  std::vector<float> logits;
  for (int64_t C : b.a.long_decode_contexts) {
    const double seq_bytes = decode_seq_bytes(b.cfg, C);
    const int32_t n_pages = pages_for(C + steps, b.page_size);
    for (int B : b.a.long_decode_batches) {
      std::vector<int32_t> next(static_cast<size_t>(B));
      for (int s = 0; s < B; ++s)  // each sequence alone, as the server would; not timed
        next[size_t(s)] = chunked_prefill(b, C, s, seq_pages(s, n_pages),
                                          fmt::format("decode C={} B={}: prefill {}/{}", C, B, s + 1, B));
      std::vector<double> step_ms;
      for (int i = 0; i < steps; ++i) {
        sala::StepMeta m;
        for (int s = 0; s < B; ++s)
          m.add_seq(&next[size_t(s)], 1, C + i, s, seq_pages(s, n_pages), false, true);
        const auto t0 = BenchClock::now();
        b.model.forward(m, logits, nullptr, &next);  // greedy on the device, as the engine does
        step_ms.push_back(since(t0) * 1e3);
        if ((i + 1) % 16 == 0 || i + 1 == steps)  // spaces: over the longer prefill line
          fmt::print(stderr, "\rdecode C={} B={}: step {}/{}          ", C, B, i + 1, steps);
      }
      fmt::print(stderr, "\n");
      std::sort(step_ms.begin(), step_ms.end());
      const double med = step_ms[step_ms.size() / 2];
      const double floor_ms = (b.linear_bytes + B * seq_bytes / b.ranks) / kPeakBytes * 1e3;
      b.add({{"kind", "long_decode"}, {"batch", B}, {"context", C}, {"steps", steps},
             {"ms_per_step", med}, {"tok_s", B * 1e3 / med}, {"floor_ms", floor_ms},
             {"floor_seq_bytes", seq_bytes}, {"fraction_of_floor", floor_ms / med}},
            fmt::format("decode  B={:<3} C={:<8} {:>9.3f} ms/step {:>10.1f} tok/s   "
                        "floor {:.3f} ms -> {:5.1f}% of floor",
                        B, C, med, B * 1e3 / med, floor_ms, 100 * floor_ms / med));
    }
  }
}

}  // namespace sala::cli
