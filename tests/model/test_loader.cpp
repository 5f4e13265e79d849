// Checkpoint and config loading: every way a downloaded checkpoint can be wrong must give a
// clear sala::Error naming the file / tensor / key, never a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/safetensors.h"
#include "model/weights.h"
#include "test_util.h"

namespace sala::test {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

std::string tiny() { return fixtures_dir() + "/golden/tiny-dense"; }

// A scratch copy of the tiny model directory.
struct ScratchModel {
  fs::path dir;
  explicit ScratchModel(const std::string& name) {
    dir = fs::temp_directory_path() / ("sala_loader_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    fs::copy_file(fs::path(tiny()) / "config.json", dir / "config.json");
  }
  ~ScratchModel() { fs::remove_all(dir); }
  std::string str() const { return dir.string(); }
};

std::vector<TensorToWrite> tiny_tensors(DType as = DType::BF16) {
  Checkpoint ck(tiny());
  std::vector<TensorToWrite> out;
  for (auto& [name, t] : ck.all()) {
    TensorToWrite w{name, as, t->shape, {}};
    if (as == t->dtype) {
      w.bytes.assign(t->data, t->data + t->nbytes);
    } else {
      std::vector<float> f(size_t(t->numel()));
      t->to_f32(f.data());
      if (as == DType::F32) {
        w.bytes.resize(f.size() * 4);
        std::memcpy(w.bytes.data(), f.data(), w.bytes.size());
      } else {  // F16 via _Float16
        w.bytes.resize(f.size() * 2);
        for (size_t i = 0; i < f.size(); ++i) {
          _Float16 h = static_cast<_Float16>(f[i]);
          std::memcpy(&w.bytes[i * 2], &h, 2);
        }
      }
    }
    out.push_back(std::move(w));
  }
  return out;
}

class Loader : public ::testing::Test {
 protected:
  void SetUp() override {
    // The fixture is part of the repository: a missing one is a broken checkout.
    ASSERT_TRUE(fs::exists(fs::path(tiny()) / "model.safetensors")) << tiny();
  }
};

TEST_F(Loader, TruncatedFileNamesFileAndTensor) {
  ScratchModel m("trunc");
  fs::copy_file(fs::path(tiny()) / "model.safetensors", m.dir / "model.safetensors");
  fs::resize_file(m.dir / "model.safetensors", fs::file_size(m.dir / "model.safetensors") - 1000);
  const std::string e = error_of([&] { Checkpoint c(m.str()); });
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("tensor '"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST_F(Loader, CorruptHeaderIsRefused) {
  ScratchModel m("hdr");
  for (std::string junk : {std::string("\x05\x00\x00\x00\x00\x00\x00\x00{abc}", 13),
                           std::string("\xff\xff\x00\x00\x00\x00\x00\x00{}", 10), std::string("ab")}) {
    std::ofstream(m.dir / "model.safetensors", std::ios::binary) << junk;
    const std::string e = error_of([&] { Checkpoint c(m.str()); });
    EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  }
}

TEST_F(Loader, MissingAndMisshapenTensors) {
  ScratchModel m("shape");
  auto t = tiny_tensors();
  auto t2 = t;
  t2.erase(std::remove_if(t2.begin(), t2.end(),
                          [](auto& x) { return x.name == "model.layers.1.self_attn.z_proj.weight"; }),
           t2.end());
  write_safetensors((m.dir / "model.safetensors").string(), t2);
  ModelConfig cfg = load_model_config(m.str());
  auto be = make_backend("cpu", {});
  std::string e = error_of([&] {
    Checkpoint c(m.str());
    load_weights(cfg, c, *be, nullptr);
  });
  EXPECT_NE(e.find("model.layers.1.self_attn.z_proj.weight"), std::string::npos) << e;

  for (auto& x : t)
    if (x.name == "model.layers.0.self_attn.k_proj.weight") {
      x.shape = {8, 512};  // same bytes, wrong shape
    }
  write_safetensors((m.dir / "model.safetensors").string(), t);
  e = error_of([&] {
    Checkpoint c(m.str());
    load_weights(cfg, c, *be, nullptr);
  });
  EXPECT_NE(e.find("model.layers.0.self_attn.k_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("[8, 512]"), std::string::npos) << e;
}

TEST_F(Loader, ExtraTensorsAreReportedRopeBuffersIgnored) {
  ScratchModel m("extra");
  auto t = tiny_tensors();
  t.push_back({"model.layers.1.self_attn.rotary_emb.inv_freq", DType::F32, {8}, std::vector<uint8_t>(32)});
  t.push_back({"model.some_adapter.weight", DType::F32, {2}, std::vector<uint8_t>(8)});
  write_safetensors((m.dir / "model.safetensors").string(), t);
  ModelConfig cfg = load_model_config(m.str());
  auto be = make_backend("cpu", {});
  Checkpoint c(m.str());
  std::vector<std::string> unused;
  load_weights(cfg, c, *be, &unused);
  ASSERT_EQ(unused.size(), 1u);
  EXPECT_EQ(unused[0], "model.some_adapter.weight");
}

TEST_F(Loader, ShardedF32AndF16CheckpointsGiveTheSameModel) {
  auto ids = random_tokens(70, 512, 1);
  auto ref_model = load_tiny(tiny(), 128, 8, 1);
  auto ref = run_calls(*ref_model, ids, {70}, 0, page_range(0, 8));
  for (DType dt : {DType::F32, DType::F16}) {
    ScratchModel m(dt == DType::F32 ? "f32" : "f16");
    auto t = tiny_tensors(dt);
    // Two shards plus an index, as large HF checkpoints ship.
    std::vector<TensorToWrite> s1(t.begin(), t.begin() + long(t.size() / 2)),
        s2(t.begin() + long(t.size() / 2), t.end());
    write_safetensors((m.dir / "model-00001-of-00002.safetensors").string(), s1);
    write_safetensors((m.dir / "model-00002-of-00002.safetensors").string(), s2);
    json idx = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
    for (auto& x : s1) idx["weight_map"][x.name] = "model-00001-of-00002.safetensors";
    for (auto& x : s2) idx["weight_map"][x.name] = "model-00002-of-00002.safetensors";
    std::ofstream(m.dir / "model.safetensors.index.json") << idx.dump();
    auto model = load_tiny(m.str(), 128, 8, 1);
    auto out = run_calls(*model, ids, {70}, 0, page_range(0, 8));
    // bf16 -> f32 is exact; bf16 -> f16 rounds some weights (f16 has fewer exponent bits).
    EXPECT_LT(max_rel_diff(out, ref), dt == DType::F32 ? 1e-6 : 2e-2);
  }
}

TEST(Config, ErrorsNameTheKey) {
  std::ifstream in(std::string(SALA_SOURCE_DIR) + "/models/sala-tiny-chat/config.json");
  const json good = json::parse(in);
  auto err = [&](const std::function<void(json&)>& edit) {
    json j = good;
    edit(j);
    return error_of([&] { parse_model_config(j.dump(), "cfg.json"); });
  };
  EXPECT_EQ(err([](json&) {}), "");
  EXPECT_NE(err([](json& j) { j.erase("hidden_size"); }).find("'hidden_size'"), std::string::npos);
  EXPECT_NE(err([](json& j) { j["sparse_config"].erase("dense_len"); }).find("'sparse_config.dense_len'"),
            std::string::npos);
  EXPECT_NE(err([](json& j) { j["mixer_types"][2] = "mamba2"; }).find("mamba2"), std::string::npos);
  EXPECT_NE(err([](json& j) { j["num_key_value_heads"] = 2; }).find("16"), std::string::npos);
  EXPECT_NE(err([](json& j) { j["rope_theta"] = "big"; }).find("'rope_theta'"), std::string::npos);
  EXPECT_NE(err([](json& j) { j["mixer_types"][0] = "lightning-attn"; }).find("mixer_types[0]"),
            std::string::npos);
  EXPECT_NE(err([](json& j) { j["mixer_types"].erase(0); }).find("mixer_types"), std::string::npos);
  // Accepted spellings of the lightning type, and torch_dtype instead of dtype.
  EXPECT_EQ(err([](json& j) { j["mixer_types"][1] = "lightning_attn"; j["mixer_types"][2] = "lightning"; }),
            "");
  EXPECT_EQ(err([](json& j) { j.erase("dtype"); j["torch_dtype"] = "bfloat16"; }), "");
}

TEST(Config, ReleasedConstants) {
  // SPEC §2 derived constants for the released shape.
  std::ifstream in(std::string(SALA_SOURCE_DIR) + "/models/sala-tiny-chat/config.json");
  json j = json::parse(in);
  j["hidden_size"] = 4096;
  j["num_hidden_layers"] = 32;
  j["num_attention_heads"] = 32;
  j["num_key_value_heads"] = 2;
  j["head_dim"] = 128;
  j["lightning_nh"] = 32;
  j["lightning_nkv"] = 32;
  j["lightning_head_dim"] = 128;
  j["mixer_types"] = json::array();
  for (int i = 0; i < 32; ++i)
    j["mixer_types"].push_back((i == 0 || i == 9 || i == 16 || i == 17 || i == 22 || i >= 29)
                                   ? "minicpm4" : "lightning-attn");
  ModelConfig c = parse_model_config(j.dump(), "released");
  EXPECT_FLOAT_EQ(c.residual_scale(), 0.2474873734152916f);
  EXPECT_FLOAT_EQ(c.logit_divisor(), 16.f);
  EXPECT_EQ(c.num_sparse_layers(), 8);
  auto s = c.lightning_slopes();
  EXPECT_FLOAT_EQ(s[0], 0.840896415f);
  EXPECT_FLOAT_EQ(s[3], 0.5f);
  EXPECT_FLOAT_EQ(s[31], 0.00390625f);
  EXPECT_EQ(c.kind_index(9), 1);
  EXPECT_EQ(c.kind_index(10), 8);
}

TEST(Config, ChunkSizesThatKeepOneShotAttention) {
  // The 9B's sparse config (configs/minicpm-sala-9b.json): dense_len 8192, 64 + 2048/64 = 96
  // selected blocks of 64, so rows below 6144 select every visible block.
  const ModelConfig c = load_model_config(std::string(SALA_SOURCE_DIR) + "/configs/minicpm-sala-9b.json");
  ASSERT_EQ(c.sparse.dense_len, 8192);
  ASSERT_EQ(c.sparse.total_topk() * c.sparse.block_size, 6144);
  for (int64_t chunk : {2048, 3072, 4096, 6144, 8192, 16384, 65536})
    EXPECT_TRUE(c.sparse.chunk_keeps_one_shot_attention(chunk, false)) << chunk;
  // Chunks ending at 7168 (1024, 7168), 6400 (3200) or 7000 are dense past 6144.
  for (int64_t chunk : {64, 1024, 1000, 3200, 3500, 7000, 7168})
    EXPECT_FALSE(c.sparse.chunk_keeps_one_shot_attention(chunk, false)) << chunk;
  EXPECT_TRUE(c.sparse.chunk_keeps_one_shot_attention(64, true));  // every call sparse
}

}  // namespace
}  // namespace sala::test
