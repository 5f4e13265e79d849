#include "model/calibrate.h"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "backend/cache_layout.h"
#include "core/error.h"
#include "model/minicpm_sala.h"
#include "model/weights.h"

namespace sala {
using json = nlohmann::json;

std::string LinearFamily::label() const { return fmt::format("layer {} {}", layer, name); }

std::vector<LinearFamily> linear_families(const ModelConfig& c) {
  std::vector<LinearFamily> out;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    const bool sparse = c.mixer_types[size_t(i)] == MixerType::Sparse;
    out.push_back({i, "self_attn.qkvg",
                   {p + "self_attn.q_proj", p + "self_attn.k_proj", p + "self_attn.v_proj",
                    p + (sparse ? "self_attn.o_gate" : "self_attn.z_proj")}});
    out.push_back({i, "self_attn.o_proj", {p + "self_attn.o_proj"}});
    out.push_back({i, "mlp.gate_up", {p + "mlp.gate_proj", p + "mlp.up_proj"}});
    out.push_back({i, "mlp.down_proj", {p + "mlp.down_proj"}});
  }
  return out;
}

namespace {

// The unquantized model on the CPU in fp32, whose F32 projection weights (backend memory) are
// overwritten in place with dequantized codes and restored from the checkpoint: what every
// measurement here runs.
class CalibrationModel {
 public:
  CalibrationModel(const std::string& dir, const std::vector<std::vector<int32_t>>& seqs)
      : ckpt_(dir), seqs_(seqs) {
    cfg_ = load_model_config(dir);
    int32_t longest = 1;
    for (auto& s : seqs) longest = std::max<int32_t>(longest, int32_t(s.size()));
    ModelLimits lim;
    lim.max_step_tokens = lim.max_logit_rows = longest;
    lim.caches = {int32_t(cache_layout::pages_for(longest, cfg_.sparse.block_size)) + 1,
                  cfg_.sparse.block_size, 1};
    model_ = std::make_unique<Model>(cfg_, make_backend("cpu", BackendOptions{}), ckpt_, lim);
  }
  const ModelConfig& config() const { return cfg_; }
  Backend& backend() { return model_->backend(); }

  // The stacked weight of family f ([Σ rows, K] F32 in backend memory).
  const Weight& weight(const LinearFamily& f) const {
    const LayerWeights& l = model_->weights().layers[size_t(f.layer)];
    if (f.name == "self_attn.qkvg") return l.qkvg;
    if (f.name == "self_attn.o_proj") return l.o_proj;
    if (f.name == "mlp.gate_up") return l.gate_up;
    return l.down_proj;
  }
  float* values(const LinearFamily& f) {
    const Weight& w = weight(f);
    SALA_CHECK(w.format == WeightFormat::F32, "calibration model weights must be F32");
    return static_cast<float*>(w.data);
  }
  // The checkpoint's values of family f, stacked: [Σ rows, K] fp32.
  std::vector<float> original(const LinearFamily& f) const {
    const Weight& w = weight(f);
    std::vector<float> v(size_t(w.rows * w.cols));
    size_t off = 0;
    for (const std::string& m : f.modules) {
      const TensorView& t = ckpt_.get(m + ".weight");
      t.to_f32(v.data() + off);
      off += size_t(t.numel());
    }
    return v;
  }
  void restore(const LinearFamily& f) {
    const std::vector<float> v = original(f);
    std::memcpy(values(f), v.data(), v.size() * 4);
  }
  // Family f's modules' codes (from `codes`), dequantized into the model.
  void set_int4(const LinearFamily& f, const Int4CodeMap& codes) {
    const Weight& w = weight(f);
    float* dst = values(f);
    for (const std::string& m : f.modules) {
      const Int4Codes& c = codes.at(m);
      const int64_t rows = int64_t(c.scales.size()) / (w.cols / c.group);
      const std::vector<float> v = int4_dequantize(c, rows, w.cols);
      std::memcpy(dst, v.data(), v.size() * 4);
      dst += v.size();
    }
  }
  // Logits [n, V] of every position of sequence s (one prefill).
  std::vector<float> logits(size_t s) {
    StepMeta meta;
    std::vector<int32_t> pages(size_t(model_->limits().caches.num_pages));
    for (size_t i = 0; i < pages.size(); ++i) pages[i] = int32_t(i);
    meta.add_seq(seqs_[s].data(), int32_t(seqs_[s].size()), 0, 0, pages, true, false);
    std::vector<float> out;
    model_->forward(meta, out);
    return out;
  }
  int64_t rows_of(const std::string& module) const {
    return ckpt_.get(module + ".weight").shape[0];
  }
  size_t num_seqs() const { return seqs_.size(); }
  const std::vector<int32_t>& seq(size_t s) const { return seqs_[s]; }

