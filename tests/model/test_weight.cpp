// The Weight abstraction: byte accounting (what memory planning and the benchmarks' floors
// read), row slices of stacked weights, and that load_weights allocates what
// planned_weight_bytes promised.
#include <gtest/gtest.h>

#include <set>

#include "backend/backend.h"
#include "core/safetensors.h"
#include "model/weights.h"

namespace sala {
namespace {

const std::string kTinyChat = std::string(SALA_SOURCE_DIR) + "/models/sala-tiny-chat";

TEST(Weight, StorageBytesCountDataAndScales) {
  EXPECT_EQ(Weight::storage_bytes(WeightFormat::BF16, 6, 10), 6u * 10 * 2);
  EXPECT_EQ(Weight::storage_bytes(WeightFormat::F32, 6, 10), 6u * 10 * 4);
  // One fp32 scale per started group of 4 columns: 3 per row.
  EXPECT_EQ(Weight::storage_bytes(WeightFormat::BF16, 6, 10, 4), 6u * 10 * 2 + 6u * 3 * 4);
}

TEST(Weight, SliceRowsPointsAtTheRowsAndTheirScales) {
  std::vector<uint16_t> data(6 * 10);
  std::vector<float> scales(6 * 3);
  Weight w{data.data(), WeightFormat::BF16, 6, 10, scales.data(), 4};
  const Weight s = w.slice_rows(2, 3);
  EXPECT_EQ(s.data, static_cast<void*>(data.data() + 2 * 10));
  EXPECT_EQ(s.scales, scales.data() + 2 * 3);
  EXPECT_EQ(s.rows, 3);
  EXPECT_EQ(s.cols, 10);
  EXPECT_EQ(s.nbytes(), Weight::storage_bytes(WeightFormat::BF16, 3, 10, 4));
  EXPECT_FALSE(s.dense());
}

TEST(Weight, DenseTensorIsAWeightOfItsType) {
  std::vector<float> data(12);
  const Tensor t{data.data(), DType::F32, 3, 4};
  const Weight w = t;
  EXPECT_EQ(w.format, WeightFormat::F32);
  EXPECT_TRUE(w.dense());
  const Tensor back = dense_view(w);
  EXPECT_EQ(back.data, t.data);
  EXPECT_EQ(back.rows, 3);
  EXPECT_EQ(back.cols, 4);
  const Tensor ids{data.data(), DType::I32, 3, 4};
  EXPECT_DEATH((void)Weight(ids), "no weight format");
}

// The CPU backend stores every tensor as fp32: planning must predict exactly the bytes of
// all tensors load_weights uploads, and the linear weights' bytes are 4 per GEMM parameter.
TEST(Weight, PlannedBytesMatchTheLoadedModel) {
  const ModelConfig cfg = load_model_config(kTinyChat);
  Checkpoint ckpt(kTinyChat);
  auto be = make_cpu_backend({});
  ASSERT_EQ(be->weight_format(), WeightFormat::F32);
  const ModelWeights w = load_weights(cfg, ckpt, *be, nullptr);

  size_t all_params = 0, linear_params = 0, head_params = 0;
  for (auto& [name, shape] : expected_tensors(cfg)) {
    size_t n = 1;
    for (int64_t s : shape) n *= size_t(s);
    all_params += n;
    if (shape.size() == 2 && name != "model.embed_tokens.weight") linear_params += n;
    if (name == "lm_head.weight") head_params += n;
  }
  if (cfg.tie_word_embeddings) {  // lm_head is the embedding table, read by every decode step
    head_params = size_t(cfg.vocab_size) * size_t(cfg.hidden_size);
    linear_params += head_params;
  }
  EXPECT_EQ(planned_weight_bytes(cfg, WeightFormat::F32, WeightFormat::F32), all_params * 4);
  EXPECT_EQ(planned_weight_bytes(cfg, WeightFormat::BF16, WeightFormat::BF16), all_params * 2);
  // W4A16 at load: a backend that keeps two copies of each int4 weight (CUDA on Hopper) plans
  // the projections' int4 bytes twice, and nothing else twice.
  size_t int4_bytes = 0;
  for (auto& [name, shape] : expected_tensors(cfg))
    if (shape.size() == 2 && name != "model.embed_tokens.weight" && name != "lm_head.weight")
      int4_bytes += Weight::storage_bytes(WeightFormat::INT4_GROUPED, shape[0], shape[1], 64);
  EXPECT_EQ(planned_weight_bytes(cfg, WeightFormat::INT4_GROUPED, WeightFormat::BF16, 64, 2),
            planned_weight_bytes(cfg, WeightFormat::INT4_GROUPED, WeightFormat::BF16, 64, 1) +
                int4_bytes);
  EXPECT_EQ(w.linear_bytes(), linear_params * 4);
  EXPECT_EQ(w.body_linear_bytes(), (linear_params - head_params) * 4);
  // The stacked projections' parts are views into their stacked weight.
  const LayerWeights& l = w.layers[0];
  EXPECT_EQ(l.q_proj.data, l.qkvg.data);
  EXPECT_EQ(l.q_proj.rows + l.k_proj.rows + l.v_proj.rows + l.gate.rows, l.qkvg.rows);
  EXPECT_EQ(l.gate_proj.rows + l.up_proj.rows, l.gate_up.rows);
}

// The values of a CPU weight (fp32) as a [rows, cols] matrix.
std::vector<float> values(const Weight& w) {
  const float* p = static_cast<const float*>(w.data);
  return {p, p + w.rows * w.cols};
}

// Rank r of 2's shard (WeightShard): the rows of its outputs, the columns of its inputs, its
// vocabulary slice, and the norms whole, each equal to the whole model's values there.
TEST(Weight, ShardHoldsTheRanksRowsColumnsAndVocabulary) {
  const ModelConfig cfg = load_model_config(kTinyChat);
  Checkpoint ckpt(kTinyChat);
  auto be = make_cpu_backend({});
  const ModelWeights whole = load_weights(cfg, ckpt, *be, nullptr);
  const int64_t V = cfg.vocab_size, H = cfg.hidden_size;
  for (int r = 0; r < 2; ++r) {
    WeightShard sh;
    sh.rank = r;
    sh.size = 2;
    sh.sparse_split = true;
    sh.vocab0 = r == 0 ? 0 : V / 2;
    sh.vocab1 = r == 0 ? V / 2 : V;
    const ModelWeights part = load_weights(cfg, ckpt, *be, nullptr, sh);
    auto rows_of = [&](const Weight& w, int64_t r0, int64_t n) {
      const std::vector<float> all = values(w);
      return std::vector<float>(all.begin() + r0 * w.cols, all.begin() + (r0 + n) * w.cols);
    };
    auto cols_of = [&](const Weight& w, int64_t c0, int64_t n) {
      std::vector<float> out;
      const std::vector<float> all = values(w);
      for (int64_t i = 0; i < w.rows; ++i)
        out.insert(out.end(), all.begin() + i * w.cols + c0, all.begin() + i * w.cols + c0 + n);
      return out;
    };
    for (size_t i = 0; i < whole.layers.size(); ++i) {
      SCOPED_TRACE(testing::Message() << "rank " << r << " layer " << i);
      const LayerWeights& w = whole.layers[i];
      const LayerWeights& p = part.layers[i];
      for (auto [a, b] : {std::pair{&w.q_proj, &p.q_proj}, {&w.k_proj, &p.k_proj},
                          {&w.v_proj, &p.v_proj}, {&w.gate, &p.gate},
                          {&w.gate_proj, &p.gate_proj}, {&w.up_proj, &p.up_proj}}) {
        ASSERT_EQ(b->rows * 2, a->rows);
        EXPECT_EQ(values(*b), rows_of(*a, r * b->rows, b->rows));
      }
      for (auto [a, b] : {std::pair{&w.o_proj, &p.o_proj}, {&w.down_proj, &p.down_proj}}) {
        ASSERT_EQ(b->cols * 2, a->cols);
        ASSERT_EQ(b->rows, H);
        EXPECT_EQ(values(*b), cols_of(*a, r * b->cols, b->cols));
      }
      EXPECT_EQ(p.q_proj.data, p.qkvg.data);  // still stacked: one GEMM per rank
      if (w.type != MixerType::Sparse)
        EXPECT_EQ(values(Weight(p.o_norm)), values(Weight(w.o_norm)));  // the whole row's
    }
    EXPECT_EQ(values(part.lm_head), rows_of(whole.lm_head, sh.vocab0, sh.vocab1 - sh.vocab0));
    EXPECT_EQ(values(Weight(part.norm)), values(Weight(whole.norm)));
  }
  // A replicated sparse mixer (sparse_split false) keeps every head of its projections.
  WeightShard rep;
  rep.rank = 1;
  rep.size = 2;
  rep.sparse_split = false;
  const ModelWeights part = load_weights(cfg, ckpt, *be, nullptr, rep);
  for (size_t i = 0; i < whole.layers.size(); ++i)
    if (whole.layers[i].type == MixerType::Sparse) {
      EXPECT_EQ(values(part.layers[i].qkvg), values(whole.layers[i].qkvg));
      EXPECT_EQ(part.layers[i].o_proj.cols * 2, whole.layers[i].o_proj.cols);
    }
}

}  // namespace
}  // namespace sala
