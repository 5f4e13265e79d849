#include "engine/request_grammar.h"

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

void collect_grammar_masks(const SchedulePlan& plan, LogitMasks& masks,
                           const std::function<const RequestGrammar*(const Sequence*)>& grammar_of) {
  masks.clear();
  int32_t row = 0;
  for (const ScheduledSeq& it : plan.items) {
    if (!it.sample) continue;
    if (const RequestGrammar* g = grammar_of(it.seq)) {
      masks.words = g->words();
      masks.rows.push_back(row);
      masks.bits.insert(masks.bits.end(), g->mask(), g->mask() + g->words());
    }
    // A speculative verify call has a logit row per drafted token too (never with a grammar).
    row += 1 + it.seq->spec.drafts;
  }
}

}  // namespace sala