 private:
  ModelConfig cfg_;
  Checkpoint ckpt_;
  const std::vector<std::vector<int32_t>>& seqs_;
  std::unique_ptr<Model> model_;
};

// log-softmax of one logits row (double).
void log_softmax(const float* x, int64_t V, std::vector<double>& out) {
  const float mx = *std::max_element(x, x + V);
  double z = 0;
  for (int64_t j = 0; j < V; ++j) z += std::exp(double(x[j] - mx));
  const double lz = std::log(z) + mx;
  out.resize(size_t(V));
  for (int64_t j = 0; j < V; ++j) out[size_t(j)] = double(x[j]) - lz;
}

// The unquantized model's log-probabilities and argmaxes on the calibration text, and the
// loss of the model's current weights against them.
class Reference {
 public:
  explicit Reference(CalibrationModel& m) : m_(m), V_(m.config().vocab_size) {
    std::vector<double> lp;
    for (size_t s = 0; s < m.num_seqs(); ++s) {
      const std::vector<float> lg = m.logits(s);
      for (size_t p = 0; p + 1 < m.seq(s).size(); ++p) {
        log_softmax(&lg[p * size_t(V_)], V_, lp);
        logp_.insert(logp_.end(), lp.begin(), lp.end());
        argmax_.push_back(int32_t(std::max_element(lp.begin(), lp.end()) - lp.begin()));
        correct_ += argmax_.back() == m.seq(s)[p + 1];
      }
    }
    base_ = measure();
  }
  const CalibrationLoss& base() const { return base_; }
  CalibrationLoss measure() {
    CalibrationLoss l;
    size_t pos = 0;
    std::vector<double> lp;
    for (size_t s = 0; s < m_.num_seqs(); ++s) {
      const std::vector<float> lg = m_.logits(s);
      for (size_t p = 0; p + 1 < m_.seq(s).size(); ++p, ++pos) {
        log_softmax(&lg[p * size_t(V_)], V_, lp);
        const double* ref = &logp_[pos * size_t(V_)];
        double kl = 0;
        for (int64_t j = 0; j < V_; ++j) kl += std::exp(ref[j]) * (ref[j] - lp[size_t(j)]);
        l.mean_kl += kl;
        const int32_t top = int32_t(std::max_element(lp.begin(), lp.end()) - lp.begin());
        l.accuracy += top == m_.seq(s)[p + 1];
        l.agreement += top == argmax_[pos];
        l.lost += argmax_[pos] == m_.seq(s)[p + 1] && top != argmax_[pos];
      }
    }
    l.lost *= 100.0 / double(std::max<size_t>(correct_, 1));
    const double n = double(std::max<size_t>(pos, 1));
    l.mean_kl /= n;
    l.accuracy *= 100.0 / n;
    l.agreement *= 100.0 / n;
    return l;
  }

