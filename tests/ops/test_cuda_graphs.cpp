// Recorded (CUDA graph) decode steps of a golden case's tiny model against direct launches
// (part of the test_cuda_ops binary; harness: cuda_test_util.h). Without a GPU the tests
// GTEST_SKIP; with SALA_REQUIRE_GPU=1 that is a failure.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/config.h"
#include "core/safetensors.h"
#include "cuda_test_util.h"
#include "model/minicpm_sala.h"
#include "backend/step.h"

namespace sala::test {
namespace {

// Recorded (CUDA graph) decode steps against direct launches: the same model twice, one
// backend with graphs and one without, driven through the same schedule of steps in which
// sequences join (prefill), decode in batches of 1..7 (padded to buckets 1/2/4/8) and finish.
// Every step's logits must be equal bit for bit.
// Recorded decode steps == eager steps, with joins and mid-batch finishes, on a golden
// case's model; every prompt is len_offset tokens longer than in the base schedule. kv: both
// backends' KV cache dtype (FP8: the recorded steps read and write codes too).
// int4_group > 0: both models with W4A16 projections (RTN at load): a recorded step pads its
// rows to the bucket, so this also holds the int4 GEMV to row invariance. fp8: both with W8A8
// FP8 projections, the codes written by the norm / SiLU kernels (the `next` hint) in both
// (kFp8) or in the recorded model only, the eager one quantizing in a kernel of its own
// (kFp8EagerSeparate: the fused codes equal the separate quantization's, recorded or not).
enum class Fp8 { kOff, kFp8, kFp8EagerSeparate };
void graph_replay_vs_eager(const std::string& case_name, int len_offset,
                           KvCacheDtype kv = KvCacheDtype::Auto, int32_t int4_group = 0,
                           Fp8 fp8 = Fp8::kOff) {
  // The vendored cases; scripts/gpu_check.sh points SALA_GOLDEN_DIR at its packed copy.
  const char* gd = std::getenv("SALA_GOLDEN_DIR");
  const std::string root = gd ? gd : SALA_SOURCE_DIR "/tests/fixtures/golden";
  const std::string dir = root + "/" + case_name;
  ASSERT_TRUE(std::filesystem::exists(dir + "/config.json")) << "no " << dir;
  const ModelConfig cfg = load_model_config(dir);
  Checkpoint ck(dir);
  ModelLimits lim;
  lim.max_step_tokens = 1024;
  lim.max_logit_rows = 64;
  lim.caches.page_size = cfg.sparse.block_size;
  const int pps = int((400 + lim.caches.page_size - 1) / lim.caches.page_size), nslots = 8;
  lim.caches.num_pages = pps * nslots;
  lim.caches.num_slots = nslots;
  BackendOptions og{NumericMode::BF16, 0, true}, oe{NumericMode::BF16, 0, false};
  og.kv_cache_dtype = oe.kv_cache_dtype = kv;
  og.int4_group_size = oe.int4_group_size = int4_group;
  og.fp8_weights = oe.fp8_weights = fp8 != Fp8::kOff;
  oe.fp8_producer_codes = fp8 != Fp8::kFp8EagerSeparate;
  Model mg(cfg, make_cuda_backend(og), ck, lim), me(cfg, make_cuda_backend(oe), ck, lim);
  ASSERT_TRUE(mg.backend().graphs_enabled());
  ASSERT_FALSE(me.backend().graphs_enabled());
  struct Live {
    int slot;
    int64_t len;
    int32_t next;
  };
  std::vector<Live> live;
  std::vector<int> free_slots;
  for (int i = nslots - 1; i >= 0; --i) free_slots.push_back(i);
  auto pages = [&](int slot) {
    std::vector<int32_t> p(static_cast<size_t>(pps));
    for (int i = 0; i < pps; ++i) p[size_t(i)] = slot * pps + i;
    return p;
  };
  // Per step: the number of sequences that join (with prompt lengths) or finish first.
  struct Ev {
    std::vector<int> join;  // prompt lengths
    int finish = 0;         // sequences that finish (taken from the middle of the batch)
  };
  std::vector<Ev> sched(48);
  sched[0].join = {17};
  sched[6].join = {5, 33};
  sched[12].join = {3};
  sched[16].finish = 1;
  sched[20].join = {9, 2, 70};
  sched[26].finish = 2;
  sched[30].join = {11};
  sched[34].finish = 3;
  sched[40].join = {4, 6, 8};
  sched[44].finish = 4;
  std::mt19937 rng(5);
  int64_t steps = 0, decode_steps = 0, mismatches = 0, compared = 0;
  std::vector<float> lg, le;
  for (Ev& ev : sched)
    for (int& n : ev.join) n += len_offset;
  for (const Ev& ev : sched) {
    for (int f = 0; f < ev.finish && !live.empty(); ++f) {
      const size_t at = live.size() / 2;
      free_slots.push_back(live[at].slot);
      live.erase(live.begin() + int64_t(at));
    }
    StepMeta m;
    std::vector<std::vector<int32_t>> prompts;
    for (int n : ev.join) {
      std::vector<int32_t> ids(static_cast<size_t>(n));
      for (auto& t : ids) t = int32_t(3 + rng() % uint32_t(cfg.vocab_size - 3));
      const int slot = free_slots.back();
      free_slots.pop_back();
      m.add_seq(ids.data(), n, 0, slot, pages(slot), false, true);
      live.push_back({slot, -int64_t(n), 0});  // len set after the step
    }
    const bool decode_only = ev.join.empty();
    for (const Live& l : live)
      if (l.len >= 0) m.add_seq(&l.next, 1, l.len, l.slot, pages(l.slot), false, true);
    ASSERT_GT(m.num_tokens(), 0);
    mg.forward(m, lg);
    me.forward(m, le);
    ++steps;
    decode_steps += decode_only;
    ASSERT_EQ(lg.size(), le.size());
    compared += int64_t(lg.size());
    if (std::memcmp(lg.data(), le.data(), lg.size() * 4) != 0) {
      ++mismatches;
      ADD_FAILURE() << "step " << steps << " (" << m.seqs.size() << " seqs, decode_only "
                    << decode_only << "): graph and eager logits differ";
    }
    // Advance: row order of m is joins first, then the running sequences.
    const int64_t V = cfg.vocab_size;
    size_t row = 0;
    std::vector<Live> order;
    for (Live& l : live)
      if (l.len < 0) order.push_back(l);
    for (Live& l : live)
      if (l.len >= 0) order.push_back(l);
    for (Live& l : order) {
      const float* r = lg.data() + row * size_t(V);
      l.next = int32_t(std::max_element(r, r + V) - r);
      l.len = l.len < 0 ? -l.len : l.len + 1;
      ++row;
    }
    live = order;
  }
  std::printf(
      "[ graph ] %s %s%s%s: %lld steps (%lld decode-only), %lld logits compared, %lld steps "
      "differ\n",
      case_name.c_str(), kv_cache_dtype_name(kv), int4_group > 0 ? " w4a16" : "",
      fp8 == Fp8::kOff ? "" : fp8 == Fp8::kFp8 ? " fp8" : " fp8 (eager: separate quantize)",
      (long long)steps, (long long)decode_steps, (long long)compared,
      (long long)mismatches);
  EXPECT_EQ(mismatches, 0);
}

TEST(CudaOps, GraphReplayMatchesEager) {
  REQUIRE_GPU();
  graph_replay_vs_eager("tiny-dense", 0);  // dense_len 8192: every row dense
}

TEST(CudaOps, GraphReplayMatchesEagerW4) {
  REQUIRE_GPU();
  graph_replay_vs_eager("tiny-dense", 0, KvCacheDtype::Auto, 128);  // W4A16 projections, group 128
}

TEST(CudaOps, GraphReplayMatchesEagerSparse) {
  REQUIRE_GPU();
  // tiny-sparse (dense_len 256): prompts of 242..310 tokens, so decode steps mix dense rows,
  // rows crossing 256 and InfLLM-v2 rows (their own recordings, selection kernels inside).
  graph_replay_vs_eager("tiny-sparse", 240);
}

// FP8 projections (issue 17): recorded steps with the codes written by the norm / SiLU
// kernels == eager steps, with those codes and with the separate quantize kernel.
TEST(CudaOps, GraphReplayMatchesEagerFp8) {
  REQUIRE_GPU();
  for (Fp8 f : {Fp8::kFp8, Fp8::kFp8EagerSeparate}) {
    graph_replay_vs_eager("tiny-dense", 0, KvCacheDtype::Auto, 0, f);
    graph_replay_vs_eager("tiny-sparse", 240, KvCacheDtype::Auto, 0, f);
  }
}

// The same over FP8 KV caches (issue 17): both formats, dense and InfLLM-v2 decode rows.
TEST(CudaOps, GraphReplayMatchesEagerKvFp8) {
  REQUIRE_GPU();
  for (KvCacheDtype kv : {KvCacheDtype::FP8_E4M3, KvCacheDtype::FP8_E5M2}) {
    graph_replay_vs_eager("tiny-dense", 0, kv);
    graph_replay_vs_eager("tiny-sparse", 240, kv);
  }
}

}  // namespace
}  // namespace sala::test
