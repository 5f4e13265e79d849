#include "model/quantize.h"

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/fp8.h"
#include "core/int4.h"
#include "core/safetensors.h"
#include "model/weights.h"

namespace sala {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// compressed-tensors' QuantizationArgs of each scheme, field for field as the library dumps its
// presets (FP8_DYNAMIC; W4A16 with the group size).
json weight_args(const ModuleQuant& q) {
  if (q.scheme == QuantScheme::FP8_W8A8)
    return {{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}, {"symmetric", true},
            {"dynamic", false}, {"group_size", nullptr}, {"block_structure", nullptr}};
  return {{"num_bits", 4}, {"type", "int"}, {"strategy", "group"}, {"symmetric", true},
          {"dynamic", false}, {"group_size", q.group_size}, {"block_structure", nullptr},
          {"actorder", nullptr}};
}
json input_args(const ModuleQuant& q) {
  if (q.scheme != QuantScheme::FP8_W8A8) return nullptr;
  return {{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"symmetric", true},
          {"dynamic", true}, {"group_size", nullptr}, {"block_structure", nullptr}};
}
const char* format_of(const ModuleQuant& q) {
  return q.scheme == QuantScheme::FP8_W8A8 ? "float-quantized" : "pack-quantized";
}

// The quantization_config of a plan: one scheme for every quantized module -> one group
// targeting "Linear" (the library's preset form); several -> one group per scheme targeting its
// modules by name, format "mixed-precision" with each group's own. Linear modules outside the
// plan (lm_head by default) are listed in `ignore`.
json quantization_config(const ModelConfig& c, const QuantPlan& plan) {
  std::map<std::string, std::pair<ModuleQuant, std::vector<std::string>>> by_scheme;
  for (auto& [m, q] : plan) {
    auto& e = by_scheme[scheme_name(q)];
    e.first = q;
    e.second.push_back(m);
  }
  json ignore = json::array();
  for (auto& [name, shape] : expected_tensors(c))
    if (shape.size() == 2 && name.ends_with(".weight") && name != "model.embed_tokens.weight" &&
        !plan.count(module_of(name)))
      ignore.push_back(module_of(name));
  json groups = json::object();
  int i = 0;
  for (auto& [_, e] : by_scheme) {
    json g = {{"targets", by_scheme.size() == 1 ? json::array({"Linear"}) : json(e.second)},
              {"weights", weight_args(e.first)}, {"input_activations", input_args(e.first)},
              {"output_activations", nullptr}};
    if (by_scheme.size() > 1) g["format"] = format_of(e.first);
    groups[fmt::format("group_{}", i++)] = g;
  }
  const std::string format =
      by_scheme.size() == 1 ? format_of(by_scheme.begin()->second.first) : "mixed-precision";
  return {{"quant_method", "compressed-tensors"}, {"format", format},
          {"quantization_status", "compressed"}, {"config_groups", groups}, {"ignore", ignore},
          {"kv_cache_scheme", nullptr}};
}

// One output tensor: a copy of `src`, or part `part` of its module's quantized form.
enum class Part { Copy, Fp8Codes, Fp8Scales, Int4Packed, Int4Scales, Int4Shape };
struct OutTensor {
  TensorToWrite spec;
  const TensorView* src = nullptr;
  Part part = Part::Copy;
  std::string module;
};

}  // namespace

QuantPlan uniform_plan(const ModelConfig& c, const ModuleQuant& q, const QuantizeOptions& opts) {
  QuantizationConfig kept;  // its `ignores` is the loader's own matching
  kept.ignore = opts.ignore;
  QuantPlan plan;
  for (auto& [name, shape] : expected_tensors(c))
    if (shape.size() == 2 && name.ends_with(".weight") && name != "model.embed_tokens.weight" &&
        (name != "lm_head.weight" || opts.quantize_lm_head) && !kept.ignores(module_of(name)))
      plan[module_of(name)] = q;
  return plan;
}