 private:
  CalibrationModel& m_;
  int64_t V_;
  std::vector<double> logp_;    // [positions, V]
  std::vector<int32_t> argmax_;  // [positions]
  size_t correct_ = 0;           // positions whose argmax is the text's next token
  CalibrationLoss base_;
};

// H = Σ 2 x xᵀ [K, K] of each family's GEMM input rows x over the calibration text (the
// model as it is now), from its first module's GEMM (the others read the same input).
std::vector<std::vector<double>> collect_hessians(CalibrationModel& m,
                                                  const std::vector<const LinearFamily*>& fams) {
  std::vector<std::vector<double>> H(fams.size());
  for (size_t i = 0; i < fams.size(); ++i)
    H[i].assign(size_t(m.weight(*fams[i]).cols * m.weight(*fams[i]).cols), 0.0);
  std::vector<double> xd;
  m.backend().set_linear_observer([&](const Weight& w, const Tensor& x) {
    for (size_t i = 0; i < fams.size(); ++i) {
      if (w.data != m.weight(*fams[i]).data) continue;
      const int64_t K = x.cols, T = x.rows;
      xd.resize(size_t(T * K));
      const float* xp = static_cast<const float*>(x.data);
      for (size_t j = 0; j < xd.size(); ++j) xd[j] = xp[j];
      cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, int(K), int(T), 2.0, xd.data(), int(K),
                  1.0, H[i].data(), int(K));  // upper triangle
    }
  });
  for (size_t s = 0; s < m.num_seqs(); ++s) m.logits(s);
  m.backend().set_linear_observer(nullptr);
  for (size_t i = 0; i < fams.size(); ++i) {  // mirror the upper triangle
    const int64_t K = m.weight(*fams[i]).cols;
    for (int64_t a = 0; a < K; ++a)
      for (int64_t b = 0; b < a; ++b) H[i][size_t(a * K + b)] = H[i][size_t(b * K + a)];
  }
  return H;
}

}  // namespace

Int4CodeMap quantize_int4(const std::string& model_dir,
                          const std::vector<std::vector<int32_t>>& seqs, const Int4Quantizer& q,
                          const std::function<void(const std::string&)>& progress) {
  CalibrationModel m(model_dir, seqs);
  const std::vector<LinearFamily> families = linear_families(m.config());
  Int4CodeMap codes;
  for (int layer = 0; layer < m.config().num_hidden_layers; ++layer) {
    std::vector<const LinearFamily*> fams;
    for (const LinearFamily& f : families)
      if (f.layer == layer) fams.push_back(&f);
    std::vector<std::vector<double>> H;
    if (q.gptq) H = collect_hessians(m, fams);
    for (size_t i = 0; i < fams.size(); ++i) {
      const LinearFamily& f = *fams[i];
      const Weight& w = m.weight(f);
      const std::vector<float> orig = m.original(f);
      Int4Codes all;
      if (q.gptq) {
        all = gptq_quantize(orig.data(), w.rows, w.cols, std::move(H[i]), q.gptq_opts);
      } else {
        all = rtn_quantize(orig.data(), w.rows, w.cols, q.gptq_opts.group);
      }
      // Split the stacked rows into the modules' codes.
      const int64_t wpr = w.cols / 8, spr = w.cols / all.group;
      int64_t r0 = 0;
      for (size_t j = 0; j < f.modules.size(); ++j) {
        const int64_t rows = m.rows_of(f.modules[j]);
        Int4Codes c;
        c.group = all.group;
        c.words.assign(all.words.begin() + r0 * wpr, all.words.begin() + (r0 + rows) * wpr);
        c.scales.assign(all.scales.begin() + r0 * spr, all.scales.begin() + (r0 + rows) * spr);
        codes[f.modules[j]] = std::move(c);
        r0 += rows;
      }
      m.set_int4(f, codes);  // later layers calibrate on this layer's quantized outputs
    }
    if (progress)
      progress(fmt::format("{} layer {}/{}", q.gptq ? "GPTQ" : "RTN", layer + 1,
                           m.config().num_hidden_layers));
  }
  return codes;
}

