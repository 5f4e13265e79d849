#include "engine/request_grammar.h"

#include "core/check.h"

namespace sala {

RequestGrammar::RequestGrammar(std::shared_ptr<const grammar::CompiledGrammar> compiled)
    : matcher_(std::move(compiled)) {
  mask_.resize(size_t(grammar::mask_words(matcher_.vocab_size())));
  matcher_.fill_next_mask(mask_.data());
}

RequestGrammar::Next RequestGrammar::accept(int32_t token) {
  if (!matcher_.accept(token)) return Next::Refused;
  if (matcher_.is_terminated()) return Next::Complete;
  matcher_.fill_next_mask(mask_.data());
  return matcher_.only_stop_allowed(mask_.data()) ? Next::Complete : Next::Continue;
}

void collect_grammar_masks(const SchedulePlan& plan, const std::vector<int32_t>& logit_rows,
                           LogitMasks& masks,
                           const std::function<const RequestGrammar*(const Sequence*)>& grammar_of) {
  masks.clear();
  int32_t row = 0;
  for (size_t i = 0; i < plan.items.size(); ++i) {
    if (!plan.items[i].sample) continue;
    if (const RequestGrammar* g = grammar_of(plan.items[i].seq)) {
      SALA_CHECK(logit_rows[i] == 1, "a grammar's call with {} logit rows", logit_rows[i]);
      masks.words = g->words();
      masks.rows.push_back(row);
      masks.bits.insert(masks.bits.end(), g->mask(), g->mask() + g->words());
    }
    row += logit_rows[i];  // speculative calls have several (never with a grammar)
  }
}

}  // namespace sala
