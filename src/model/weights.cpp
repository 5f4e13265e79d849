#include "model/weights.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <set>

#include "core/error.h"
#include "core/parallel.h"

namespace sala {

std::string module_of(const std::string& name) {
  return name.ends_with(".weight") ? name.substr(0, name.size() - std::string(".weight").size())
                                   : name;
}

ModuleQuant stored_scheme(const ModelConfig& c, const std::string& name, size_t ndim) {
  if (!c.quantization.any() || ndim != 2 || name == "model.embed_tokens.weight" ||
      !name.ends_with(".weight"))
    return {};
  return c.quantization.scheme_of(module_of(name), c.source);
}

bool stored_fp8(const ModelConfig& c, const std::string& name, size_t ndim) {
  return stored_scheme(c, name, ndim).scheme == QuantScheme::FP8_W8A8;
}

int32_t int4_group(const ModelConfig& c, const ModuleQuant& q, const std::string& module,
                   int64_t in) {
  const int64_t g = q.group_size > 0 ? q.group_size : in;
  if (in % g != 0 || in % 8 != 0)
    fail("{}: module '{}' has {} input columns: the int4 group size {} must divide them, and "
         "they must be a multiple of 8 (eight int4 values per int32)", c.source, module, in, g);
  return int32_t(g);
}

std::string scheme_name(const ModuleQuant& q) {
  switch (q.scheme) {
    case QuantScheme::None: return "dense";
    case QuantScheme::FP8_W8A8: return "fp8";
    case QuantScheme::W4A16:
      return q.group_size > 0 ? fmt::format("w4a16 (group {})", q.group_size)
                              : "w4a16 (per channel)";
  }
  return "?";
}

std::vector<std::pair<std::string, std::vector<int64_t>>> expected_tensors(const ModelConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  std::vector<std::pair<std::string, std::vector<int64_t>>> t;
  t.push_back({"model.embed_tokens.weight", {V, H}});
  t.push_back({"model.norm.weight", {H}});
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", {V, H}});
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    t.push_back({p + "input_layernorm.weight", {H}});
    t.push_back({p + "post_attention_layernorm.weight", {H}});
    t.push_back({p + "mlp.gate_proj.weight", {I, H}});
    t.push_back({p + "mlp.up_proj.weight", {I, H}});
    t.push_back({p + "mlp.down_proj.weight", {H, I}});
    if (c.mixer_types[size_t(i)] == MixerType::Sparse) {
      const int64_t qd = int64_t(c.num_attention_heads) * c.head_dim;
      const int64_t kvd = int64_t(c.num_key_value_heads) * c.head_dim;
      t.push_back({p + "self_attn.q_proj.weight", {qd, H}});
      t.push_back({p + "self_attn.k_proj.weight", {kvd, H}});
      t.push_back({p + "self_attn.v_proj.weight", {kvd, H}});
      t.push_back({p + "self_attn.o_proj.weight", {H, qd}});
      t.push_back({p + "self_attn.o_gate.weight", {qd, H}});
    } else {
      const int64_t d = c.lightning_head_dim, ld = int64_t(c.lightning_nh) * d;
      t.push_back({p + "self_attn.q_proj.weight", {ld, H}});
      t.push_back({p + "self_attn.k_proj.weight", {ld, H}});
      t.push_back({p + "self_attn.v_proj.weight", {ld, H}});
      t.push_back({p + "self_attn.o_proj.weight", {H, ld}});
      t.push_back({p + "self_attn.z_proj.weight", {ld, H}});
      t.push_back({p + "self_attn.q_norm.weight", {d}});
      t.push_back({p + "self_attn.k_norm.weight", {d}});
      t.push_back({p + "self_attn.o_norm.weight", {ld}});
    }
  }
  // Quantized modules: FP8 adds per-output-channel scales [out, 1]; W4A16 replaces the weight
  // by its packed codes [out, in / 8], group scales [out, in / group] and its shape [2].
  std::vector<std::pair<std::string, std::vector<int64_t>>> out, scales;
  for (auto& [name, shape] : t) {
    const ModuleQuant q = stored_scheme(c, name, shape.size());
    const std::string m = module_of(name);
    if (q.scheme == QuantScheme::W4A16) {
      const int64_t g = int4_group(c, q, m, shape[1]);
      out.push_back({m + ".weight_packed", {shape[0], shape[1] / 8}});
      scales.push_back({m + ".weight_scale", {shape[0], shape[1] / g}});
      scales.push_back({m + ".weight_shape", {2}});
      continue;
    }
    out.push_back({name, shape});
    if (q.scheme == QuantScheme::FP8_W8A8) scales.push_back({m + ".weight_scale", {shape[0], 1}});
  }
  out.insert(out.end(), scales.begin(), scales.end());
  return out;
}

