#include "core/config.h"

#include <climits>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace sala {
using json = nlohmann::json;

namespace {

struct Reader {
  const json& j;
  std::string source;
  std::string prefix;

  const json& at(const char* key) const {
    if (!j.contains(key)) fail("{}: missing required key '{}{}'", source, prefix, key);
    return j.at(key);
  }
  int get_int(const char* key) const {
    const json& v = at(key);
    if (!v.is_number_integer()) fail("{}: key '{}{}' must be an integer", source, prefix, key);
    // Out of int range would be truncated into another, valid-looking value (2^32 + 256 -> 256).
    if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(INT_MAX)
                               : (v.get<int64_t>() > INT_MAX || v.get<int64_t>() < INT_MIN))
      fail("{}: key '{}{}' is out of range ({})", source, prefix, key, v.dump());
    return v.get<int>();
  }
  int get_pos_int(const char* key) const {
    int v = get_int(key);
    if (v <= 0) fail("{}: key '{}{}' must be positive, got {}", source, prefix, key, v);
    return v;
  }
  double get_num(const char* key) const {
    const json& v = at(key);
    if (!v.is_number()) fail("{}: key '{}{}' must be a number", source, prefix, key);
    return v.get<double>();
  }
  bool get_bool(const char* key) const {
    const json& v = at(key);
    if (!v.is_boolean()) fail("{}: key '{}{}' must be true or false", source, prefix, key);
    return v.get<bool>();
  }
  bool opt_bool(const char* key, bool dflt) const {
    return j.contains(key) ? get_bool(key) : dflt;
  }
};

double parse_lightning_scale(const json& v, int head_dim, const std::string& source) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "1/sqrt(d)") return 1.0 / std::sqrt(double(head_dim));
    if (s == "1/d") return 1.0 / double(head_dim);
    if (s == "1") return 1.0;
  }
  fail("{}: key 'lightning_scale' must be a number or \"1/sqrt(d)\", got {}", source, v.dump());
}

}  // namespace

const char* mixer_name(MixerType t) { return t == MixerType::Sparse ? "minicpm4" : "lightning-attn"; }

int ModelConfig::num_sparse_layers() const {
  int n = 0;
  for (auto t : mixer_types) n += t == MixerType::Sparse;
  return n;
}
int ModelConfig::num_lightning_layers() const { return num_hidden_layers - num_sparse_layers(); }

int ModelConfig::kind_index(int layer) const {
  int n = 0;
  for (int i = 0; i < layer; ++i) n += mixer_types[i] == mixer_types[layer];
  return n;
}

std::vector<float> ModelConfig::lightning_slopes() const {
  // HF _build_slope_tensor: python float64, then stored as fp32.
  auto pow2 = [](int n) {
    std::vector<double> s;
    const double start = std::pow(2.0, -std::pow(2.0, -(std::log2(double(n)) - 3)));
    for (int i = 0; i < n; ++i) s.push_back(start * std::pow(start, i));
    return s;
  };
  const int n = lightning_nh;
  std::vector<double> s;
  if ((n & (n - 1)) == 0) {
    s = pow2(n);
  } else {
    int p = 1;
    while (p * 2 < n) p *= 2;
    s = pow2(p);
    std::vector<double> extra = pow2(2 * p);
    for (int i = 0; int(s.size()) < n; i += 2) s.push_back(extra[size_t(i)]);
  }
  return std::vector<float>(s.begin(), s.end());
}

// quant_config.cpp
QuantizationConfig parse_quantization_config(const json& q, const std::string& source);