void write_quantized_checkpoint(const std::string& in_dir, const std::string& out_dir,
                                const QuantPlan& plan, const Int4CodeMap& codes,
                                const QuantizeOptions& opts, const json& extra_config,
                                const std::function<void(size_t, size_t)>& progress) {
  const std::string cfg_path = (fs::path(in_dir) / "config.json").string();
  ModelConfig cfg = load_model_config(in_dir);
  if (cfg.quantization.any())
    fail("{}: the checkpoint is already quantized (quantization_config); quantize its bf16 "
         "original", cfg_path);
  if (fs::exists(out_dir) && !fs::is_empty(out_dir))
    fail("{}: the output directory exists and is not empty", out_dir);
  if (fs::exists(out_dir) && fs::equivalent(in_dir, out_dir))
    fail("{}: the output directory is the input", out_dir);

  Checkpoint ckpt(in_dir);
  std::vector<OutTensor> out;
  for (auto& [name, t] : ckpt.all()) {
    const std::string m = module_of(name);
    const auto it = name.ends_with(".weight") ? plan.find(m) : plan.end();
    if (it == plan.end()) {
      out.push_back({{name, t->dtype, t->shape, {}}, t, Part::Copy, m});
      continue;
    }
    if (t->shape.size() != 2) fail("{}: '{}' is not a 2-D Linear weight", t->file, name);
    const int64_t rows = t->shape[0], cols = t->shape[1];
    if (it->second.scheme == QuantScheme::FP8_W8A8) {
      out.push_back({{name, DType::F8_E4M3, t->shape, {}}, t, Part::Fp8Codes, m});
      out.push_back({{m + ".weight_scale", DType::F32, {rows, 1}, {}}, t, Part::Fp8Scales, m});
    } else {
      const int32_t g = int4_group(cfg, it->second, m, cols);
      out.push_back({{m + ".weight_packed", DType::I32, {rows, cols / 8}, {}}, t, Part::Int4Packed, m});
      out.push_back({{m + ".weight_scale", DType::BF16, {rows, cols / g}, {}}, t, Part::Int4Scales, m});
      out.push_back({{m + ".weight_shape", DType::I32, {2}, {}}, t, Part::Int4Shape, m});
    }
  }
  json cfg_json = json::parse(std::ifstream(cfg_path));
  // An empty plan (a mixed plan that kept everything dense) is a plain copy: no config groups.
  if (!plan.empty()) {
    cfg_json["quantization_config"] = quantization_config(cfg, plan);
    for (auto& [k, v] : extra_config.items()) cfg_json["quantization_config"][k] = v;
  }
  fs::create_directories(out_dir);

  // Shards of at most shard_bytes (a tensor larger than that is a shard of its own); a
  // module's scales and shape stay in its codes' shard.
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    uint64_t n = dtype_size(out[i].spec.dtype);
    for (int64_t d : out[i].spec.shape) n *= uint64_t(d);
    const bool follows = out[i].part == Part::Fp8Scales || out[i].part == Part::Int4Scales ||
                         out[i].part == Part::Int4Shape;
    if (in_shard > 0 && in_shard + n > opts.shard_bytes && !follows) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += n;
  }
  json weight_map = json::object();
  uint64_t total = 0;
  size_t done = 0;
  std::vector<float> scales;  // of the module whose codes were written last
  Int4Codes rtn;              // W4A16 codes of a module without precomputed ones
  const Int4Codes* int4 = nullptr;
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
          const int64_t rows = t.shape.size() == 2 ? t.shape[0] : 0;
          const int64_t cols = t.shape.size() == 2 ? t.shape[1] : 0;
          switch (o.part) {
            case Part::Fp8Codes: {
              std::vector<float> w(size_t(rows * cols));
              t.to_f32(w.data());
              buf.resize(size_t(rows * cols));
              scales.resize(size_t(rows));
              fp8_quantize_rows(w.data(), rows, cols, buf.data(), scales.data());
              break;
            }
            case Part::Fp8Scales:
              buf.resize(scales.size() * sizeof(float));
              std::memcpy(buf.data(), scales.data(), buf.size());
              break;
            case Part::Int4Packed: {
              const auto it = codes.find(o.module);
              if (it != codes.end()) {
                int4 = &it->second;
              } else {
                const int32_t g = int4_group(cfg, plan.at(o.module), o.module, cols);
                std::vector<float> w(size_t(rows * cols));
                t.to_f32(w.data());
                rtn.words.resize(size_t(rows * cols / 8));
                rtn.scales.resize(size_t(rows * (cols / g)));
                rtn.group = g;
                int4_quantize_rtn(w.data(), rows, cols, g, rtn.words.data(), rtn.scales.data());
                int4 = &rtn;
              }
              SALA_CHECK(int4->words.size() == size_t(rows * cols / 8), "{}: codes", o.module);
              buf.resize(int4->words.size() * 4);
              std::memcpy(buf.data(), int4->words.data(), buf.size());
              break;
            }
            case Part::Int4Scales:
              buf.resize(int4->scales.size() * 2);
              for (size_t i = 0; i < int4->scales.size(); ++i) {
                const uint16_t b = f32_to_bf16(int4->scales[i]);  // exact: bf16 values
                std::memcpy(buf.data() + 2 * i, &b, 2);
              }
              break;
            case Part::Int4Shape: {
              const int32_t shape[2] = {int32_t(rows), int32_t(cols)};
              buf.resize(8);
              std::memcpy(buf.data(), shape, 8);
              break;
            }
            case Part::Copy:
              buf.assign(t.data, t.data + t.nbytes);
              break;
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

void quantize_checkpoint_fp8(const std::string& in_dir, const std::string& out_dir,
                             const QuantizeOptions& opts,
                             const std::function<void(size_t, size_t)>& progress) {
  const ModelConfig cfg = load_model_config(in_dir);
  if (cfg.quantization.any())
    fail("{}/config.json: the checkpoint is already FP8 or otherwise quantized "
         "(quantization_config)", in_dir);
  write_quantized_checkpoint(in_dir, out_dir,
                             uniform_plan(cfg, {QuantScheme::FP8_W8A8, 0}, opts), {}, opts,
                             json::object(), progress);
}

}  // namespace sala
