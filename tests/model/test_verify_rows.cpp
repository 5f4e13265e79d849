// The model-level contract speculative decoding stands on (issue 21), CPU fp32 on the tiny
// golden models, compared bit for bit:
//   - a verify call (the last token plus k drafted tokens, one call of 1 + k rows) gives, row
//     for row, the logits of k + 1 decode calls;
//   - rolling back (the lightning state restored from a snapshot slot with
//     Backend::copy_state_slot, the sequence's length set back, the accepted rows computed
//     again) and decoding on gives the logits of a run that never saw the rejected tokens:
//     their K/V rows and the compressed keys they completed are rewritten before any query
//     can read them.
// The dense / sparse choice is made per call from its total length (SPEC §9.2), so each case
// stays on one side of dense_len: tiny-dense (no InfLLM-v2 rows) and tiny-sparse past its
// dense_len (256), where every verify row runs the sparse path.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "test_util.h"

namespace sala::test {
namespace {

struct Case {
  std::string dir;
  int32_t prompt;
};

std::vector<Case> cases() {
  return {{fixtures_dir() + "/golden/tiny-dense", 150}, {fixtures_dir() + "/golden/tiny-sparse", 300}};
}

// Logits [n, vocab] of one call: tokens[past, past + n) of `ids` on top of `past` cached ones.
std::vector<float> call(Model& m, const std::vector<int32_t>& ids, int64_t past, int32_t n,
                        int32_t slot) {
  StepMeta meta;
  meta.add_seq(ids.data() + past, n, past, slot, page_range(0, 64), true, false);
  std::vector<float> logits;
  m.forward(meta, logits);
  logits.resize(size_t(n) * size_t(m.config().vocab_size));
  return logits;
}

void append(std::vector<float>& to, const std::vector<float>& rows) {
  to.insert(to.end(), rows.begin(), rows.end());
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(VerifyRows, EqualDecodeSteps) {
  for (const Case& c : cases()) {
    auto m = load_tiny(c.dir, 512, 64, 2, NumericMode::F32);
    const int32_t k = 5;  // drafted tokens: a verify call of k + 1 rows
    const auto ids = random_tokens(c.prompt + k + 1, m->config().vocab_size, 21);
    call(*m, ids, 0, c.prompt, 0);
    std::vector<float> decode;
    for (int32_t i = 0; i <= k; ++i) append(decode, call(*m, ids, c.prompt + i, 1, 0));
    call(*m, ids, 0, c.prompt, 0);  // the same prompt again (a call from 0 starts afresh)
    const auto verify = call(*m, ids, c.prompt, k + 1, 0);
    EXPECT_TRUE(same_bits(verify, decode)) << c.dir << ": max rel diff "
                                           << max_rel_diff(verify, decode);
  }
}

TEST(VerifyRows, RollbackLeavesNoTrace) {
  for (const Case& c : cases()) {
    auto m = load_tiny(c.dir, 512, 64, 2, NumericMode::F32);
    const int32_t V = m->config().vocab_size;
    const int32_t k = 6, accepted = 2, after = 40;  // after: decode steps past the rollback
    // What the verify call saw (the prompt, the last token, k drafts) and what the sequence
    // really continues with after `accepted` drafts: other tokens from there on.
    const auto seen = random_tokens(c.prompt + 1 + k, V, 33);
    std::vector<int32_t> real(seen.begin(), seen.begin() + c.prompt + 1 + accepted);
    const auto tail = random_tokens(after + 1, V, 44);
    real.insert(real.end(), tail.begin() + 1, tail.end());
    ASSERT_NE(real[size_t(c.prompt + 1 + accepted)], seen[size_t(c.prompt + 1 + accepted)]);

    // Uninterrupted: the prompt, then one decode call per token.
    call(*m, real, 0, c.prompt, 0);
    std::vector<float> want;
    for (int64_t p = c.prompt; p < int64_t(real.size()); ++p) append(want, call(*m, real, p, 1, 0));

    // Speculative: snapshot, verify 1 + k rows, roll back, compute the accepted rows again,
    // decode on. Slot 1 holds the snapshot.
    call(*m, seen, 0, c.prompt, 0);
    m->backend().copy_state_slot(0, 1);
    const auto verify = call(*m, seen, c.prompt, 1 + k, 0);
    m->backend().copy_state_slot(1, 0);
    std::vector<float> got = call(*m, real, c.prompt, 1 + accepted, 0);
    EXPECT_TRUE(same_bits(got, std::vector<float>(verify.begin(), verify.begin() + (1 + accepted) * V)))
        << c.dir << ": the accepted rows computed again differ from their verify rows";
    for (int64_t p = c.prompt + 1 + accepted; p < int64_t(real.size()); ++p) append(got, call(*m, real, p, 1, 0));
    EXPECT_TRUE(same_bits(got, want)) << c.dir << ": max rel diff " << max_rel_diff(got, want);
  }
}

// Without the rollback of the lightning state the continuation differs: the test above can
// fail, and the snapshot is what makes it pass.
TEST(VerifyRows, WithoutStateRollbackTheContinuationDiffers) {
  const Case c = cases()[0];
  auto m = load_tiny(c.dir, 512, 64, 2, NumericMode::F32);
  const int32_t V = m->config().vocab_size, k = 4;
  const auto seen = random_tokens(c.prompt + 1 + k, V, 55);
  std::vector<int32_t> real(seen.begin(), seen.begin() + c.prompt + 1);
  const auto tail = random_tokens(9, V, 66);
  real.insert(real.end(), tail.begin() + 1, tail.end());
  call(*m, real, 0, c.prompt, 0);
  std::vector<float> want;
  for (int64_t p = c.prompt; p < int64_t(real.size()); ++p) append(want, call(*m, real, p, 1, 0));
  call(*m, seen, 0, c.prompt, 0);
  call(*m, seen, c.prompt, 1 + k, 0);  // no snapshot, no restore
  std::vector<float> got = call(*m, real, c.prompt, 1, 0);
  for (int64_t p = c.prompt + 1; p < int64_t(real.size()); ++p) append(got, call(*m, real, p, 1, 0));
  EXPECT_FALSE(same_bits(got, want));
  EXPECT_GT(max_rel_diff(got, want), 1e-4);
}

// Rollback without a recompute (Model::rollback_state): two sequences verify in one step that
// keeps its lightning rows; each rolls back to its own accepted rows, and the state advance
// (one batch for both) from the snapshots and the kept k, v rows leaves the state of the
// uninterrupted run: decoding on from the pending bonus token gives its logits bit for bit, in
// fp32 and in bf16 emulation. The state before the step is kept by a copy into the snapshot
// slot, or (snap) by Model::snapshot_state (the call writes its state out of place, the
// advance reads the snapshot); then sequence 1 accepts every draft (no rollback).
TEST(VerifyRows, RollbackByStateAdvanceLeavesNoTrace) {
  for (const bool snap : {false, true})
  for (NumericMode mode : {NumericMode::F32, NumericMode::BF16})
  for (const Case& c : cases()) {
    const ModelConfig cfg = load_model_config(c.dir);
    ModelLimits lim;
    lim.max_step_tokens = lim.max_logit_rows = 512;
    lim.keep_verify_rows = 16;
    lim.caches = {128, cfg.sparse.block_size, 4};  // slots 0, 1; their snapshots 2, 3
    Checkpoint ckpt(c.dir);
    Model m(cfg, make_backend("cpu", BackendOptions{mode, 0}), ckpt, lim);
    const int32_t V = cfg.vocab_size, k = 6, after = 12;
    const int32_t accepted[2] = {2, snap ? k : 0};
    std::vector<int32_t> seen[2], real[2];
    for (int s = 0; s < 2; ++s) {
      seen[s] = random_tokens(c.prompt + 1 + k, V, 70 + uint32_t(s));
      real[s].assign(seen[s].begin(), seen[s].begin() + c.prompt + 1 + accepted[s]);
      const auto tail = random_tokens(after + 1, V, 80 + uint32_t(s));
      real[s].insert(real[s].end(), tail.begin() + 1, tail.end());
    }
    auto decode = [&](int s, int64_t from) {  // one decode call per token of real[s] from `from`
      std::vector<float> out;
      for (int64_t p = from; p < int64_t(real[s].size()); ++p) {
        StepMeta meta;
        meta.add_seq(real[s].data() + p, 1, p, s, page_range(64 * s, 64), false, true);
        std::vector<float> logits;
        m.forward(meta, logits);
        append(out, logits);
      }
      return out;
    };
    auto prefill = [&](int s, const std::vector<int32_t>& ids) {
      StepMeta meta;
      meta.add_seq(ids.data(), c.prompt, 0, s, page_range(64 * s, 64), false, true);
      std::vector<float> logits;
      m.forward(meta, logits);
    };
    std::vector<float> want[2];
    for (int s = 0; s < 2; ++s) {
      prefill(s, real[s]);
      want[s] = decode(s, c.prompt);
      want[s].erase(want[s].begin(), want[s].begin() + int64_t(1 + accepted[s]) * V);
    }
    StepMeta verify;
    for (int s = 0; s < 2; ++s) {
      prefill(s, seen[s]);
      if (snap)
        m.snapshot_state(s, s + 2);
      else
        m.copy_state_slot(s, s + 2);
      verify.add_seq(seen[s].data() + c.prompt, 1 + k, c.prompt, s, page_range(64 * s, 64), true,
                     false);
    }
    verify.keep_lightning_rows = true;
    std::vector<float> logits;
    m.forward(verify, logits);
    for (int s = 0; s < 2; ++s)
      if (accepted[s] < k) {
        ASSERT_TRUE(m.rollback_state(s, s + 2, 1 + accepted[s]));
      }
    EXPECT_FALSE(m.rollback_state(0, 2, 1)) << "one rollback per call";
    for (int s = 0; s < 2; ++s) {
      const auto got = decode(s, c.prompt + 1 + accepted[s]);
      EXPECT_TRUE(same_bits(got, want[s]))
          << c.dir << (mode == NumericMode::F32 ? " fp32" : " bf16")
          << (snap ? " snapshot_state" : " copy") << ", sequence " << s
          << ": max rel diff " << max_rel_diff(got, want[s]);
    }
    // A step that did not keep its rows (no flag, or more rows than keep_verify_rows) refuses.
    verify.keep_lightning_rows = false;
    prefill(0, seen[0]);
    m.forward(verify, logits);
    EXPECT_FALSE(m.rollback_state(0, 2, 1));
  }
}

// snapshot_state takes two distinct slots of the model's; the first step with a call on the
// slot takes the snapshot, and that call must be 1..63 rows after a prefix (a state to keep).
TEST(VerifyRows, SnapshotStateChecksItsCall) {
  auto m = load_tiny(cases()[0].dir, 512, 64, 2, NumericMode::F32);
  const auto ids = random_tokens(80, m->config().vocab_size, 5);
  EXPECT_DEATH(m->snapshot_state(0, 2), "snapshot of state slot 0 into 2 of 2");
  EXPECT_DEATH(m->snapshot_state(1, 1), "snapshot of state slot 1 into 1 of 2");
  // Slot 0 before: after 8 tokens. A step without slot 0 leaves the snapshot pending; the next
  // call on slot 0 writes slot 0 and leaves slot 1 with the state it read.
  call(*m, ids, 0, 8, 0);
  const auto next = call(*m, ids, 8, 3, 0);  // logits of 8..10, state after 11 tokens
  call(*m, ids, 0, 8, 0);
  m->snapshot_state(0, 1);
  call(*m, ids, 0, 5, 1);  // slot 1 only, then the snapshot (its KV rows: slot 0's, same tokens)
  EXPECT_TRUE(same_bits(call(*m, ids, 8, 3, 0), next));
  m->copy_state_slot(1, 0);  // the snapshot: the state after 8 tokens
  EXPECT_TRUE(same_bits(call(*m, ids, 8, 3, 0), next));
  m->snapshot_state(0, 1);
  EXPECT_DEATH(call(*m, ids, 0, 4, 0), "snapshot of state slot 0: its call has 4 rows after 0");
  EXPECT_DEATH(call(*m, ids, 4, 64, 0), "snapshot of state slot 0: its call has 64 rows after 4");
}

TEST(VerifyRows, CopyStateSlotChecksItsSlots) {
  auto m = load_tiny(cases()[0].dir, 64, 4, 2, NumericMode::F32);
  EXPECT_DEATH(m->backend().copy_state_slot(0, 2), "state slots 0 -> 2 of 2");
}

}  // namespace
}  // namespace sala::test