size_t planned_weight_bytes(const ModelConfig& c, WeightFormat linear, WeightFormat dense,
                            int32_t at_load_group, int int4_copies) {
  size_t bytes = 0;
  for (auto& [name, shape] : expected_tensors(c)) {
    // A pre-quantized checkpoint's FP8 tensors are uploaded as FP8 whatever the backend's
    // linear format (load_weights: upload_fp8); their "<module>.weight_scale" tensors are the
    // scales that storage_bytes counts with them.
    if (name.ends_with(".weight_scale") || name.ends_with(".weight_shape")) continue;
    if (name.ends_with(".weight_packed")) {  // W4A16: codes and one fp32 scale per group
      const std::string m = name.substr(0, name.size() - std::string(".weight_packed").size());
      const int64_t in = shape[1] * 8;
      const int32_t g = int4_group(c, c.quantization.scheme_of(m, c.source), m, in);
      bytes +=
          size_t(int4_copies) * Weight::storage_bytes(WeightFormat::INT4_GROUPED, shape[0], in, g);
      continue;
    }
    const bool projection =
        shape.size() == 2 && name != "model.embed_tokens.weight" && name != "lm_head.weight";
    const WeightFormat f = stored_fp8(c, name, shape.size()) ? WeightFormat::FP8_E4M3
                           : projection                      ? linear
                                                             : dense;
    if (f == WeightFormat::FP8_E4M3)  // one scale per output channel
      bytes += Weight::storage_bytes(f, shape[0], shape[1], int32_t(shape[1]));
    else if (f == WeightFormat::INT4_GROUPED)  // quantized at load (BackendOptions)
      bytes += size_t(int4_copies) * Weight::storage_bytes(f, shape[0], shape[1], at_load_group);
    else
      bytes += size_t(shape[0]) * size_t(shape.size() == 2 ? shape[1] : 1) *
               dtype_size(dense_dtype(f));
  }
  return bytes;
}

size_t ModelWeights::body_linear_bytes() const {
  size_t bytes = 0;
  for (const LayerWeights& l : layers)
    bytes += l.qkvg.nbytes() + l.gate_up.nbytes() + l.down_proj.nbytes() + l.o_proj.nbytes();
  return bytes;
}

size_t ModelWeights::linear_bytes() const { return body_linear_bytes() + lm_head.nbytes(); }

// The checkpoint names of sparse layer `layer`'s K or V scale (`which` "k" / "v"): the
// compressed-tensors kv_cache_scheme's (what vLLM and SGLang load), then the older
// "<proj>.output_scale" of AutoFP8 checkpoints that vLLM remaps to the same parameter.
static std::vector<std::string> kv_scale_names(int layer, const char* which) {
  const std::string p = fmt::format("model.layers.{}.self_attn.", layer);
  return {p + which + "_scale", p + which + "_proj.output_scale"};
}

std::vector<KvScales> load_kv_scales(const ModelConfig& c, const Checkpoint& ckpt) {
  auto one = [&](int layer, const char* which) {
    const TensorView* found = nullptr;
    for (const std::string& n : kv_scale_names(layer, which))
      if (const TensorView* t = ckpt.find(n)) {
        if (found)
          fail("{}: both '{}' and '{}' give layer {}'s {} scale", t->file, found->name, n,
               layer, which);
        found = t;
      }
    if (!found) return kDefaultKvScale;
    if (found->numel() != 1 || found->shape.size() > 1)
      fail("{}: KV scale '{}' has shape {}; expected a scalar or [1]", found->file, found->name,
           found->shape_str());
    if (found->dtype != DType::F32 && found->dtype != DType::BF16 && found->dtype != DType::F16)
      fail("{}: KV scale '{}' is {}; expected F32, BF16 or F16", found->file, found->name,
           dtype_name(found->dtype));
    const float v = found->get_f32(0);
    if (!(v > 0.f) || !std::isfinite(v))
      fail("{}: KV scale '{}' is {}; it must be finite and > 0", found->file, found->name, v);
    return v;
  };
  std::vector<KvScales> out;
  for (int i = 0; i < c.num_hidden_layers; ++i)
    if (c.mixer_types[size_t(i)] == MixerType::Sparse) out.push_back({one(i, "k"), one(i, "v")});
  return out;
}

