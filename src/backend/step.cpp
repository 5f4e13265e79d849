#include "backend/step.h"

namespace sala {

void StepMeta::add_seq(const int32_t* ids, int32_t n, int64_t past_len, int32_t state_slot,
                       const std::vector<int32_t>& pages, bool all_logits, bool last_logit) {
  SeqSlice s;
  s.token_begin = num_tokens();
  s.num_tokens = n;
  s.past_len = past_len;
  s.state_slot = state_slot;
  s.page_begin = int32_t(page_table.size());
  s.num_pages = int32_t(pages.size());
  page_table.insert(page_table.end(), pages.begin(), pages.end());
  for (int32_t i = 0; i < n; ++i) {
    token_ids.push_back(ids[i]);
    positions.push_back(int32_t(past_len + i));
    if (all_logits || (last_logit && i == n - 1)) logit_rows.push_back(s.token_begin + i);
  }
  seqs.push_back(s);
}

}  // namespace sala
