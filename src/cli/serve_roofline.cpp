#include "cli/serve_roofline.h"

#include <algorithm>

#include "cli/bench_floors.h"
#include "core/error.h"
#include "model/weights.h"

namespace sala::cli {

ServeRoofline serve_roofline(const RooflineModel& m, const std::vector<int64_t>& prompt_lens,
                             const std::vector<int64_t>& output_lens, int concurrency) {
  SALA_CHECK(prompt_lens.size() == output_lens.size());
  const ModelConfig& c = m.cfg;
  if (!m.quantization.empty() && m.quantization != "fp8" && m.quantization != "w4a16")
    fail("roofline: quantization '{}' is not one of fp8, w4a16", m.quantization);
  // Projections as the server stores them: the flag's format, or the checkpoint's own
  // (planned_weight_bytes reads its quantization_config).
  const WeightFormat linear = m.quantization == "fp8"     ? WeightFormat::FP8_E4M3
                              : m.quantization == "w4a16" ? WeightFormat::INT4_GROUPED
                                                          : WeightFormat::BF16;
  const bool fp8_gemms = linear == WeightFormat::FP8_E4M3 ||
                         c.quantization.scheme_of("model.layers.0.mlp.down_proj", c.source).scheme ==
                             QuantScheme::FP8_W8A8;
  double body_params = 0, head_params = double(c.vocab_size) * c.hidden_size;
  for (const auto& [name, shape] : expected_tensors(c))
    if (shape.size() == 2 && name != "model.embed_tokens.weight" && name != "lm_head.weight")
      body_params += double(shape[0]) * double(shape[1]);
  // Bytes a decode step reads: every stored weight but the embedding table (one row per
  // token), which lm_head reads whole when tied.
  const double embed_bytes = c.tie_word_embeddings ? 0.0 : head_params * 2;
  const double step_bytes =
      double(planned_weight_bytes(c, linear, WeightFormat::BF16, 128)) - embed_bytes;

  ServeRoofline r;
  int64_t steps_total = 0, steps_max = 0;
  for (size_t i = 0; i < prompt_lens.size(); ++i) {
    const int64_t L = prompt_lens[i], steps = std::max<int64_t>(0, output_lens[i] - 1);
    r.prefill_s += (2 * body_params * double(L) + 2 * head_params) /
                       (fp8_gemms ? kPeakFlopsFp8 : kPeakFlops) +
                   prefill_attention_flops(c, L, m.chunk) / kPeakFlops;
    r.decode_s += double(steps) * decode_seq_bytes(c, L + steps / 2) / kPeakBytes;
    steps_total += steps;
    steps_max = std::max(steps_max, steps);
  }
  const int64_t lanes = concurrency > 0 ? concurrency : int64_t(std::max<size_t>(1, prompt_lens.size()));
  const int64_t steps = std::max(steps_max, (steps_total + lanes - 1) / lanes);
  r.decode_s += double(steps) * step_bytes / kPeakBytes;
  return r;
}

}  // namespace sala::cli
