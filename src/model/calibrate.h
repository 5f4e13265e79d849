// Calibration for `sala quantize --scheme w4a16 | mixed`: run the model (CPU, fp32) on
// calibration text, collect each linear layer's input Hessian, quantize layer by layer with
// GPTQ (model/gptq.h), and measure what quantizing a part costs (teacher-forced KL and
// next-token accuracy against the unquantized model).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "model/gptq.h"
#include "model/quantize.h"

namespace sala {

// Calibration text arrives tokenized (the model library has no tokenizer): `sala quantize`
// (cli/cmd_quantize.cpp) encodes its --calibration file or its built-in text.

// The Linear modules of one layer that read the same input (one Hessian), stacked at load:
// "self_attn.qkvg" (q, k, v, o_gate / z_proj), "self_attn.o_proj", "mlp.gate_up" (gate, up),
// "mlp.down_proj".
struct LinearFamily {
  int layer = 0;
  std::string name;                  // e.g. "mlp.gate_up"
  std::vector<std::string> modules;  // checkpoint module names, in stacking order
  std::string label() const;         // "layer 3 mlp.gate_up"
};
std::vector<LinearFamily> linear_families(const ModelConfig& c);

// How far a configuration's logits are from the unquantized model's on the calibration text.
struct CalibrationLoss {
  double mean_kl = 0;       // mean KL(unquantized ‖ this) per position
  double accuracy = 0;      // % of positions whose argmax is the text's next token
  double agreement = 0;     // % of positions whose argmax equals the unquantized one's
  double lost = 0;          // % of the positions the unquantized model predicts right (argmax
                            // = the next token) whose argmax changed: its answers lost
};

struct Int4Quantizer {
  bool gptq = true;  // else RTN
  GptqOptions gptq_opts;
};

// W4A16 codes of every family's modules of `model_dir`, layer by layer: layer i's Hessians are
// collected with layers < i already replaced by their dequantized codes (sequential GPTQ;
// memory: the fp32 model plus one layer's Hessians). RTN needs no calibration run.
// progress(text) after each layer.
Int4CodeMap quantize_int4(const std::string& model_dir,
                          const std::vector<std::vector<int32_t>>& seqs, const Int4Quantizer& q,
                          const std::function<void(const std::string&)>& progress);

// The mixed plan (`--scheme mixed --max-accuracy-loss X`): every family's sensitivity (the loss
// when it alone is 4-bit), then families kept dense (bf16), most sensitive first, until the
// plan's accuracy loss on the calibration text is <= max_accuracy_loss: the percent of the
// positions whose next token the unquantized model predicts right (argmax) where the plan's
// argmax differs (CalibrationLoss::lost; an eval answer is lost the same way, one changed token
// at a time). Returns the plan (W4A16 modules only; the
// rest stay as they are) and fills `record` with what was measured (written into the
// checkpoint's quantization_config) and `report` with the printed table.
QuantPlan mixed_plan(const std::string& model_dir, const std::vector<std::vector<int32_t>>& seqs,
                     const Int4CodeMap& codes, int32_t group, double max_accuracy_loss,
                     nlohmann::json* record, std::string* report,
                     const std::function<void(const std::string&)>& progress);

// Layer `layer`'s families of the unquantized model: stacked weights W [rows, cols] and the
// Hessians H [cols, cols] of their inputs on `seqs` (what GPTQ quantizes them with; tests).
struct FamilyHessian {
  LinearFamily family;
  std::vector<float> weight;
  int64_t rows = 0, cols = 0;
  std::vector<double> H;
};
std::vector<FamilyHessian> family_hessians(const std::string& model_dir,
                                           const std::vector<std::vector<int32_t>>& seqs,
                                           int layer);

}  // namespace sala
