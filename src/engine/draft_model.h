// The draft model of STANDALONE speculation (issue 21; SGLang's --speculative-algorithm
// STANDALONE --speculative-draft-model-path DIR): a second SALA checkpoint with the target's
// tokenizer, run by its own Model (its own backend instance of the same kind, weights,
// workspaces) with its own KV pages (BlockPool) and lightning-state slots (StatePool), sized
// by plan_draft_limits. The engine thread drives it through the Drafter interface
// (speculative.h); nothing here is thread-safe.
//
// Per sequence the draft model keeps `computed`: the sequence's first `computed` tokens are
// in its caches, exactly as if it had been fed them alone (the same prompt, the same kept
// tokens). Lockstep with the target:
//  * planned(): every row the target computes this step for an eligible sequence that is not a
//    verify call (prefill chunks, recomputes after preemption or rollback, plain decode rows)
//    is fed to the draft model in the same step, so a prompt is prefilled chunk for chunk and
//    a draft step needs only the rows since (at most 1 + k).
//  * propose(): a drafting sequence of L tokens (token L - 1 pending) is fed tokens[computed,
//    L) in one batched call (every drafting sequence together, one logit row each); its state
//    after L tokens is kept in its snapshot slot (Model::snapshot_state: the next call writes
//    its state elsewhere); draft 1 comes from that row, and drafts 2..k
//    from k - 1 more batched one-row calls fed the previous draft. Greedy requests take the
//    argmax; sampled ones draw from the request's own temperature / top-k / top-p / min-p
//    applied to the draft row (Sampler::sample_proposal), keeping that distribution q
//    [k, vocab] for the target's rejection sampling (proposal()).
//  * settle(): of the k drafts, k - 1 were fed. If the target kept all of them (accepted >=
//    k - 1) they are computed tokens; otherwise the draft state goes back to its snapshot
//    (after L tokens) and `computed` to L: the accepted drafts and the bonus token are fed
//    again in the next step, and the K/V rows and compressed keys the rejected drafts wrote are
//    rewritten before any query reads them (the target's rollback rule, speculative.h). A
//    verify call that was not planned (the step's budget) settles with none accepted: the
//    draft model then holds the still-pending token L - 1 (computed == L) and keeps its row
//    (last_row), from which the next draft step starts.
//  * A preempted sequence drops its draft state (pages, slot) with its target state and is
//    prefilled again with the target's recompute; a finished or aborted one frees it.
// The draft model's numbers never decide the output (the target verifies every draft): they
// only set how many drafts are accepted.
#pragma once
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "backend/step.h"
#include "engine/block_pool.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "engine/state_pool.h"
#include "model/minicpm_sala.h"

namespace sala {

class DraftModelDrafter final : public Drafter {
 public:
  // model: the draft checkpoint, its limits from plan_draft_limits (half of its state slots
  // are snapshots). dense_as_sparse: the target's flag, used for the draft's calls too.
  DraftModelDrafter(std::unique_ptr<Model> model, bool dense_as_sparse);

  void propose(const std::vector<DraftAsk>& asks, std::vector<std::vector<int32_t>>& out) override;
  const float* proposal(const Sequence& s) const override;
  void planned(const SchedulePlan& plan, const DraftPolicyFn& policy) override;
  void settle(const Sequence& s, int32_t drafted, int32_t accepted, bool verified) override;
  void release(const Sequence& s) override;
  int64_t rollbacks() const override { return rollbacks_; }
  std::pair<int64_t, int64_t> usage() const override { return {blocks_.used(), states_.used()}; }

  // Tests: tokens of s in the draft caches (-1: none held), and pages / slots in use.
  int64_t computed(const Sequence& s) const;
  int32_t pages_used() const { return blocks_.used(); }
  int32_t slots_used() const { return states_.used(); }

 private:
  struct Seq {
    std::vector<int32_t> pages;  // draft KV pages, position order
    int32_t slot = -1;           // draft state slot; its snapshot is slot + snapshot_offset_
    int64_t computed = 0;
    int64_t base = 0;     // while drafts are out: L, the tokens before them (the snapshot's)
    int32_t drafted = 0;  // drafts out (0: none)
    bool sampled = false;      // q kept for rejection sampling
    SamplerState rng;          // the proposals' random stream (sampled requests)
    std::vector<float> q;      // [drafted, vocab] proposal distributions
    // The draft model's row at the pending token of the last draft step (its logits [vocab]
    // for sampled requests, its argmax for greedy ones), at sequence length last_len. When a
    // verify call was not planned, the pending token stays pending for the target but is
    // computed here (computed == L): the next draft step starts from this row.
    int64_t last_len = -1;
    int32_t last_argmax = -1;
    std::vector<float> last_row;
  };
  // s's draft state, created (a free slot, nothing computed) if it has none; null when the
  // draft pool has no slot left (s then neither drafts nor is mirrored).
  Seq* acquire(const Sequence& s, const DraftPolicy& pol);
  // One forward of meta_; logits of its logit rows into logits_ (or argmax_ if greedy_only).
  void forward(bool greedy_only);
  // Draft j of d from `row` [vocab] (sampled: its q row j) or, greedy, the argmax `am`.
  int32_t pick(float* row, int32_t am, const DraftPolicy& pol, Seq& d, int32_t j);

  std::unique_ptr<Model> model_;
  bool dense_as_sparse_;
  int32_t vocab_;
  BlockPool blocks_;
  StatePool states_;
  int32_t snapshot_offset_;
  std::unordered_map<uint64_t, Seq> seqs_;  // by Sequence::id
  Sampler sampler_;
  StepMeta meta_;
  std::vector<float> logits_;
  std::vector<float> scratch_;  // a kept row, copied for sampling
  std::vector<int32_t> argmax_;
  struct Job {
    size_t ask;  // index into propose()'s asks / out
    Seq* d;
    int32_t row;  // its logit row in the current call; -1: none (call 1: last_row reused)
  };
  std::vector<Job> jobs_;                      // propose(): the sequences drafting
  std::vector<std::pair<Seq*, int64_t>> fed_;  // planned(): rows fed per sequence
  int64_t rollbacks_ = 0;
};

// The engine's drafter for `opts`: a DraftModelDrafter around `draft` for STANDALONE
// (opts.draft_model; its vocabulary must be the target's), else null (the Speculator's n-gram
// default). sala::Error if a draft model is given without STANDALONE or the other way round.
std::unique_ptr<Drafter> make_drafter(const SpeculativeOptions& opts, std::unique_ptr<Model> draft,
                                      const ModelConfig& target, bool dense_as_sparse);

}  // namespace sala
