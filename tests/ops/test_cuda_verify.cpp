// Speculative decoding's contract on the CUDA backend (bf16; RowsEqualDecodeSteps also with
// FP8 and W4A16 weights), on the tiny golden models,
// bit for bit (the CPU version: tests/model/test_verify_rows.cpp):
//   - a verify call (the last token plus k drafts, 1 + k rows with every row's logits) gives,
//     row for row, the logits of k + 1 decode calls: the skinny GEMVs are row-invariant,
//     rows of calls of <= kSplitCallRows rows split their attention keys and selection
//     entries as decode rows do (DevSeq::split_row), and the lightning recurrence runs row by
//     row;
//   - the same when several sequences verify in one step of <= kSplitCallRows rows (each
//     equals its call alone); in wider steps a call's rows depend only on the call;
//   - rolling back (the lightning state restored from a snapshot slot with
//     CudaBackend::copy_state_slot, the length set back, the accepted rows computed again)
//     and decoding on gives the logits of a run that never saw the rejected tokens.
// Decode and verify calls run as they do in the engine: recorded CUDA graphs where the step
// qualifies (Model::graph_step), each verify layout directly, then recorded, then replayed.
// tiny-dense stays below dense_len; tiny-sparse starts past its dense_len (256), so its verify
// rows run InfLLM-v2 selection and stage-2 attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "core/config.h"
#include "core/safetensors.h"
#include "cuda_test_util.h"
#include "model/minicpm_sala.h"

