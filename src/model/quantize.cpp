#include "model/quantize.h"

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/safetensors.h"
#include "model/weights.h"

namespace sala {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The quantization_config written: compressed-tensors' FP8_DYNAMIC preset scheme (its
// QuantizationArgs, field for field) with the keys llm-compressor writes around it.
json fp8_quantization_config(bool quantize_lm_head) {
  const json weights = {{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"},
                        {"symmetric", true}, {"dynamic", false}, {"group_size", nullptr},
                        {"block_structure", nullptr}};
  const json inputs = {{"num_bits", 8}, {"type", "float"}, {"strategy", "token"},
                       {"symmetric", true}, {"dynamic", true}, {"group_size", nullptr},
                       {"block_structure", nullptr}};
  return {{"quant_method", "compressed-tensors"}, {"format", "float-quantized"},
          {"quantization_status", "compressed"},
          {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", weights},
                                          {"input_activations", inputs},
                                          {"output_activations", nullptr}}}}},
          {"ignore", quantize_lm_head ? json::array() : json::array({"lm_head"})},
          {"kv_cache_scheme", nullptr}};
}

// One output tensor: a copy of `src`, its FP8 codes, or the per-channel scales of the codes
// tensor written just before it.
struct OutTensor {
  TensorToWrite spec;
  const TensorView* src = nullptr;
  bool codes = false, scales = false;
};

}  // namespace

void quantize_checkpoint_fp8(const std::string& in_dir, const std::string& out_dir,
                             const QuantizeOptions& opts,
                             const std::function<void(size_t, size_t)>& progress) {
  const std::string cfg_path = (fs::path(in_dir) / "config.json").string();
  ModelConfig cfg = load_model_config(in_dir);
  if (cfg.quantization.fp8)
    fail("{}: the checkpoint is already FP8 (quantization_config)", cfg_path);
  if (fs::exists(out_dir) && !fs::is_empty(out_dir))
    fail("{}: the output directory exists and is not empty", out_dir);
  if (fs::exists(out_dir) && fs::equivalent(in_dir, out_dir))
    fail("{}: the output directory is the input", out_dir);
  fs::create_directories(out_dir);

  std::ifstream cfg_in(cfg_path);
  json cfg_json = json::parse(cfg_in);
  cfg_json["quantization_config"] = fp8_quantization_config(opts.quantize_lm_head);
  // What that config means to the loader (a test reads the written config back).
  cfg.quantization.fp8 = true;
  cfg.quantization.ignore.clear();
  if (!opts.quantize_lm_head) cfg.quantization.ignore.push_back("lm_head");

  Checkpoint ckpt(in_dir);
  std::vector<OutTensor> out;
  for (auto& [name, t] : ckpt.all()) {
    if (stored_fp8(cfg, name, t->shape.size())) {
      out.push_back({{name, DType::F8_E4M3, t->shape, {}}, t, true, false});
      out.push_back({{module_of(name) + ".weight_scale", DType::F32, {t->shape[0], 1}, {}}, t,
                     false, true});
    } else {
      out.push_back({{name, t->dtype, t->shape, {}}, t, false, false});
    }
  }
  // Shards of at most shard_bytes (a tensor larger than that is a shard of its own).
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    uint64_t n = dtype_size(out[i].spec.dtype);
    for (int64_t d : out[i].spec.shape) n *= uint64_t(d);
    if (in_shard > 0 && in_shard + n > opts.shard_bytes && !out[i].scales) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += n;
  }
  json weight_map = json::object();
  uint64_t total = 0;
  size_t done = 0;
  std::vector<float> scales;  // of the codes tensor written last
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1 ? "model.safetensors"
                                                : fmt::format("model-{:05d}-of-{:05d}.safetensors",
                                                              s + 1, shards.size());
    std::vector<TensorToWrite> specs;
    for (size_t i : shards[s]) {
      specs.push_back(out[i].spec);
      weight_map[out[i].spec.name] = file;
    }
    write_safetensors_streaming(
        (fs::path(out_dir) / file).string(), specs,
        [&](size_t k, std::vector<uint8_t>& buf) {
          const OutTensor& o = out[shards[s][k]];
          const TensorView& t = *o.src;
          if (o.codes) {
            const int64_t rows = t.shape[0], cols = t.shape[1];
            std::vector<float> w(size_t(rows * cols));
            t.to_f32(w.data());
            buf.resize(size_t(rows * cols));
            scales.resize(size_t(rows));
            fp8_quantize_rows(w.data(), rows, cols, buf.data(), scales.data());
          } else if (o.scales) {
            buf.resize(scales.size() * sizeof(float));
            std::memcpy(buf.data(), scales.data(), buf.size());
          } else {
            buf.assign(t.data, t.data + t.nbytes);
          }
          total += buf.size();
          if (progress) progress(++done, out.size());
        });
  }
  if (shards.size() > 1) {
    std::ofstream idx(fs::path(out_dir) / "model.safetensors.index.json");
    idx << json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) << "\n";
  }
  std::ofstream(fs::path(out_dir) / "config.json") << cfg_json.dump(2) << "\n";
  for (const auto& e : fs::directory_iterator(in_dir)) {
    const std::string n = e.path().filename().string();
    if (!e.is_regular_file() || n == "config.json" || n.ends_with(".safetensors") ||
        n == "model.safetensors.index.json")
      continue;
    fs::copy_file(e.path(), fs::path(out_dir) / n);
  }
}

}  // namespace sala