static bool is_rope_buffer(const std::string& name) {
  for (const char* s : {"rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached"})
    if (name.find(s) != std::string::npos) return true;
  return false;
}

// A W4A16 module's "<m>.weight_packed" / "<m>.weight_shape" (shapes already checked): I32,
// the shape tensor equal to the module's [out, in]; and no tensor of a variant we do not
// implement beside them (a g_idx of activation ordering "group", zero points).
static void check_int4_tensor(const ModelConfig& c, const Checkpoint& ckpt, const TensorView& t) {
  const bool shape_tensor = t.name.ends_with(".weight_shape");  // I32, or I64 as torch saves it
  if (t.dtype != DType::I32 && !(shape_tensor && t.dtype == DType::I64))
    fail("{}: tensor '{}' is {}; {}'s quantization_config (compressed-tensors pack-quantized "
         "int4) makes it I32", t.file, t.name, dtype_name(t.dtype), c.source);
  if (t.name.ends_with(".weight_packed")) {
    const std::string m = t.name.substr(0, t.name.size() - std::string(".weight_packed").size());
    for (const char* extra : {".weight_g_idx", ".weight_zero_point"})
      if (const TensorView* e = ckpt.find(m + extra))
        fail("{}: tensor '{}': {} is not implemented for int4 weights (only symmetric int4 "
             "without activation-order indices)", e->file, e->name,
             std::string(extra) == ".weight_g_idx" ? "a g_idx (activation ordering \"group\")"
                                                   : "a zero point (asymmetric int4)");
    return;
  }
  const std::string m = t.name.substr(0, t.name.size() - std::string(".weight_shape").size());
  for (auto& [name, shape] : expected_tensors(c))
    if (name == m + ".weight_packed") {
      const int64_t rows = t.get_f32(0), cols = t.get_f32(1);
      if (rows != shape[0] || cols != shape[1] * 8)
        fail("{}: tensor '{}' says [{}, {}]; the model's '{}' is [{}, {}]", t.file, t.name, rows,
             cols, m, shape[0], shape[1] * 8);
    }
}

// Rows [r0, r0 + n) of a 2-D checkpoint tensor: a view of the same bytes.
static TensorView rows_of(const TensorView& t, int64_t r0, int64_t n) {
  SALA_CHECK(t.shape.size() == 2 && r0 >= 0 && n >= 0 && r0 + n <= t.shape[0],
             "rows [{}, {}) of '{}' {}", r0, r0 + n, t.name, t.shape_str());
  const size_t row = size_t(t.shape[1]) * dtype_size(t.dtype);
  TensorView v = t;
  v.data = t.data + size_t(r0) * row;
  v.shape = {n, t.shape[1]};
  v.nbytes = size_t(n) * row;
  return v;
}

// Columns [c0, c0 + n) of a 2-D checkpoint tensor, copied into buf (a column slice of a
// row-major matrix is no view); valid while buf is.
static TensorView cols_of(const TensorView& t, int64_t c0, int64_t n, std::vector<uint8_t>& buf) {
  SALA_CHECK(t.shape.size() == 2 && c0 >= 0 && n >= 0 && c0 + n <= t.shape[1],
             "columns [{}, {}) of '{}' {}", c0, c0 + n, t.name, t.shape_str());
  const size_t es = dtype_size(t.dtype), rows = size_t(t.shape[0]), cols = size_t(t.shape[1]);
  buf.resize(rows * size_t(n) * es);
  for (size_t r = 0; r < rows; ++r)
    std::memcpy(buf.data() + r * size_t(n) * es, t.data + (r * cols + size_t(c0)) * es,
                size_t(n) * es);
  TensorView v = t;
  v.data = buf.data();
  v.shape = {t.shape[0], n};
  v.nbytes = buf.size();
  return v;
}