namespace sala::test {
namespace {

struct Case {
  std::string dir;
  int32_t prompt;
};

std::vector<Case> cases() {
  // The vendored cases; scripts/gpu_check.sh points SALA_GOLDEN_DIR at its copy (as the graph
  // tests read it), so a packed binary finds them wherever the checkout is.
  const char* gd = std::getenv("SALA_GOLDEN_DIR");
  const std::string g = gd ? gd : std::string(SALA_SOURCE_DIR) + "/tests/fixtures/golden";
  return {{g + "/tiny-dense", 150}, {g + "/tiny-sparse", 300}};
}

enum class Quant { None, Fp8, W4 };

std::unique_ptr<Model> load_cuda(const std::string& dir, int32_t slots, Quant q = Quant::None) {
  const ModelConfig cfg = load_model_config(dir);
  Checkpoint ckpt(dir);
  ModelLimits lim;
  lim.max_step_tokens = 512;
  lim.max_logit_rows = 64;
  lim.keep_verify_rows = 64;  // steps with StepMeta::keep_lightning_rows (rollback_state)
  lim.caches = {64 * slots, cfg.sparse.block_size, slots};
  BackendOptions bo{NumericMode::BF16, 0};
  bo.fp8_weights = q == Quant::Fp8;  // W8A8: the FP8 GEMV is row-invariant too
  bo.int4_group_size = q == Quant::W4 ? 128 : 0;  // W4A16: so is the int4 GEMV
  return std::make_unique<Model>(cfg, make_backend("cuda", bo), ckpt, lim);
}

std::vector<int32_t> tokens(int n, int vocab, uint32_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint32_t x = seed * 2654435761u + 1;
  for (auto& v : t) {
    x = x * 1664525u + 1013904223u;
    v = 3 + int32_t((x >> 8) % uint32_t(vocab - 12));
  }
  return t;
}

std::vector<int32_t> pages_of(int32_t slot) {
  std::vector<int32_t> p(64);
  for (int32_t i = 0; i < 64; ++i) p[size_t(i)] = slot * 64 + i;
  return p;
}

// One call per sequence in `calls` (ids, past, rows, slot, all); logits of every row of a
// verify call (all), of the last row otherwise: [rows or 1, vocab] per call, concatenated.
struct Call {
  const std::vector<int32_t>* ids;
  int64_t past;
  int32_t rows, slot;
  bool all = false;
};
std::vector<float> step(Model& m, const std::vector<Call>& calls, bool keep = false) {
  StepMeta meta;
  meta.keep_lightning_rows = keep;
  for (const Call& c : calls)
    meta.add_seq(c.ids->data() + c.past, c.rows, c.past, c.slot, pages_of(c.slot), c.all, !c.all);
  std::vector<float> logits;
  m.forward(meta, logits);
  return logits;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

size_t first_diff(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
  return std::min(a.size(), b.size());
}

TEST(CudaVerify, RowsEqualDecodeSteps) {
  REQUIRE_GPU();
  for (const Case& c : cases())
  for (Quant q : {Quant::None, Quant::Fp8, Quant::W4}) {
    auto m = load_cuda(c.dir, 4, q);
    const char* qn = q == Quant::Fp8 ? " fp8" : q == Quant::W4 ? " w4a16" : " bf16";
    const int V = m->config().vocab_size;
    for (int32_t k : {1, 4, 7, 15}) {
      const auto ids = tokens(c.prompt + k + 1, V, uint32_t(k));
      step(*m, {{&ids, 0, c.prompt, 0}});
      std::vector<float> decode;
      for (int32_t i = 0; i <= k; ++i) {
        const auto row = step(*m, {{&ids, c.prompt + i, 1, 0}});
        decode.insert(decode.end(), row.begin(), row.end());
      }
      // Three times: run directly, recorded as a CUDA graph, launched from the recording.
      for (int rep = 0; rep < 3; ++rep) {
        step(*m, {{&ids, 0, c.prompt, 0}});  // a call from 0 starts afresh
        const auto verify = step(*m, {{&ids, c.prompt, k + 1, 0, true}});
        EXPECT_TRUE(same_bits(verify, decode))
            << c.dir << qn << " k=" << k << " run " << rep
            << ": first difference in row " << first_diff(verify, decode) / size_t(V);
      }
    }
  }
}

// Three sequences verify in one step (rows 1 + 4, 1 + 2, 1 + 6): each equals its call alone.
TEST(CudaVerify, BatchedVerifyEqualsAlone) {
  REQUIRE_GPU();
  for (const Case& c : cases()) {
    auto m = load_cuda(c.dir, 4);
    const int V = m->config().vocab_size;
    const int32_t ks[3] = {4, 2, 6};
    std::vector<std::vector<int32_t>> ids;
    for (int s = 0; s < 3; ++s) ids.push_back(tokens(c.prompt + s + 8, V, 100 + uint32_t(s)));
    std::vector<float> alone;
    for (int s = 0; s < 3; ++s) {
      step(*m, {{&ids[size_t(s)], 0, c.prompt + s, s}});
      const auto v = step(*m, {{&ids[size_t(s)], c.prompt + s, ks[s] + 1, s, true}});
      alone.insert(alone.end(), v.begin(), v.end());
    }
    std::vector<Call> calls;
    for (int s = 0; s < 3; ++s) {
      step(*m, {{&ids[size_t(s)], 0, c.prompt + s, s}});
      calls.push_back({&ids[size_t(s)], c.prompt + s, ks[s] + 1, s, true});
    }
    const auto batched = step(*m, calls);
    EXPECT_TRUE(same_bits(batched, alone))
        << c.dir << ": first difference in row " << first_diff(batched, alone) / size_t(V);
  }
}

TEST(CudaVerify, RollbackLeavesNoTrace) {
  REQUIRE_GPU();
  for (const Case& c : cases()) {
    auto m = load_cuda(c.dir, 2);
    const int V = m->config().vocab_size;
    const int32_t k = 6, accepted = 2, after = 24;
    const auto seen = tokens(c.prompt + 1 + k, V, 33);
    std::vector<int32_t> real(seen.begin(), seen.begin() + c.prompt + 1 + accepted);
    const auto tail = tokens(after + 1, V, 44);
    real.insert(real.end(), tail.begin() + 1, tail.end());
    ASSERT_NE(real[size_t(c.prompt + 1 + accepted)], seen[size_t(c.prompt + 1 + accepted)]);

    step(*m, {{&real, 0, c.prompt, 0}});
    std::vector<float> want;
    for (int64_t p = c.prompt; p < int64_t(real.size()); ++p) {
      const auto row = step(*m, {{&real, p, 1, 0}});
      want.insert(want.end(), row.begin(), row.end());
    }
    step(*m, {{&seen, 0, c.prompt, 0}});
    m->backend().copy_state_slot(0, 1);
    const auto verify = step(*m, {{&seen, c.prompt, 1 + k, 0, true}});
    m->backend().copy_state_slot(1, 0);
    std::vector<float> got = step(*m, {{&real, c.prompt, 1 + accepted, 0, true}});
    EXPECT_TRUE(same_bits(got, std::vector<float>(verify.begin(), verify.begin() + (1 + accepted) * V)))
        << c.dir << ": the accepted rows computed again differ from their verify rows";
    for (int64_t p = c.prompt + 1 + accepted; p < int64_t(real.size()); ++p) {
      const auto row = step(*m, {{&real, p, 1, 0}});
      got.insert(got.end(), row.begin(), row.end());
    }
    EXPECT_TRUE(same_bits(got, want)) << c.dir << ": first difference in row "
                                      << first_diff(got, want) / size_t(V);
  }
}

// Rollback without a recompute (Model::rollback_state): two sequences verify in one step that
// keeps its lightning rows (directly, recorded, then replayed: three rounds), each rolls back
// to its own accepted rows, one batched state advance (the recurrent kernel over the kept k, v
// rows) restores their states, and decoding on from the pending bonus token gives the logits
// of the uninterrupted run bit for bit. The state before the step is kept by a copy into the
// snapshot slot, or (snap) by Model::snapshot_state, where the verify call writes its state
// out of place and the advance reads the snapshot: then sequence 1 accepts every draft (no
// rollback: its state is the call's own).
TEST(CudaVerify, RollbackByStateAdvanceLeavesNoTrace) {
  REQUIRE_GPU();
  for (const bool snap : {false, true})
  for (const Case& c : cases()) {
    auto m = load_cuda(c.dir, 4);  // slots 0, 1; their snapshots 2, 3
    const int V = m->config().vocab_size;
    const int32_t k = 6, after = 12;
    const int32_t accepted[2] = {3, snap ? k : 0};
    std::vector<int32_t> seen[2], real[2];
    for (int s = 0; s < 2; ++s) {
      seen[s] = tokens(c.prompt + 1 + k, V, 70 + uint32_t(s));
      real[s].assign(seen[s].begin(), seen[s].begin() + c.prompt + 1 + accepted[s]);
      const auto tail = tokens(after + 1, V, 80 + uint32_t(s));
      real[s].insert(real[s].end(), tail.begin() + 1, tail.end());
    }
    auto decode = [&](int s, int64_t from) {
      std::vector<float> out;
      for (int64_t p = from; p < int64_t(real[s].size()); ++p) {
        const auto row = step(*m, {{&real[s], p, 1, s}});
        out.insert(out.end(), row.begin(), row.end());
      }
      return out;
    };
    std::vector<float> want[2];
    for (int s = 0; s < 2; ++s) {
      step(*m, {{&real[s], 0, c.prompt, s}});
      want[s] = decode(s, c.prompt);
      want[s].erase(want[s].begin(), want[s].begin() + int64_t(1 + accepted[s]) * V);
    }
    for (int rep = 0; rep < 3; ++rep) {
      std::vector<Call> calls;
      for (int s = 0; s < 2; ++s) {
        step(*m, {{&seen[s], 0, c.prompt, s}});
        if (snap)
          m->snapshot_state(s, s + 2);
        else
          m->copy_state_slot(s, s + 2);
        calls.push_back({&seen[s], c.prompt, 1 + k, s, true});
      }
      step(*m, calls, true);
      for (int s = 0; s < 2; ++s)
        if (accepted[s] < k) {
          ASSERT_TRUE(m->rollback_state(s, s + 2, 1 + accepted[s]));
        }
      for (int s = 0; s < 2; ++s) {
        const auto got = decode(s, c.prompt + 1 + accepted[s]);
        EXPECT_TRUE(same_bits(got, want[s]))
            << c.dir << (snap ? " snapshot_state" : " copy") << " run " << rep << ", sequence "
            << s << ": first difference in row "
            << first_diff(got, want[s]) / size_t(V);
      }
    }
  }
}

// Wide speculative steps (more than kSplitCallRows rows, no prompt chunk: StepDev::shared_tiles,
// and on Hopper the skinny GEMM) are not held to decode-row bits: there a call's rows share
// their attention tiles. A call's rows still depend only on the call: equal, bit for bit, in
// two wide steps with other companions at other places, directly, recorded and replayed; and
// they stay close to the decode rows at the same positions (same argmax on most rows).
TEST(CudaVerify, WideStepRowsIndependentOfCompanions) {
  REQUIRE_GPU();
  for (const Case& c : cases()) {
    auto m = load_cuda(c.dir, 8);
    const int V = m->config().vocab_size;
    const int32_t rows[8] = {5, 5, 5, 5, 7, 3, 6, 5};  // calls 0-3 (20 rows), 4, 0, 5, 6 (21)
    std::vector<std::vector<int32_t>> ids;
    for (int s = 0; s < 8; ++s) ids.push_back(tokens(c.prompt + s + rows[s], V, 300 + uint32_t(s)));
    auto past = [&](int s) { return int64_t(c.prompt + s); };
    std::vector<float> decode;  // sequence 0's rows as decode steps
    step(*m, {{&ids[0], 0, int32_t(past(0)), 0}});
    for (int32_t i = 0; i < rows[0]; ++i) {
      const auto row = step(*m, {{&ids[0], past(0) + i, 1, 0}});
      decode.insert(decode.end(), row.begin(), row.end());
    }
    // Sequence 0's rows of a verify step of `order`'s calls (each prefilled afresh first).
    auto wide = [&](std::initializer_list<int> order) {
      std::vector<Call> calls;
      int64_t before = 0, total = 0;
      for (int s : order) {
        step(*m, {{&ids[size_t(s)], 0, int32_t(past(s)), s}});
        calls.push_back({&ids[size_t(s)], past(s), rows[s], s, true});
        if (s == 0) before = total;
        total += rows[s];
      }
      EXPECT_GT(total, 16) << "not a wide step";
      const auto all = step(*m, calls);
      return std::vector<float>(all.begin() + before * V, all.begin() + (before + rows[0]) * V);
    };
    for (int rep = 0; rep < 3; ++rep) {
      const auto a = wide({0, 1, 2, 3}), b = wide({4, 0, 5, 6});
      EXPECT_TRUE(same_bits(a, b)) << c.dir << " run " << rep << ": first difference in row "
                                   << first_diff(a, b) / size_t(V);
      double num = 0, den = 0;
      int same_top = 0;
      for (int r = 0; r < rows[0]; ++r) {
        const float* x = a.data() + size_t(r) * V;
        const float* y = decode.data() + size_t(r) * V;
        for (int v = 0; v < V; ++v) {
          num += double(x[v] - y[v]) * (x[v] - y[v]);
          den += double(y[v]) * y[v];
        }
        same_top += std::max_element(x, x + V) - x == std::max_element(y, y + V) - y;
      }
      EXPECT_LT(std::sqrt(num / den), 2e-2) << c.dir << ": wide-step rows vs decode rows";
      EXPECT_GE(same_top, rows[0] - 1) << c.dir << ": argmax of the wide-step rows";
    }
  }
}

}  // namespace
}  // namespace sala::test
