// `sala bench offline --decode-grammar json|SCHEMA.json`: the decode rows run again with every
// sequence constrained by a grammar, as the engine runs a structured-output request: per step
// the sequences' token masks go into LogitMasks, Model::forward applies them on the device
// (Backend::mask_logits) before the device argmax (greedy under the mask, so every step's token
// is one the grammar allows and advances its matcher), then each token advances its sequence's
// matcher (xgrammar), which fills the next mask. Issue 19: this step's cost over the plain
// decode step (same batch, prompts and positions, measured the same way just before) <= 1.05
// at batch 8 on the GPU.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "grammar/grammar.h"
#include "model/minicpm_sala.h"

namespace sala::cli {

class DecodeGrammar {
 public:
  // what: "json" (any JSON object) or the path of a JSON-schema file. tokenizer_dir: the
  // vocabulary the grammar sees (the model directory's tokenizer unless given). A tokenizer
  // with fewer than half the model's vocab_size ids (a random checkpoint made by `sala
  // make-random`, which writes no tokenizer, read with the tiny model's 792 tokens) is
  // widened to vocab_size with synthetic tokens: the byte strings of pairs of its tokens, so
  // that the matcher's mask work per step is that of a full-width BPE vocabulary, not of 792
  // tokens with every other id masked out.
  DecodeGrammar(const std::string& what, const std::string& tokenizer_dir, const ModelConfig& cfg);
  ~DecodeGrammar();

  const std::string& label() const { return label_; }
  const std::string& vocabulary() const { return vocab_note_; }

  struct Run {
    std::vector<double> step_ms;       // per timed step: masks + forward + matcher advances
    int64_t completed = 0;             // outputs the grammar completed (then restarted)
    std::vector<std::string> outputs;  // the first completed outputs (text as the grammar sees it)
    std::string unfinished;            // sequence 0's output in progress at the end
  };
  // B sequences (state slot b, pages pages_of(b)) prefilled with prompt_len ids (BOS, then
  // prompt[b + 1, b + prompt_len): prompt holds prompt_len + B - 1 ids or more; untimed, the
  // first token masked too), then `steps` timed greedy-under-mask decode steps at
  // positions prompt_len, prompt_len + 1, ... A sequence whose output the grammar completes
  // starts a new one with a fresh matcher (outside the timed part: a new request's matcher is
  // made on the HTTP thread).
  // constrained false: the same run without masks and matchers.
  Run run(Model& model, int B, int steps, const std::vector<int32_t>& prompt, int64_t prompt_len,
          const std::function<std::vector<int32_t>(int)>& pages_of, bool constrained) const;

  // run() plain, then constrained (the baseline measured the same way right before: the bench's
  // own decode row ran first and colder); the median steps.
  struct Comparison {
    double plain_ms = 0, grammar_ms = 0;
    Run constrained;
  };
  Comparison compare(Model& model, int B, int steps, const std::vector<int32_t>& prompt, int64_t prompt_len,
                     const std::function<std::vector<int32_t>(int)>& pages_of) const;

 private:
  std::unique_ptr<grammar::GrammarCompiler> compiler_;
  std::shared_ptr<const grammar::CompiledGrammar> compiled_;
  std::vector<std::string> bytes_;  // per id: what it adds to the output
  std::string label_, vocab_note_;
};

}  // namespace sala::cli
