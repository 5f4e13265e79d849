#include "engine/device_sampling.h"

#include "core/check.h"

namespace sala {

void DeviceSampling::add(int32_t row, uint64_t id, const SamplingParams& p, SamplerState& st,
                         const std::vector<int32_t>& tokens, int32_t prompt_len,
                         int32_t generated, int32_t slot, const std::vector<int32_t>& eos_ids,
                         int32_t vocab, Backend& be) {
  SALA_CHECK(prompt_len >= 0 && generated >= 0 &&
             size_t(prompt_len) + size_t(generated) <= tokens.size());
  RowSampling rs;
  rs.temperature = p.temperature;
  rs.top_k = p.top_k;
  rs.top_p = p.top_p;
  rs.min_p = p.min_p;
  rs.repetition_penalty = p.repetition_penalty;
  rs.frequency_penalty = p.frequency_penalty;
  rs.presence_penalty = p.presence_penalty;
  if (st.penalties()) {
    SALA_CHECK(slot >= 0);
    auto& owner = owner_[slot];
    if (owner != std::pair<uint64_t, int64_t>{id, int64_t(generated)})
      be.load_penalties(slot, vocab, tokens.data(), prompt_len, tokens.data() + prompt_len,
                        generated);
    owner = {id, int64_t(generated) + 1};  // the kernel counts the token this row samples
    rs.penalty_slot = slot;
  }
  // adjust_logits' changes: the biases in order, then the masks; chained per id.
  rs.edit_begin = int32_t(edits_.size());
  last_edit_.clear();
  auto edit = [&](int32_t tok, float bias, bool mask) {
    if (tok < 0 || tok >= vocab) return;
    const int32_t at = int32_t(edits_.size());
    auto [it, fresh] = last_edit_.emplace(tok, at);
    if (!fresh) {
      edits_[size_t(it->second)].next = at;
      it->second = at;
    }
    edits_.push_back(LogitEdit{tok, bias, uint8_t(mask), uint8_t(fresh), 0, -1});
  };
  for (const auto& [tok, bias] : p.logit_bias) edit(tok, bias, false);
  if (generated < p.min_new_tokens) {
    if (!p.ignore_eos)
      for (int32_t tok : eos_ids) edit(tok, 0.0f, true);
    for (int32_t tok : p.stop_token_ids) edit(tok, 0.0f, true);
  }
  rs.edit_count = int32_t(edits_.size()) - rs.edit_begin;
  const bool greedy = p.temperature <= 0.0f || p.top_k == 1;
  rs.u = greedy ? 0.0 : st.uniform();
  rows_.push_back(row);
  params_.push_back(rs);
}

void DeviceSampling::run(Backend& be, const Tensor& logits, std::vector<int32_t>& tokens_by_row) {
  ids_.resize(rows_.size());
  be.sample_rows(logits, rows_.data(), int64_t(rows_.size()), params_.data(), edits_.data(),
                 ids_.data());
  tokens_by_row.assign(size_t(logits.rows), -1);
  for (size_t i = 0; i < rows_.size(); ++i) tokens_by_row[size_t(rows_[i])] = ids_[i];
}

}  // namespace sala