QuantPlan mixed_plan(const std::string& model_dir, const std::vector<std::vector<int32_t>>& seqs,
                     const Int4CodeMap& codes, int32_t group, double max_accuracy_loss,
                     json* record, std::string* report,
                     const std::function<void(const std::string&)>& progress) {
  CalibrationModel m(model_dir, seqs);
  Reference ref(m);
  const std::vector<LinearFamily> families = linear_families(m.config());
  // Sensitivity: the loss with one family 4-bit, the rest unquantized.
  std::vector<CalibrationLoss> alone(families.size());
  for (size_t i = 0; i < families.size(); ++i) {
    m.set_int4(families[i], codes);
    alone[i] = ref.measure();
    m.restore(families[i]);
    if (progress)
      progress(fmt::format("sensitivity {}/{} ({}: KL {:.4g})", i + 1, families.size(),
                           families[i].label(), alone[i].mean_kl));
  }
  std::vector<size_t> order(families.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return alone[a].mean_kl > alone[b].mean_kl; });
  // All 4-bit, then keep the most sensitive families dense one by one until the budget holds.
  for (const LinearFamily& f : families) m.set_int4(f, codes);
  std::vector<bool> dense(families.size(), false);
  auto loss_of = [&](const CalibrationLoss& l) { return l.lost; };
  CalibrationLoss now = ref.measure();
  json steps = json::array();
  steps.push_back({{"dense", 0}, {"accuracy_loss", loss_of(now)}, {"mean_kl", now.mean_kl}});
  size_t kept = 0;
  while (loss_of(now) > max_accuracy_loss && kept < order.size()) {
    dense[order[kept]] = true;
    m.restore(families[order[kept]]);
    ++kept;
    now = ref.measure();
    steps.push_back({{"dense", kept}, {"kept", families[order[kept - 1]].label()},
                     {"accuracy_loss", loss_of(now)}, {"mean_kl", now.mean_kl}});
    if (progress)
      progress(fmt::format("plan: {} dense, {:.3f} % of right predictions lost, KL {:.4g}", kept,
                           loss_of(now), now.mean_kl));
  }
  QuantPlan plan;
  json fams = json::array();
  std::string table = fmt::format(
      "{:<28} {:>10} {:>10} {:>8}  {}\n", "family", "KL alone", "lost alone", "rank", "scheme");
  for (size_t i = 0; i < families.size(); ++i) {
    const size_t rank = size_t(std::find(order.begin(), order.end(), i) - order.begin()) + 1;
    const std::string scheme = dense[i] ? "bf16" : fmt::format("w4a16 g{}", group);
    table += fmt::format("{:<28} {:>10.4g} {:>10.3f} {:>8}  {}\n", families[i].label(),
                         alone[i].mean_kl, alone[i].lost, rank, scheme);
    fams.push_back({{"family", families[i].label()}, {"modules", families[i].modules},
                    {"kl_alone", alone[i].mean_kl}, {"lost_alone", alone[i].lost},
                    {"scheme", scheme}});
    if (!dense[i])
      for (const std::string& mod : families[i].modules)
        plan[mod] = {QuantScheme::W4A16, group};
  }
  table += fmt::format(
      "calibration: {} positions; unquantized next-token accuracy {:.3f} %; plan: {} of {} "
      "families dense, accuracy {:.3f} %, {:.3f} % of the unquantized model's right predictions "
      "lost (budget {}), mean KL {:.4g}, agreement {:.2f} %\n",
      [&] { size_t n = 0; for (auto& s : seqs) n += s.size() - 1; return n; }(),
      ref.base().accuracy, kept, families.size(), now.accuracy, now.lost, max_accuracy_loss,
      now.mean_kl, now.agreement);
  if (report) *report = table;
  if (record)
    *record = {{"method", "sala quantize --scheme mixed: families kept bf16, most KL-sensitive "
                          "first, until the share of the unquantized model's right next-token "
                          "predictions on the calibration text that the plan loses is within "
                          "max_accuracy_loss (percent)"},
               {"max_accuracy_loss", max_accuracy_loss},
               {"unquantized_accuracy", ref.base().accuracy},
               {"plan_accuracy", now.accuracy}, {"plan_lost", now.lost},
               {"plan_mean_kl", now.mean_kl},
               {"families", fams}, {"steps", steps}};
  return plan;
}

std::vector<FamilyHessian> family_hessians(const std::string& model_dir,
                                           const std::vector<std::vector<int32_t>>& seqs,
                                           int layer) {
  CalibrationModel m(model_dir, seqs);
  const std::vector<LinearFamily> families = linear_families(m.config());
  std::vector<const LinearFamily*> fams;
  for (const LinearFamily& f : families)
    if (f.layer == layer) fams.push_back(&f);
  std::vector<std::vector<double>> H = collect_hessians(m, fams);
  std::vector<FamilyHessian> out;
  for (size_t i = 0; i < fams.size(); ++i) {
    const Weight& w = m.weight(*fams[i]);
    out.push_back({*fams[i], m.original(*fams[i]), w.rows, w.cols, std::move(H[i])});
  }
  return out;
}

}  // namespace sala
