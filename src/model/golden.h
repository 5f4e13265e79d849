// Runs the scenarios of a golden case directory (tests/fixtures/golden/README.md, a copy of
// ../shared/golden) through the model and compares logits, hidden states and selected blocks
// with the expected tensors.
#pragma once
#include <string>
#include <vector>

#include "backend/backend.h"

namespace sala {

struct GoldenOptions {
  NumericMode mode = NumericMode::F32;
  std::string device = "cpu";
  std::vector<std::string> only;  // scenario names; empty = all
  bool hidden = false;            // also compare hidden states where the case stores them
  int threads = 0;
  int tp_size = 1;  // tensor-parallel ranks (model/tensor_parallel.h)
};

struct ScenarioResult {
  std::string name;
  bool sparse = false;
  int positions = 0;
  double max_abs_err = 0, max_rel_err = 0;  // rel = max_j|e-r| / max_j|r|, worst position
  int argmax_agree = 0;
  double cos_min = 1, cos_median = 1;
  int cos_below_099 = 0, not_near_top1 = 0;
  int block_rows = 0, block_rows_equal = 0;  // (layer, head, position) rows compared
  double seconds = 0;
  bool pass = false;
  std::string why;  // first failed criterion
  std::vector<std::string> hidden_report;
};

std::vector<ScenarioResult> run_golden(const std::string& case_dir, const GoldenOptions& opts);

}  // namespace sala
