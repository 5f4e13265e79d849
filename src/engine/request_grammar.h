// A request's structured-output state (src/grammar's matcher and its next-token mask). Built
// on the HTTP thread by Engine::submit (the first mask is filled there), then owned and used by
// the engine thread only: the step copies mask() into the forward's LogitMasks, and each
// sampled token advances the matcher, which fills the next mask at once.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/token_mask.h"
#include "engine/scheduler.h"
#include "grammar/grammar.h"

namespace sala {

class RequestGrammar {
 public:
  explicit RequestGrammar(std::shared_ptr<const grammar::CompiledGrammar> compiled);

  const uint32_t* mask() const { return mask_.data(); }
  int32_t words() const { return int32_t(mask_.size()); }
  int32_t vocab_size() const { return matcher_.vocab_size(); }

  enum class Next {
    Continue,  // the output may go on: mask() holds the allowed next tokens
    Complete,  // the output is a complete sentence and nothing but a stop token may follow
    Refused,   // the token is not allowed (only possible if the mask was not applied)
  };
  // Advances by a sampled token (a stop token ends the grammar too: Complete).
  Next accept(int32_t token);

 private:
  grammar::GrammarMatcher matcher_;
  std::vector<uint32_t> mask_;
};

// The step's grammar masks: one per sampled logit row whose request has a grammar (logit rows
// are numbered as the logits come out: the items in plan order, logit_rows[i] for item i).
void collect_grammar_masks(const SchedulePlan& plan, const std::vector<int32_t>& logit_rows,
                           LogitMasks& masks,
                           const std::function<const RequestGrammar*(const Sequence*)>& grammar_of);

}  // namespace sala
