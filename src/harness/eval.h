// `sala eval`: the accuracy evaluation of the SOAR toolkit (eval_model.py).
// Data: JSONL with `question`, `task`, `gold` (string or list of strings).
// Each question goes to POST /v1/chat/completions as one user message, temperature 0,
// max_tokens, stop ["</s>", "<|im_end|>"]; the answer is scored on the text after the last
// "</think>" (the whole text when there is none):
//   mcq            1 if the last `ANSWER: X` (keyword any case, X an uppercase letter that
//                  ends the word; "：" and "(X)" / "**X**" accepted) or `\boxed{X}` (any case,
//                  X alone inside, `\text{X}` / `(X)` accepted) names a gold letter, else 0;
//   qa, niah, lcx  1 if any gold string is contained (case-insensitive), else 0 (also used
//                  for unknown tasks);
//   cwe, fwe       fraction of the gold words contained (case-insensitive).
// ori_accuracy = 100 * mean score; overall_accuracy = min(ori_accuracy / 80 * 100, 100).
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace sala::harness {

// Text after the last "</think>" (all of it when there is none).
std::string answer_region(const std::string& prediction);
// The chosen letter of an mcq answer region (last ANSWER: X or \boxed{X}), if any.
std::optional<char> extract_mcq_choice(const std::string& region);
// Gold as a list of strings (a string gives one entry; numbers are printed).
std::vector<std::string> gold_list(const nlohmann::json& gold);
// The score in [0, 1] of one prediction (the full model output).
double score_prediction(const std::string& task, const nlohmann::json& gold,
                        const std::string& prediction);

struct EvalItem {
  int64_t index = 0;
  std::string question, task;
  nlohmann::json gold;
};
std::vector<EvalItem> load_eval_items(const std::string& path, int64_t num_samples = -1);

struct EvalRecord {
  int64_t index = 0;
  std::string task;
  nlohmann::json gold;
  std::string prediction;
  double score = 0;
  std::string finish_reason;
  int64_t completion_tokens = -1;
  double latency_s = 0;
  std::string error;  // non-empty: the request failed (score 0)
};

struct TaskScore {
  int64_t n = 0;
  double sum = 0;
};
struct EvalSummary {
  int64_t n = 0, errors = 0;
  std::map<std::string, TaskScore> per_task;
  double ori_accuracy = 0, overall_accuracy = 0;
};
EvalSummary summarize_eval(const std::vector<EvalRecord>& records);
std::string format_eval_summary(const EvalSummary& s);
nlohmann::json eval_summary_json(const EvalSummary& s);
nlohmann::json eval_record_json(const EvalRecord& r);

struct EvalOptions {
  std::string base_url;
  std::string model;          // empty: GET /v1/models
  int concurrency = 8;
  int64_t max_tokens = 65536;
  double timeout_s = 3000;
  bool progress = true;
};

nlohmann::json chat_payload(const std::string& model, const std::string& question, int64_t max_tokens);
EvalRecord eval_one(const EvalOptions& opt, const std::string& model, const EvalItem& item);
std::vector<EvalRecord> run_eval(const EvalOptions& opt, const std::vector<EvalItem>& items);

}  // namespace sala::harness