namespace {
ModelConfig parse_model_config_json(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail("{}: not a valid JSON object", source);
  Reader r{j, source, ""};
  ModelConfig c;
  c.source = source;
  if (j.contains("model_type") && j["model_type"] != "minicpm_sala")
    fail("{}: model_type is {}, expected \"minicpm_sala\"", source, j["model_type"].dump());
  c.hidden_size = r.get_pos_int("hidden_size");
  c.intermediate_size = r.get_pos_int("intermediate_size");
  c.num_hidden_layers = r.get_pos_int("num_hidden_layers");
  c.vocab_size = r.get_pos_int("vocab_size");
  c.num_attention_heads = r.get_pos_int("num_attention_heads");
  c.num_key_value_heads = r.get_pos_int("num_key_value_heads");
  c.head_dim = j.contains("head_dim") ? r.get_pos_int("head_dim")
                                      : c.hidden_size / c.num_attention_heads;
  c.attn_use_output_gate = r.get_bool("attn_use_output_gate");
  c.lightning_nh = r.get_pos_int("lightning_nh");
  c.lightning_nkv = r.get_pos_int("lightning_nkv");
  c.lightning_head_dim = r.get_pos_int("lightning_head_dim");
  c.lightning_scale = parse_lightning_scale(r.at("lightning_scale"), c.lightning_head_dim, source);
  c.use_output_gate = r.get_bool("use_output_gate");
  c.use_output_norm = r.get_bool("use_output_norm");
  c.qk_norm = r.get_bool("qk_norm");
  c.lightning_use_rope = r.get_bool("lightning_use_rope");
  c.rope_theta = r.get_num("rope_theta");
  c.rms_norm_eps = r.get_num("rms_norm_eps");
  c.scale_emb = r.get_num("scale_emb");
  c.scale_depth = r.get_num("scale_depth");
  c.dim_model_base = r.get_num("dim_model_base");
  c.max_position_embeddings = r.get_pos_int("max_position_embeddings");
  c.tie_word_embeddings = r.opt_bool("tie_word_embeddings", false);
  c.bos_token_id = j.contains("bos_token_id") ? r.get_int("bos_token_id") : 1;
  if (j.contains("eos_token_id")) {
    const json& e = j["eos_token_id"];
    if (e.is_number_integer()) {
      if (e.get<int64_t>() < 0 || e.get<int64_t>() > INT_MAX)
        fail("{}: key 'eos_token_id' is {}, not a token id", source, e.dump());
      c.eos_token_ids = {e.get<int>()};
    }
    else if (e.is_array())
      for (auto& x : e) {
        if (!x.is_number_integer()) fail("{}: key 'eos_token_id' must hold integers", source);
        if (x.get<int64_t>() < 0 || x.get<int64_t>() > INT_MAX)
          fail("{}: key 'eos_token_id' holds {}, not a token id", source, x.dump());
        c.eos_token_ids.push_back(x.get<int>());
      }
    else fail("{}: key 'eos_token_id' must be an integer or a list", source);
  }

  // Features this engine implements only in the released form.
  if (r.get_bool("attn_use_rope"))
    fail("{}: key 'attn_use_rope' is true; MiniCPM-SALA sparse layers are NoPE and this engine "
         "supports only false", source);
  if (j.contains("attention_bias") && r.get_bool("attention_bias"))
    fail("{}: key 'attention_bias' is true; biases are not supported", source);
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    fail("{}: key 'hidden_act' is {}, only \"silu\" is supported", source,
         j["hidden_act"].dump());
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    fail("{}: key 'rope_scaling' must be null (no RoPE scaling is supported)", source);
  if (!c.lightning_use_rope)
    fail("{}: key 'lightning_use_rope' is false; only the released HyPE layout is supported",
         source);
  if (!c.qk_norm || !c.use_output_norm || !c.use_output_gate || !c.attn_use_output_gate)
    fail("{}: keys 'qk_norm', 'use_output_norm', 'use_output_gate', 'attn_use_output_gate' must "
         "all be true (the released architecture)", source);
  if (c.lightning_nkv != c.lightning_nh)
    fail("{}: key 'lightning_nkv' ({}) must equal 'lightning_nh' ({})", source, c.lightning_nkv,
         c.lightning_nh);
  // HF builds lightning layers from num_attention_heads / head_dim, SGLang from lightning_*
  // (SPEC trap 21): refuse a config where they differ rather than pick one silently.
  if (c.lightning_nh != c.num_attention_heads || c.lightning_head_dim != c.head_dim)
    fail("{}: 'lightning_nh'/'lightning_head_dim' ({}/{}) differ from "
         "'num_attention_heads'/'head_dim' ({}/{}); HF and SGLang disagree on such configs",
         source, c.lightning_nh, c.lightning_head_dim, c.num_attention_heads, c.head_dim);
  if (c.num_attention_heads % c.num_key_value_heads != 0 || c.kv_group() != 16)
    fail("{}: num_attention_heads / num_key_value_heads = {}/{}; the InfLLM-v2 sparse layers "
         "need a group ratio of exactly 16", source, c.num_attention_heads,
         c.num_key_value_heads);
  if (int64_t(c.num_attention_heads) * c.head_dim != c.hidden_size)
    fail("{}: num_attention_heads * head_dim ({} * {}) must equal hidden_size ({})", source,
         c.num_attention_heads, c.head_dim, c.hidden_size);
  if (c.head_dim % 2) fail("{}: key 'head_dim' must be even (rotate-half RoPE)", source);

  const json& m = r.at("mixer_types");
  if (!m.is_array()) fail("{}: key 'mixer_types' must be a list", source);
  if (int(m.size()) != c.num_hidden_layers)
    fail("{}: key 'mixer_types' has {} entries but num_hidden_layers is {}", source, m.size(),
         c.num_hidden_layers);
  for (size_t i = 0; i < m.size(); ++i) {
    if (!m[i].is_string()) fail("{}: mixer_types[{}] must be a string", source, i);
    const std::string s = m[i].get<std::string>();
    if (s == "minicpm4") c.mixer_types.push_back(MixerType::Sparse);
    else if (s == "lightning-attn" || s == "lightning_attn" || s == "lightning")
      c.mixer_types.push_back(MixerType::Lightning);
    else
      fail("{}: mixer_types[{}] is unknown mixer type \"{}\" (expected \"minicpm4\" or "
           "\"lightning-attn\")", source, i, s);
  }
  if (c.mixer_types[0] != MixerType::Sparse)
    fail("{}: mixer_types[0] must be \"minicpm4\" (the HF cache takes the sequence length from "
         "layer 0)", source);

  c.quantization =
      parse_quantization_config(j.value("quantization_config", json(nullptr)), source);

  const json& sp = r.at("sparse_config");
  if (!sp.is_object()) fail("{}: key 'sparse_config' must be an object", source);
  Reader s{sp, source, "sparse_config."};
  c.sparse.block_size = s.get_pos_int("block_size");
  c.sparse.dense_len = s.get_pos_int("dense_len");
  c.sparse.init_blocks = s.get_int("init_blocks");
  c.sparse.kernel_size = s.get_pos_int("kernel_size");
  c.sparse.kernel_stride = s.get_pos_int("kernel_stride");
  c.sparse.topk = s.get_pos_int("topk");
  c.sparse.window_size = s.get_pos_int("window_size");
  c.sparse.use_nope = s.opt_bool("use_nope", false);
  if (c.sparse.use_nope)
    fail("{}: key 'sparse_config.use_nope' is true; only the released value false is supported",
         source);
  if (c.sparse.init_blocks < 0) fail("{}: 'sparse_config.init_blocks' must be >= 0", source);
  if (c.sparse.window_size % c.sparse.block_size)
    fail("{}: sparse_config.window_size must be a multiple of block_size", source);
  if (c.sparse.block_size % c.sparse.level2_stride())
    fail("{}: sparse_config.block_size ({}) must be a multiple of 4*kernel_stride ({})", source,
         c.sparse.block_size, c.sparse.level2_stride());
  if (c.sparse.kernel_size < c.sparse.kernel_stride)
    fail("{}: sparse_config.kernel_size must be >= kernel_stride", source);
  return c;
}
}  // namespace

ModelConfig parse_model_config(const std::string& text, const std::string& source) {
  // A value of an unexpected JSON type deep inside (e.g. a config group that is not an
  // object) surfaces as nlohmann's type_error: still a bad file, refused naming the file.
  try {
    return parse_model_config_json(text, source);
  } catch (const json::exception& e) {
    fail("{}: invalid config: {}", source, e.what());
  }
}

ModelConfig load_model_config(const std::string& path_or_dir) {
  std::filesystem::path p(path_or_dir);
  if (std::filesystem::is_directory(p)) p /= "config.json";
  std::ifstream in(p);
  if (!in) fail("{}: cannot read config", p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config(ss.str(), p.string());
}

}  // namespace sala
