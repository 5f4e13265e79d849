// `sala quantize --scheme fp8` and loading compressed-tensors FP8 checkpoints: the written
// checkpoint gives the bits of quantizing at load (BackendOptions::fp8_weights), its config
// reads back, and every unsupported or inconsistent quantization_config is a clear error.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/safetensors.h"
#include "model/quantize.h"
#include "model/weights.h"
#include "test_util.h"

namespace sala::test {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

std::unique_ptr<Model> load(const std::string& dir, bool fp8_at_load) {
  BackendOptions bo;
  bo.fp8_weights = fp8_at_load;
  return load_bf16_cpu(dir, bo);
}

TEST(QuantizeFp8, CheckpointGivesTheBitsOfQuantizingAtLoad) {
  TempDir out("quant_bits");
  quantize_checkpoint_fp8(tiny_chat_dir(), out.str(), {});
  const ModelConfig cfg = load_model_config(out.str());
  ASSERT_TRUE(cfg.quantization.any());
  EXPECT_EQ(cfg.quantization.scheme_of("model.layers.0.mlp.down_proj", cfg.source).scheme,
            QuantScheme::FP8_W8A8);
  EXPECT_EQ(cfg.quantization.ignore, std::vector<std::string>{"lm_head"});
  EXPECT_TRUE(fs::exists(out.p / "tokenizer.json"));
  auto fly = load(tiny_chat_dir(), true), ckpt = load(out.str(), false);
  EXPECT_EQ(ckpt->weights().layers[0].qkvg.format, WeightFormat::FP8_E4M3);
  EXPECT_EQ(ckpt->weights().lm_head.format, WeightFormat::F32);
  const auto ids = random_tokens(300, cfg.vocab_size, 5);
  const auto a = run_calls(*fly, ids, {256, 44}, 0, page_range(0, 24));
  const auto b = run_calls(*ckpt, ids, {256, 44}, 0, page_range(0, 24));
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(max_rel_diff(a, b), 0.0);
}

// Memory planning (sala serve sizes the KV pool from it): a pre-quantized checkpoint is planned
// as FP8 even when the backend's own linear format is dense (no --quantization flag), i.e. as
// much as quantizing the bf16 checkpoint at load, not twice that.
TEST(QuantizeFp8, PreQuantizedCheckpointIsPlannedAsFp8) {
  TempDir out("quant_plan");
  quantize_checkpoint_fp8(tiny_chat_dir(), out.str(), {});
  const ModelConfig q = load_model_config(out.str()), plain = load_model_config(tiny_chat_dir());
  for (WeightFormat dense : {WeightFormat::F32, WeightFormat::BF16})
    EXPECT_EQ(planned_weight_bytes(q, dense, dense),
              planned_weight_bytes(plain, WeightFormat::FP8_E4M3, dense))
        << weight_format_name(dense);
  EXPECT_LT(planned_weight_bytes(q, WeightFormat::BF16, WeightFormat::BF16),
            planned_weight_bytes(plain, WeightFormat::BF16, WeightFormat::BF16));
}

TEST(QuantizeFp8, LmHeadOnRequestAndRefusals) {
  TempDir out("quant_head"), again("quant_again");
  quantize_checkpoint_fp8(tiny_chat_dir(), out.str(), {.quantize_lm_head = true});
  EXPECT_TRUE(load_model_config(out.str()).quantization.ignore.empty());
  EXPECT_EQ(load(out.str(), false)->weights().lm_head.format, WeightFormat::FP8_E4M3);
  EXPECT_NE(error_of([&] { quantize_checkpoint_fp8(out.str(), again.str(), {}); })
                .find("already FP8"),
            std::string::npos);
  EXPECT_NE(error_of([&] { quantize_checkpoint_fp8(tiny_chat_dir(), out.str(), {}); })
                .find("not empty"),
            std::string::npos);
}

// A quantized copy whose config.json / tensors are then broken one way.
struct Broken {
  TempDir dir;
  json cfg;
  explicit Broken(const std::string& name) : dir("quant_" + name) {
    quantize_checkpoint_fp8(tiny_chat_dir(), dir.str(), {});
    std::ifstream(dir.p / "config.json") >> cfg;
  }
  std::string load_error() {
    std::ofstream(dir.p / "config.json") << cfg.dump();
    return error_of([&] { load(dir.str(), false); });
  }
};

TEST(QuantizeFp8, UnsupportedConfigsNameWhatIsMissing) {
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& q) { q["quant_method"] = "gptq"; }, "\"gptq\" is not implemented"},
      {[](json& q) { q["format"] = "pack-quantized"; }, "\"pack-quantized\""},
      {[](json& q) { q["config_groups"]["group_0"]["weights"]["strategy"] = "tensor"; },
       "strategy is \"tensor\""},
      {[](json& q) { q["config_groups"]["group_0"]["weights"]["num_bits"] = 4; }, "4-bit"},
      {[](json& q) { q["config_groups"]["group_0"]["input_activations"] = nullptr; }, "W8A16"},
      {[](json& q) { q["kv_cache_scheme"] = json::object(); }, "kv_cache_scheme"},
  };
  for (auto& [edit, want] : cases) {
    Broken b("cfg");
    edit(b.cfg["quantization_config"]);
    const std::string e = b.load_error();
    EXPECT_NE(e.find(want), std::string::npos) << want << " / " << e;
    EXPECT_NE(e.find("config.json"), std::string::npos) << e;
  }
}

TEST(QuantizeFp8, InconsistentCheckpointsAreErrors) {
  {  // FP8 tensors, but no quantization_config
    Broken b("nocfg");
    b.cfg.erase("quantization_config");
    const std::string e = b.load_error();
    EXPECT_NE(e.find("is F8_E4M3, but"), std::string::npos) << e;
  }
  {  // a projection that the config leaves dense is stored as FP8
    Broken b("ignored");
    b.cfg["quantization_config"]["ignore"].push_back("model.layers.0.mlp.down_proj");
    const std::string e = b.load_error();
    EXPECT_NE(e.find("model.layers.0.mlp.down_proj.weight"), std::string::npos) << e;
  }
  {  // a scale missing
    Broken b("scale");
    Checkpoint c(b.dir.str());
    std::vector<TensorToWrite> keep;
    for (auto& [name, t] : c.all())
      if (name != "model.layers.1.self_attn.o_proj.weight_scale")
        keep.push_back(
            {name, t->dtype, t->shape, std::vector<uint8_t>(t->data, t->data + t->nbytes)});
    write_safetensors((b.dir.p / "model.safetensors").string() + ".new", keep);
    fs::rename(b.dir.p / "model.safetensors.new", b.dir.p / "model.safetensors");
    const std::string e = b.load_error();
    EXPECT_NE(e.find("model.layers.1.self_attn.o_proj.weight_scale"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace sala::test
