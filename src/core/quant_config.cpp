// config.json's `quantization_config`: compressed-tensors' FP8 and W4A16 layouts (config.h),
// per config group, or a clear error naming what is not implemented. Keys that only describe
// how the checkpoint was made (observer, version, quantization_status,
// global_compression_ratio) are not read.
#include <nlohmann/json.hpp>
#include <regex>

#include "core/config.h"
#include "core/error.h"

namespace sala {
using json = nlohmann::json;

namespace {

bool has(const json& args, const char* k) { return args.contains(k) && !args[k].is_null(); }
bool is(const json& args, const char* k, const json& want) {
  return has(args, k) && args[k] == want;
}
std::string shown(const json& args, const char* k) {
  return args.value(k, json(nullptr)).dump();
}

// `args` (a config group's "weights" / "input_activations") must be 8-bit float, symmetric,
// with the strategy and dynamism below; group / block forms are other layouts.
void check_fp8_args(const json& args, const std::string& where, const char* strategy,
                    bool dynamic, const std::string& source) {
  if (!args.is_object()) fail("{}: {} must be an object", source, where);
  if (!is(args, "num_bits", 8) || !is(args, "type", "float"))
    fail("{}: {} is {}-bit {}; only 8-bit float (FP8 e4m3) and 4-bit int (W4A16) are "
         "implemented", source, where, shown(args, "num_bits"), shown(args, "type"));
  if (!is(args, "strategy", strategy))
    fail("{}: {}.strategy is {}; only \"{}\" is implemented", source, where,
         shown(args, "strategy"), strategy);
  if (args.contains("symmetric") && !is(args, "symmetric", true))
    fail("{}: {} is asymmetric; only symmetric FP8 is implemented", source, where);
  if (!is(args, "dynamic", dynamic) && !(!has(args, "dynamic") && !dynamic))
    fail("{}: {}.dynamic must be {}", source, where, dynamic ? "true" : "false");
  for (const char* k : {"group_size", "block_structure"})
    if (has(args, k))
      fail("{}: {}.{} is set; grouped / block FP8 is not implemented", source, where, k);
}

// W4A16's weights: 4-bit int, symmetric (no zero points), static, one scale per group of input
// columns (or per output channel); activation ordering only where it needs no g_idx.
ModuleQuant parse_w4_args(const json& args, const std::string& where, const std::string& source) {
  if (!is(args, "symmetric", true))
    fail("{}: {} is asymmetric (zero points); only symmetric int4 is implemented", source, where);
  if (is(args, "dynamic", true) || (has(args, "dynamic") && !is(args, "dynamic", false)))
    fail("{}: {}.dynamic must be false for int4 weights", source, where);
  if (has(args, "block_structure"))
    fail("{}: {}.block_structure is set; block int4 is not implemented", source, where);
  // "group" / "dynamic" ordering stores a permutation (weight_g_idx) that the dequantization
  // would follow; "weight" / "static" only changed the GPTQ column order and stores none.
  if (has(args, "actorder") && !is(args, "actorder", "weight") && !is(args, "actorder", "static"))
    fail("{}: {}.actorder is {}; activation ordering with a g_idx (\"group\") is not "
         "implemented (\"weight\" / \"static\" and null are)", source, where,
         shown(args, "actorder"));
  ModuleQuant m{QuantScheme::W4A16, 0};
  if (is(args, "strategy", "group")) {
    if (!has(args, "group_size") || !args["group_size"].is_number_integer() ||
        args["group_size"].get<int>() <= 0)
      fail("{}: {}.group_size is {}; strategy \"group\" needs a positive group size", source,
           where, shown(args, "group_size"));
    m.group_size = args["group_size"].get<int32_t>();
  } else if (!is(args, "strategy", "channel")) {
    fail("{}: {}.strategy is {}; int4 weights are implemented for \"group\" and \"channel\"",
         source, where, shown(args, "strategy"));
  }
  return m;
}

// One config group: its targets and scheme. `format` is the group's own "format" or the
// top-level one.
QuantGroup parse_group(const std::string& gname, const json& g, const std::string& top_format,
                       const std::string& source) {
  const std::string where = "quantization_config.config_groups." + gname;
  if (!g.is_object()) fail("{}: {} must be an object", source, where);
  QuantGroup out;
  out.name = gname;
  const json targets = g.value("targets", json::array());
  if (!targets.is_array() || targets.empty())
    fail("{}: {}.targets must be a non-empty list", source, where);
  for (const json& t : targets) {
    if (!t.is_string()) fail("{}: {}.targets must hold strings", source, where);
    const std::string s = t.get<std::string>();
    if (s != "Linear" && !s.starts_with("re:") && !s.starts_with("model.") && s != "lm_head")
      fail("{}: {}.targets has \"{}\"; only \"Linear\", module names and \"re:\" regexes are "
           "implemented", source, where, s);
    out.targets.push_back(s);
  }
  const std::string format =
      g.contains("format") && g["format"].is_string() ? g["format"].get<std::string>() : top_format;
  if (has(g, "output_activations"))
    fail("{}: {}.output_activations is set; it is not implemented", source, where);
  const json& w = g.value("weights", json(nullptr));
  if (!w.is_object()) fail("{}: {}.weights must be an object", source, where);
  const json& in = g.value("input_activations", json(nullptr));
  if (is(w, "type", "int") && is(w, "num_bits", 4)) {
    if (format != "pack-quantized")
      fail("{}: {} is 4-bit int in format \"{}\"; only \"pack-quantized\" is implemented", source,
           where, format);
    if (!in.is_null())
      fail("{}: {}.input_activations is set on int4 weights: W4A8 is not implemented (W4A16 is)",
           source, where);
    out.quant = parse_w4_args(w, where + ".weights", source);
    return out;
  }
  if (format != "float-quantized")
    fail("{}: {}: format \"{}\" is not implemented for {}-bit {} weights (FP8 is "
         "\"float-quantized\", int4 \"pack-quantized\")", source, where, format,
         shown(w, "num_bits"), shown(w, "type"));
  check_fp8_args(w, where + ".weights", "channel", false, source);
  if (in.is_null())
    fail("{}: {}.input_activations is null: weight-only FP8 (W8A16) is not implemented", source,
         where);
  check_fp8_args(in, where + ".input_activations", "token", true, source);
  out.quant = {QuantScheme::FP8_W8A8, 0};
  return out;
}

// Python re.match: the pattern matches at the start of the name.
bool re_match(const std::string& pattern, const std::string& name) {
  return std::regex_search(name, std::regex(pattern), std::regex_constants::match_continuous);
}

}  // namespace

bool QuantizationConfig::ignores(const std::string& name) const {
  for (const std::string& p : ignore) {
    if (p.rfind("re:", 0) == 0 ? re_match(p.substr(3), name) : p == name) return true;
  }
  return false;
}

ModuleQuant QuantizationConfig::scheme_of(const std::string& name,
                                          const std::string& source) const {
  if (groups.empty() || ignores(name)) return {};
  // rank 3: exact name, 2: regex, 1: "Linear" (every module asked about is a Linear).
  int best = 0;
  const QuantGroup* chosen = nullptr;
  for (const QuantGroup& g : groups) {
    int rank = 0;
    for (const std::string& t : g.targets)
      rank = std::max(rank, t == name                                       ? 3
                            : t.starts_with("re:") && re_match(t.substr(3), name) ? 2
                            : t == "Linear"                                 ? 1
                                                                            : 0);
    if (rank == 0 || rank < best) continue;
    if (rank == best && chosen && !(chosen->quant == g.quant))
      fail("{}: module '{}' matches config groups '{}' and '{}' equally, with different schemes",
           source, name, chosen->name, g.name);
    if (rank > best) chosen = &g;
    best = rank;
  }
  return chosen ? chosen->quant : ModuleQuant{};
}

QuantizationConfig parse_quantization_config(const json& q, const std::string& source) {
  QuantizationConfig c;
  if (q.is_null()) return c;
  if (!q.is_object()) fail("{}: 'quantization_config' must be an object", source);
  const std::string method = q.value("quant_method", std::string());
  if (method != "compressed-tensors")
    fail("{}: quantization_config.quant_method \"{}\" is not implemented (only compressed-tensors "
         "FP8 \"float-quantized\" and W4A16 \"pack-quantized\")", source, method);
  const std::string format = q.value("format", std::string());
  if (format != "float-quantized" && format != "pack-quantized" && format != "mixed-precision")
    fail("{}: quantization_config.format \"{}\" is not implemented (only \"float-quantized\", "
         "\"pack-quantized\" and \"mixed-precision\" of those)", source, format);
  if (q.contains("kv_cache_scheme") && !q["kv_cache_scheme"].is_null())
    fail("{}: quantization_config.kv_cache_scheme is set; a quantized KV cache from the "
         "checkpoint is not implemented", source);
  if (q.contains("sparsity_config") && !q["sparsity_config"].is_null() &&
      !q["sparsity_config"].empty())
    fail("{}: quantization_config.sparsity_config is set; sparse weights are not implemented",
         source);
  const json& groups = q.value("config_groups", json::object());
  if (!groups.is_object() || groups.empty())
    fail("{}: quantization_config.config_groups must hold at least one group", source);
  for (const auto& [gname, g] : groups.items())
    c.groups.push_back(parse_group(gname, g, format, source));
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
  return c;
}

}  // namespace sala