ModelWeights load_weights(const ModelConfig& c, const Checkpoint& ckpt, Backend& backend,
                          std::vector<std::string>* unused, const WeightShard& shard) {
  const auto expected = expected_tensors(c);
  std::set<std::string> wanted;
  for (auto& [name, shape] : expected) {
    const TensorView* t = ckpt.find(name);
    if (!t) fail("checkpoint is missing tensor '{}' (expected shape {})", name, fmt::format("[{}]", fmt::join(shape, ", ")));
    if (t->shape != shape)
      fail("{}: tensor '{}' has shape {}, expected [{}] from {}", t->file, name, t->shape_str(),
           fmt::join(shape, ", "), c.source);
    if (name.ends_with(".weight_packed") || name.ends_with(".weight_shape")) {
      check_int4_tensor(c, ckpt, *t);
      wanted.insert(name);
      continue;
    }
    if (t->dtype == DType::I32 || t->dtype == DType::I64)
      fail("{}: tensor '{}' is {}; weights must be BF16, F16 or F32", t->file, name,
           dtype_name(t->dtype));
    const bool fp8 = stored_fp8(c, name, shape.size());
    if (fp8 && t->dtype != DType::F8_E4M3)
      fail("{}: tensor '{}' is {}; {}'s quantization_config (compressed-tensors FP8) makes it "
           "F8_E4M3", t->file, name, dtype_name(t->dtype), c.source);
    if (!fp8 && t->dtype == DType::F8_E4M3)
      fail("{}: tensor '{}' is F8_E4M3, but {} does not quantize it (no quantization_config, "
           "or the module is in its ignore list)", t->file, name, c.source);
    wanted.insert(name);
  }
  for (int i = 0; i < c.num_hidden_layers; ++i)  // read by load_kv_scales (optional)
    if (c.mixer_types[size_t(i)] == MixerType::Sparse)
      for (const char* which : {"k", "v"})
        for (const std::string& n : kv_scale_names(i, which)) wanted.insert(n);
  if (unused)
    for (auto& [name, t] : ckpt.all())
      if (!wanted.count(name) && !is_rope_buffer(name)) unused->push_back(name);

  const int n_ranks = shard.size;
  SALA_CHECK(n_ranks >= 1 && shard.rank >= 0 && shard.rank < n_ranks, "shard {} of {}",
             shard.rank, n_ranks);
  // Tensor-parallel shards of a quantized checkpoint keep its codes and scales (rows or
  // columns of them); load-time quantization of a shard would see part of a row (refused by
  // Model). lm_head is split by vocabulary, so a quantized one is refused here.
  SALA_CHECK(n_ranks == 1 || backend.linear_format() == backend.weight_format(),
             "load-time quantization of tensor-parallel shards");
  if (n_ranks > 1 && !c.tie_word_embeddings &&
      stored_scheme(c, "lm_head.weight", 2).scheme != QuantScheme::None)
    fail("{}: lm_head is quantized; tensor parallelism splits a dense lm_head only (quantize "
         "without --quantize-lm-head)", c.source);
  // The rank's part of a projection (WeightShard): its output rows, its input columns (a copy
  // in col_buf, valid until the next one), or the whole weight.
  enum class Split { Whole, OutRows, InCols };
  std::vector<uint8_t> col_buf;
  auto sharded = [&](const TensorView& t, Split split) {
    if (n_ranks == 1 || split == Split::Whole) return t;
    if (split == Split::OutRows) {
      const int64_t rows = t.shape[0] / n_ranks;
      return rows_of(t, shard.rank * rows, rows);
    }
    const int64_t cols = t.shape[1] / n_ranks;
    return cols_of(t, shard.rank * cols, cols, col_buf);
  };
  auto up = [&](const std::string& name) { return backend.upload_weight(ckpt.get(name)); };
  // Projections in the backend's linear format (quantized when BackendOptions asks); lm_head
  // stays in the dense format.
  const WeightFormat proj = backend.linear_format();
  // A quantized checkpoint's weights keep their codes and scales (Backend::upload_fp8 /
  // upload_int4); projections stacked at load must share one scheme.
  auto scales_of = [&](const std::string& name) {  // from "<module>.weight_scale", row-major
    const TensorView& s = ckpt.get(module_of(name) + ".weight_scale");
    std::vector<float> v(size_t(s.numel()));
    s.to_f32(v.data());
    return v;
  };
  auto scheme = [&](const std::string& name) { return stored_scheme(c, name, 2); };
  auto packed_of = [&](const std::string& name) -> const TensorView& {
    return ckpt.get(module_of(name) + ".weight_packed");
  };
  auto group_of = [&](const std::string& name) {
    return int4_group(c, scheme(name), module_of(name), packed_of(name).shape[1] * 8);
  };
  // The rank's scales of a quantized projection [N rows, S per row] (FP8: S = 1, per output
  // channel; W4A16: S = K / group): its rows' (OutRows), its groups' (InCols: an FP8 row's one
  // scale stays whole), or all.
  auto shard_scales = [&](const std::string& name, Split split) {
    std::vector<float> v = scales_of(name);
    if (n_ranks == 1 || split == Split::Whole) return v;
    const TensorView& st = ckpt.get(module_of(name) + ".weight_scale");
    const int64_t N = st.shape[0], S = st.numel() / N;
    if (split == Split::OutRows) {
      const int64_t rows = N / n_ranks;
      return std::vector<float>(v.begin() + shard.rank * rows * S,
                                v.begin() + (shard.rank + 1) * rows * S);
    }
    if (S == 1) return v;
    std::vector<float> out;
    const int64_t cols = S / n_ranks;
    for (int64_t r = 0; r < N; ++r)
      out.insert(out.end(), v.begin() + r * S + shard.rank * cols,
                 v.begin() + r * S + (shard.rank + 1) * cols);
    return out;
  };
  // A W4A16 projection's input columns split over the ranks must keep whole groups and words.
  auto check_int4_cols = [&](const std::string& name) {
    const int64_t K = packed_of(name).shape[1] * 8, g = group_of(name);
    if (K % (int64_t(n_ranks) * g) != 0)
      fail("{}: module '{}' has {} input columns in groups of {}: --tp-size {} would split a "
           "group", c.source, module_of(name), K, g, n_ranks);
  };
  auto up_linear = [&](const std::string& name, WeightFormat f, Split split = Split::Whole) {
    if (scheme(name).scheme == QuantScheme::W4A16) {
      if (n_ranks > 1 && split == Split::InCols) check_int4_cols(name);
      return backend.upload_int4(sharded(packed_of(name), split), shard_scales(name, split),
                                 group_of(name));
    }
    const TensorView t = sharded(ckpt.get(name), split);
    return t.dtype == DType::F8_E4M3 ? backend.upload_fp8(t, shard_scales(name, split))
                                      : backend.upload_linear(t, f);
  };
  // Several [N_i, K] weights stacked into one [Σ N_i, K] upload (one dtype: the checkpoint's
  // if all parts share it, else fp32; W4A16 parts: their packed rows and scales stacked),
  // returned with its row-slice views.
  auto up_stacked = [&](const std::vector<std::string>& names, std::vector<Weight*> views,
                        Split split) {
    for (auto& n : names)
      if (!(scheme(n) == scheme(names[0])))
        fail("{}: '{}' ({}) and '{}' ({}) are stacked at load (one GEMM) and must share one "
             "quantization scheme", c.source, module_of(names[0]), scheme_name(scheme(names[0])),
             module_of(n), scheme_name(scheme(n)));
    const bool int4 = scheme(names[0]).scheme == QuantScheme::W4A16;
    std::vector<TensorView> part_views;  // the rank's rows of each
    for (auto& n : names) part_views.push_back(sharded(int4 ? packed_of(n) : ckpt.get(n), split));
    std::vector<const TensorView*> parts;
    for (const TensorView& t : part_views) parts.push_back(&t);
    bool same = true;
    for (auto* t : parts) same &= t->dtype == parts[0]->dtype;
    const bool fp8 = parts[0]->dtype == DType::F8_E4M3;
    if (fp8 && !same)
      fail("{}: '{}' and the projections stacked with it must all be F8_E4M3 or all dense",
           parts[0]->file, names[0]);
    const int64_t K = parts[0]->shape.back();  // packed int4: K / 8 words
    int64_t rows = 0;
    for (auto* t : parts) rows += t->numel() / K;
    TensorView v;
    v.name = names[0] + " (stacked)";
    v.file = parts[0]->file;
    v.dtype = same ? parts[0]->dtype : DType::F32;
    v.shape = {rows, K};
    // Uninitialized: every byte is copied in, on all cores (core/parallel.h).
    v.nbytes = size_t(rows * K) * dtype_size(v.dtype);
    const auto buf = std::make_unique_for_overwrite<uint8_t[]>(v.nbytes);
    size_t off = 0;
    for (auto* t : parts) {
      if (same) {
        parallel_copy(buf.get() + off, t->data, t->nbytes);
        off += t->nbytes;
      } else {
        t->to_f32(reinterpret_cast<float*>(buf.get() + off));
        off += size_t(t->numel()) * 4;
      }
    }
    v.data = buf.get();
    std::vector<float> scales;
    if (fp8 || int4)
      for (auto& n : names) {
        const std::vector<float> s = shard_scales(n, split);
        scales.insert(scales.end(), s.begin(), s.end());
      }
    Weight all = int4  ? backend.upload_int4(v, scales, group_of(names[0]))
                 : fp8 ? backend.upload_fp8(v, scales)
                       : backend.upload_linear(v, proj);
    int64_t r0 = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      const int64_t n = parts[i]->numel() / K;
      *views[i] = all.slice_rows(r0, n);
      r0 += n;
    }
    return all;
  };
  ModelWeights w;
  w.embed_tokens = up("model.embed_tokens.weight");
  w.norm = up("model.norm.weight");
  const int64_t v0 = shard.vocab0, v1 = shard.vocab1 < 0 ? c.vocab_size : shard.vocab1;
  SALA_CHECK(v0 >= 0 && v0 < v1 && v1 <= c.vocab_size, "lm_head rows [{}, {}) of {}", v0, v1,
             c.vocab_size);
  if (c.tie_word_embeddings) {
    w.lm_head = Weight(w.embed_tokens).slice_rows(v0, v1 - v0);
  } else if (v0 == 0 && v1 == c.vocab_size) {
    w.lm_head = up_linear("lm_head.weight", backend.weight_format());
  } else {
    SALA_CHECK(n_ranks > 1, "a vocabulary slice of lm_head without tensor parallelism");
    w.lm_head = backend.upload_linear(rows_of(ckpt.get("lm_head.weight"), v0, v1 - v0),
                                      backend.weight_format());
  }
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    LayerWeights l;
    l.type = c.mixer_types[size_t(i)];
    l.input_layernorm = up(p + "input_layernorm.weight");
    l.post_attention_layernorm = up(p + "post_attention_layernorm.weight");
    l.gate_up = up_stacked({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"},
                           {&l.gate_proj, &l.up_proj}, Split::OutRows);
    l.down_proj = up_linear(p + "mlp.down_proj.weight", proj, Split::InCols);
    const std::string gate_name =
        p + (l.type == MixerType::Sparse ? "self_attn.o_gate.weight" : "self_attn.z_proj.weight");
    // A sparse mixer whose KV heads do not split is replicated (all its heads on every rank).
    const bool whole_mixer = l.type == MixerType::Sparse && !shard.sparse_split;
    l.qkvg = up_stacked({p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                         p + "self_attn.v_proj.weight", gate_name},
                        {&l.q_proj, &l.k_proj, &l.v_proj, &l.gate},
                        whole_mixer ? Split::Whole : Split::OutRows);
    // o_proj's input columns: the rank's heads (of all heads' output where replicated).
    l.o_proj = up_linear(p + "self_attn.o_proj.weight", proj, Split::InCols);
    if (l.type != MixerType::Sparse) {
      l.q_norm = up(p + "self_attn.q_norm.weight");
      l.k_norm = up(p + "self_attn.k_norm.weight");
      l.o_norm = up(p + "self_attn.o_norm.weight");
    }
    w.layers.push_back(l);
  }
  return w;
}

}  // namespace sala
