// `sala quantize --scheme w4a16 | mixed` (model/quantize.h, model/gptq.h, model/calibrate.h) and
// loading compressed-tensors pack-quantized checkpoints: an RTN checkpoint gives the bits of
// quantizing at load, GPTQ beats RTN on the layer-wise reconstruction error of the tiny model,
// a per-module mix of W4A16 / FP8 / dense loads each module in its scheme, the mixed plan
// follows its budget, and every unimplemented variant is refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/safetensors.h"
#include "model/calibrate.h"
#include "model/quantize.h"
#include "model/weights.h"
#include "test_util.h"

namespace sala::test {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

std::unique_ptr<Model> load(const std::string& dir, int32_t int4_group_at_load) {
  BackendOptions bo;
  bo.int4_group_size = int4_group_at_load;
  return load_bf16_cpu(dir, bo);
}

void write_w4(const std::string& out, const QuantPlan* plan = nullptr) {
  const ModelConfig cfg = load_model_config(tiny_chat_dir());
  const QuantPlan uniform = uniform_plan(cfg, {QuantScheme::W4A16, 128}, {});
  write_quantized_checkpoint(tiny_chat_dir(), out, plan ? *plan : uniform, {}, {}, json::object());
}

TEST(QuantizeW4, RtnCheckpointGivesTheBitsOfQuantizingAtLoad) {
  TempDir out("w4_bits");
  write_w4(out.str());
  const ModelConfig cfg = load_model_config(out.str());
  EXPECT_EQ(cfg.quantization.scheme_of("model.layers.3.mlp.down_proj", cfg.source),
            (ModuleQuant{QuantScheme::W4A16, 128}));
  EXPECT_EQ(cfg.quantization.ignore, std::vector<std::string>{"lm_head"});
  Checkpoint ck(out.str());
  EXPECT_EQ(ck.get("model.layers.0.mlp.up_proj.weight_packed").dtype, DType::I32);
  EXPECT_EQ(ck.get("model.layers.0.mlp.up_proj.weight_scale").shape,
            (std::vector<int64_t>{1024, 2}));
  auto fly = load(tiny_chat_dir(), 128), ckpt = load(out.str(), 0);
  EXPECT_EQ(ckpt->weights().layers[0].qkvg.format, WeightFormat::INT4_GROUPED);
  EXPECT_EQ(ckpt->weights().lm_head.format, WeightFormat::F32);
  EXPECT_EQ(planned_weight_bytes(cfg, WeightFormat::F32, WeightFormat::F32),
            planned_weight_bytes(load_model_config(tiny_chat_dir()), WeightFormat::INT4_GROUPED,
                                 WeightFormat::F32, 128));
  const auto ids = random_tokens(300, cfg.vocab_size, 5);
  const auto a = run_calls(*fly, ids, {256, 44}, 0, page_range(0, 24));
  const auto b = run_calls(*ckpt, ids, {256, 44}, 0, page_range(0, 24));
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(max_rel_diff(a, b), 0.0);
}

// QuantizeOptions::ignore (`sala quantize --ignore`): the matched modules stay as they were,
// listed in the config's ignore, and load dense beside the W4A16 ones; the rest keep the bits
// of quantizing at load (the layers before the first ignored module give the same logits).
TEST(QuantizeW4, IgnoreKeepsModulesDense) {
  const ModelConfig cfg = load_model_config(tiny_chat_dir());
  QuantizeOptions o;
  o.ignore = {"re:model\\.layers\\.1\\.mlp\\.", "model.layers.2.self_attn.o_proj"};
  const QuantPlan plan = uniform_plan(cfg, {QuantScheme::W4A16, 128}, o);
  EXPECT_EQ(plan.count("model.layers.1.mlp.gate_proj"), 0u);
  EXPECT_EQ(plan.count("model.layers.1.mlp.down_proj"), 0u);
  EXPECT_EQ(plan.count("model.layers.2.self_attn.o_proj"), 0u);
  EXPECT_EQ(plan.count("model.layers.0.mlp.down_proj"), 1u);
  EXPECT_EQ(plan.count("model.layers.2.self_attn.q_proj"), 1u);
  TempDir out("w4_ignore");
  write_w4(out.str(), &plan);
  const ModelConfig qc = load_model_config(out.str());
  EXPECT_EQ(qc.quantization.scheme_of("model.layers.1.mlp.up_proj", qc.source), ModuleQuant{});
  EXPECT_EQ(qc.quantization.scheme_of("model.layers.2.self_attn.o_proj", qc.source),
            ModuleQuant{});
  EXPECT_EQ(qc.quantization.scheme_of("model.layers.0.mlp.up_proj", qc.source),
            (ModuleQuant{QuantScheme::W4A16, 128}));
  Checkpoint ck(out.str());
  EXPECT_EQ(ck.get("model.layers.1.mlp.down_proj.weight").dtype, DType::BF16);
  EXPECT_EQ(ck.get("model.layers.0.mlp.down_proj.weight_packed").dtype, DType::I32);
  auto mixed = load(out.str(), 0), all = load(tiny_chat_dir(), 128);
  const LayerWeights& l1 = mixed->weights().layers[1];
  EXPECT_EQ(l1.gate_up.format, WeightFormat::F32);
  EXPECT_EQ(l1.down_proj.format, WeightFormat::F32);
  EXPECT_EQ(l1.qkvg.format, WeightFormat::INT4_GROUPED);
  EXPECT_EQ(mixed->weights().layers[2].o_proj.format, WeightFormat::F32);
  EXPECT_EQ(mixed->weights().layers[3].gate_up.format, WeightFormat::INT4_GROUPED);
  EXPECT_LT(mixed->weights().linear_bytes(), load(tiny_chat_dir(), 0)->weights().linear_bytes());
  EXPECT_GT(mixed->weights().linear_bytes(), all->weights().linear_bytes());
  const auto ids = random_tokens(120, cfg.vocab_size, 6);
  const auto a = run_calls(*mixed, ids, {120}, 0, page_range(0, 8));
  const auto b = run_calls(*all, ids, {120}, 0, page_range(0, 8));
  ASSERT_EQ(a.size(), b.size());
  EXPECT_GT(max_rel_diff(a, b), 0.0);  // the dense modules are used
}

// The layer-wise objective ‖X Wᵀ − X Qᵀ‖² on the tiny model's own activations: GPTQ (with and
// without act-order) below RTN for every family of the first and the last layer.
TEST(Gptq, BeatsRtnOnLayerwiseReconstructionError) {
  const ModelConfig cfg = load_model_config(tiny_chat_dir());
  std::vector<std::vector<int32_t>> seqs;
  for (uint32_t s = 0; s < 4; ++s) seqs.push_back(random_tokens(300, cfg.vocab_size, 11 + s));
  for (int layer : {0, cfg.num_hidden_layers - 1})
    for (const FamilyHessian& f : family_hessians(tiny_chat_dir(), seqs, layer)) {
      const double rtn = reconstruction_error(
          f.weight.data(), rtn_quantize(f.weight.data(), f.rows, f.cols, 128), f.rows, f.cols, f.H);
      for (bool act_order : {false, true}) {
        GptqOptions o;
        o.act_order = act_order;
        const double gptq = reconstruction_error(
            f.weight.data(), gptq_quantize(f.weight.data(), f.rows, f.cols, f.H, o), f.rows,
            f.cols, f.H);
        EXPECT_LT(gptq, 0.9 * rtn) << f.family.label() << " act_order " << act_order;
        std::printf("%-28s act_order %d: GPTQ / RTN error %.3f\n", f.family.label().c_str(),
                    int(act_order), gptq / rtn);
      }
    }
}

// A checkpoint mixing W4A16, FP8 and dense modules (config_groups by name, format
// "mixed-precision"): each module loads in its own scheme.
TEST(QuantizeW4, MixedCheckpointLoadsEachModuleInItsScheme) {
  const ModelConfig cfg = load_model_config(tiny_chat_dir());
  QuantPlan plan = uniform_plan(cfg, {QuantScheme::W4A16, 128}, {});
  for (const char* m : {"q_proj", "k_proj", "v_proj", "o_gate"})
    plan[std::string("model.layers.0.self_attn.") + m] = {QuantScheme::FP8_W8A8, 0};
  plan.erase("model.layers.1.mlp.down_proj");  // dense
  TempDir out("w4_mixed");
  write_w4(out.str(), &plan);
  json c;
  std::ifstream(out.p / "config.json") >> c;
  EXPECT_EQ(c["quantization_config"]["format"], "mixed-precision");
  auto m = load(out.str(), 0);
  const auto& L = m->weights().layers;
  EXPECT_EQ(L[0].qkvg.format, WeightFormat::FP8_E4M3);
  EXPECT_EQ(L[0].gate_up.format, WeightFormat::INT4_GROUPED);
  EXPECT_EQ(L[1].down_proj.format, WeightFormat::F32);
  EXPECT_EQ(L[1].gate_up.format, WeightFormat::INT4_GROUPED);
  const auto ids = random_tokens(40, cfg.vocab_size, 3);
  const auto logits = run_calls(*m, ids, {40}, 0, page_range(0, 24));
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

// A quantized copy whose config.json / tensors are then broken one way.
struct Broken {
  TempDir dir;
  json cfg;
  explicit Broken(const std::string& name) : dir("w4_" + name) {
    write_w4(dir.str());
    std::ifstream(dir.p / "config.json") >> cfg;
  }
  json& weights() { return cfg["quantization_config"]["config_groups"]["group_0"]["weights"]; }
  void rewrite(const std::function<void(std::vector<TensorToWrite>&)>& edit) {
    Checkpoint c(dir.str());
    std::vector<TensorToWrite> keep;
    for (auto& [name, t] : c.all())
      keep.push_back({name, t->dtype, t->shape, std::vector<uint8_t>(t->data, t->data + t->nbytes)});
    edit(keep);
    write_safetensors((dir.p / "model.safetensors").string() + ".new", keep);
    fs::rename(dir.p / "model.safetensors.new", dir.p / "model.safetensors");
  }
  std::string load_error() {
    std::ofstream(dir.p / "config.json") << cfg.dump();
    return error_of([&] { load(dir.str(), 0); });
  }
};

TEST(QuantizeW4, UnimplementedVariantsAreRefusedByName) {
  const std::vector<std::pair<std::function<void(Broken&)>, std::string>> cases = {
      {[](Broken& b) { b.weights()["symmetric"] = false; }, "asymmetric"},
      {[](Broken& b) { b.weights()["actorder"] = "group"; }, "actorder is \"group\""},
      {[](Broken& b) { b.weights()["strategy"] = "tensor"; }, "strategy is \"tensor\""},
      {[](Broken& b) { b.weights()["group_size"] = 96; }, "group size 96"},
      {[](Broken& b) {
         b.cfg["quantization_config"]["config_groups"]["group_0"]["input_activations"] =
             b.weights();
       }, "W4A8"},
      {[](Broken& b) { b.cfg["quantization_config"]["format"] = "marlin-24"; }, "marlin-24"},
      {[](Broken& b) {
         b.cfg["quantization_config"]["config_groups"]["group_0"]["targets"] = {"Embedding"};
       }, "\"Embedding\""},
  };
  for (auto& [edit, want] : cases) {
    Broken b("cfg");
    edit(b);
    const std::string e = b.load_error();
    EXPECT_NE(e.find(want), std::string::npos) << want << " / " << e;
  }
}

TEST(QuantizeW4, InconsistentCheckpointsNameTheTensor) {
  {  // a g_idx (activation ordering "group") beside the codes
    Broken b("gidx");
    b.rewrite([](std::vector<TensorToWrite>& t) {
      t.push_back({"model.layers.2.mlp.down_proj.weight_g_idx", DType::I32, {1024},
                   std::vector<uint8_t>(4096, 0)});
    });
    const std::string e = b.load_error();
    EXPECT_NE(e.find("model.layers.2.mlp.down_proj.weight_g_idx"), std::string::npos) << e;
  }
  {  // weight_shape disagreeing with the model
    Broken b("shape");
    b.rewrite([](std::vector<TensorToWrite>& t) {
      for (auto& x : t)
        if (x.name == "model.layers.1.self_attn.o_proj.weight_shape") x.bytes[0] ^= 1;
    });
    const std::string e = b.load_error();
    EXPECT_NE(e.find("model.layers.1.self_attn.o_proj.weight_shape"), std::string::npos) << e;
  }
  {  // stacked projections in different schemes (k_proj dense, q/v/o_gate int4)
    TempDir out("w4_stack");
    QuantPlan plan = uniform_plan(load_model_config(tiny_chat_dir()), {QuantScheme::W4A16, 128}, {});
    plan.erase("model.layers.0.self_attn.k_proj");
    write_w4(out.str(), &plan);
    const std::string e = error_of([&] { load(out.str(), 0); });
    EXPECT_NE(e.find("must share one quantization scheme"), std::string::npos) << e;
    EXPECT_NE(e.find("model.layers.0.self_attn.k_proj"), std::string::npos) << e;
  }
  {  // packed codes stored as another dtype
    Broken b("dtype");
    b.rewrite([](std::vector<TensorToWrite>& t) {
      for (auto& x : t)
        if (x.name == "model.layers.4.mlp.up_proj.weight_packed") x.dtype = DType::F32;
    });
    const std::string e = b.load_error();
    EXPECT_NE(e.find("model.layers.4.mlp.up_proj.weight_packed"), std::string::npos) << e;
  }
}

// The mixed plan follows its budget: a loose one keeps every family 4-bit, an impossible one
// (negative) keeps every family dense.
TEST(MixedPlan, FollowsTheBudget) {
  const ModelConfig cfg = load_model_config(tiny_chat_dir());
  const std::vector<std::vector<int32_t>> seqs = {random_tokens(48, cfg.vocab_size, 21)};
  const Int4CodeMap codes = quantize_int4(tiny_chat_dir(), seqs, {false, {}}, {});
  const size_t families = linear_families(cfg).size();
  json record;
  const QuantPlan loose = mixed_plan(tiny_chat_dir(), seqs, codes, 128, 100.0, &record, nullptr, {});
  EXPECT_EQ(loose.size(), families * 2);  // per layer 8 modules in 4 families
  EXPECT_EQ(record["families"].size(), families);
  const QuantPlan none = mixed_plan(tiny_chat_dir(), seqs, codes, 128, -1.0, &record, nullptr, {});
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(record["steps"].size(), families + 1);
}

}  // namespace
}  // namespace sala::test
