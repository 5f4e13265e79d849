// config.json's `quantization_config`: the compressed-tensors FP8 layout (config.h) or a clear
// error naming what is not implemented. Keys that only describe how the checkpoint was made
// (observer, version, quantization_status, global_compression_ratio) are not read.
#include <nlohmann/json.hpp>
#include <regex>

#include "core/config.h"
#include "core/error.h"

namespace sala {
using json = nlohmann::json;

namespace {

// `args` (a config group's "weights" / "input_activations") must be 8-bit float, symmetric,
// with the strategy and dynamism below; group / block forms are other layouts.
void check_args(const json& args, const std::string& where, const char* strategy, bool dynamic,
                const std::string& source) {
  auto is = [&](const char* k, const json& want) {
    return args.contains(k) && !args[k].is_null() && args[k] == want;
  };
  auto absent = [&](const char* k) { return !args.contains(k) || args[k].is_null(); };
  if (!args.is_object()) fail("{}: {} must be an object", source, where);
  if (!is("num_bits", 8) || !is("type", "float"))
    fail("{}: {} is {}-bit {}; only 8-bit float (FP8 e4m3) is implemented", source, where,
         args.value("num_bits", json(nullptr)).dump(), args.value("type", json(nullptr)).dump());
  if (!is("strategy", strategy))
    fail("{}: {}.strategy is {}; only \"{}\" is implemented", source, where,
         args.value("strategy", json(nullptr)).dump(), strategy);
  if (args.contains("symmetric") && !is("symmetric", true))
    fail("{}: {} is asymmetric; only symmetric FP8 is implemented", source, where);
  if (!is("dynamic", dynamic) && !(absent("dynamic") && !dynamic))
    fail("{}: {}.dynamic must be {}", source, where, dynamic ? "true" : "false");
  for (const char* k : {"group_size", "block_structure"})
    if (!absent(k))
      fail("{}: {}.{} is set; grouped / block FP8 is not implemented", source, where, k);
}

}  // namespace

bool QuantizationConfig::ignores(const std::string& name) const {
  for (const std::string& p : ignore) {
    if (p.rfind("re:", 0) == 0 ? std::regex_match(name, std::regex(p.substr(3))) : p == name)
      return true;
  }
  return false;
}

QuantizationConfig parse_quantization_config(const json& q, const std::string& source) {
  QuantizationConfig c;
  if (q.is_null()) return c;
  if (!q.is_object()) fail("{}: 'quantization_config' must be an object", source);
  const std::string method = q.value("quant_method", std::string());
  if (method != "compressed-tensors")
    fail("{}: quantization_config.quant_method \"{}\" is not implemented (only compressed-tensors "
         "FP8: {{\"format\": \"float-quantized\"}})", source, method);
  const std::string format = q.value("format", std::string());
  if (format != "float-quantized")
    fail("{}: quantization_config.format \"{}\" is not implemented (only \"float-quantized\")",
         source, format);
  if (q.contains("kv_cache_scheme") && !q["kv_cache_scheme"].is_null())
    fail("{}: quantization_config.kv_cache_scheme is set; a quantized KV cache from the "
         "checkpoint is not implemented", source);
  if (q.contains("sparsity_config") && !q["sparsity_config"].is_null() &&
      !q["sparsity_config"].empty())
    fail("{}: quantization_config.sparsity_config is set; sparse weights are not implemented",
         source);
  const json& groups = q.value("config_groups", json::object());
  if (!groups.is_object() || groups.size() != 1)
    fail("{}: quantization_config.config_groups must hold exactly one group", source);
  // Not `const auto& [k, v] = *groups.items().begin()`: that binds to a temporary proxy that
  // is gone by the next line (ASan: stack-use-after-scope, found by tests/fuzz/fuzz_config).
  const std::string gname = groups.begin().key();
  const json& g = *groups.begin();
  const std::string where = "quantization_config.config_groups." + gname;
  const json targets = g.value("targets", json::array());
  if (targets != json::array({"Linear"}))
    fail("{}: {}.targets is {}; only [\"Linear\"] is implemented", source, where, targets.dump());
  check_args(g.value("weights", json(nullptr)), where + ".weights", "channel", false, source);
  const json& in = g.value("input_activations", json(nullptr));
  if (in.is_null())
    fail("{}: {}.input_activations is null: weight-only FP8 (W8A16) is not implemented", source,
         where);
  check_args(in, where + ".input_activations", "token", true, source);
  if (g.contains("output_activations") && !g["output_activations"].is_null())
    fail("{}: {}.output_activations is set; it is not implemented", source, where);
  for (const json& i : q.value("ignore", json::array())) {
    if (!i.is_string()) fail("{}: quantization_config.ignore must hold strings", source);
    const std::string p = i.get<std::string>();
    // A "re:" pattern is compiled here so that a bad one is refused with the file named,
    // not thrown as std::regex_error when the loader first matches a module name.
    if (p.rfind("re:", 0) == 0) {
      try {
        std::regex re(p.substr(3));
      } catch (const std::regex_error& e) {
        fail("{}: quantization_config.ignore pattern \"{}\" is not a valid regex: {}", source, p, e.what());
      }
    }
    c.ignore.push_back(p);
  }
  c.fp8 = true;
  return c;
}

}  // namespace sala
