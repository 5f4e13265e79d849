#include "harness/eval.h"

#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "harness/http.h"

namespace sala::harness {

namespace {
std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}
bool is_alnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }
bool is_upper(char c) { return c >= 'A' && c <= 'Z'; }
bool is_alpha(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
void skip_spaces(const std::string& s, size_t& i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
}
std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

// `ANSWER` at i (any case): parse ": X". Returns the letter or 0.
char parse_answer_at(const std::string& s, size_t i) {
  if (i > 0 && is_alpha(s[i - 1])) return 0;  // part of a longer word
  i += 6;
  skip_spaces(s, i);
  if (s.compare(i, 1, ":") == 0) {
    i += 1;
  } else if (s.compare(i, 3, "\xEF\xBC\x9A") == 0) {  // full-width colon
    i += 3;
  } else {
    return 0;
  }
  skip_spaces(s, i);
  while (i < s.size() && (s[i] == '(' || s[i] == '*' || s[i] == '[')) ++i;
  if (i >= s.size() || !is_upper(s[i])) return 0;
  char c = s[i];
  if (i + 1 < s.size() && is_alnum(s[i + 1])) return 0;
  return c;
}

// `\boxed{` at i: the single letter inside, or 0.
char parse_boxed_at(const std::string& s, size_t i) {
  i += 7;  // strlen("\\boxed{")
  size_t close = s.find('}', i);
  std::string in = s.substr(i, close == std::string::npos ? std::string::npos : close - i);
  // \boxed{\text{B}}: the first '}' closes \text{...}
  if (in.rfind("\\text{", 0) == 0 || in.rfind("\\textbf{", 0) == 0 || in.rfind("\\mathrm{", 0) == 0)
    in = in.substr(in.find('{') + 1);
  in = trim(in);
  if (in.size() == 3 && in[0] == '(' && in[2] == ')') in = in.substr(1, 1);
  if (in.size() == 1 && is_alpha(in[0])) return static_cast<char>(std::toupper(static_cast<unsigned char>(in[0])));
  return 0;
}

std::string norm_choice(const std::string& g) {
  std::string t = trim(g);
  while (!t.empty() && (t.front() == '(' || t.front() == '[')) t.erase(0, 1);
  while (!t.empty() && (t.back() == ')' || t.back() == ']' || t.back() == '.')) t.pop_back();
  t = trim(t);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::toupper(c); });
  return t;
}
}  // namespace

std::string answer_region(const std::string& prediction) {
  size_t p = prediction.rfind("</think>");
  return p == std::string::npos ? prediction : prediction.substr(p + 8);
}

std::optional<char> extract_mcq_choice(const std::string& region) {
  std::string low = lower(region);
  size_t best_pos = std::string::npos;
  char best = 0;
  auto consider = [&](size_t pos, char c) {
    if (c && (best_pos == std::string::npos || pos >= best_pos)) {
      best_pos = pos;
      best = c;
    }
  };
  for (size_t i = low.find("answer"); i != std::string::npos; i = low.find("answer", i + 1))
    consider(i, parse_answer_at(region, i));
  for (size_t i = region.find("\\boxed{"); i != std::string::npos; i = region.find("\\boxed{", i + 1))
    consider(i, parse_boxed_at(region, i));
  if (!best) return std::nullopt;
  return best;
}

std::vector<std::string> gold_list(const nlohmann::json& gold) {
  std::vector<std::string> out;
  auto one = [&](const nlohmann::json& g) {
    if (g.is_string())
      out.push_back(g.get<std::string>());
    else if (!g.is_null())
      out.push_back(g.dump());
  };
  if (gold.is_array())
    for (const auto& g : gold) one(g);
  else
    one(gold);
  return out;
}

double score_prediction(const std::string& task, const nlohmann::json& gold, const std::string& prediction) {
  std::string region = answer_region(prediction);
  auto golds = gold_list(gold);
  std::string t = lower(trim(task));
  if (t == "mcq") {
    auto c = extract_mcq_choice(region);
    if (!c) return 0;
    for (const auto& g : golds) {
      // Gold is a letter ("B", "(B)") or itself an answer ("ANSWER: B", "\\boxed{B}").
      auto gc = extract_mcq_choice(g);
      if ((gc ? std::string(1, *gc) : norm_choice(g)) == std::string(1, *c)) return 1;
    }
    return 0;
  }
  std::string low = lower(region);
  if (t == "cwe" || t == "fwe") {
    if (golds.empty()) return 0;
    double hit = 0;
    for (const auto& g : golds)
      if (low.find(lower(g)) != std::string::npos) hit += 1;
    return hit / static_cast<double>(golds.size());
  }
  for (const auto& g : golds)  // qa, niah, lcx and anything else
    if (low.find(lower(g)) != std::string::npos) return 1;
  return 0;
}

std::vector<EvalItem> load_eval_items(const std::string& path, int64_t num_samples) {
  std::ifstream f(path);
  if (!f) fail("cannot open eval data '{}'", path);
  std::vector<EvalItem> items;
  std::string line;
  size_t line_no = 0;
  while (std::getline(f, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    if (num_samples >= 0 && static_cast<int64_t>(items.size()) >= num_samples) break;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      fail("{}:{}: not JSON ({})", path, line_no, e.what());
    }
    if (!j.is_object() || !j.contains("question") || !j["question"].is_string())
      fail("{}:{}: needs a string `question`", path, line_no);
    if (!j.contains("gold")) fail("{}:{}: needs `gold`", path, line_no);
    EvalItem it;
    it.index = static_cast<int64_t>(items.size());
    it.question = j["question"].get<std::string>();
    it.task = j.contains("task") && j["task"].is_string() ? j["task"].get<std::string>() : "qa";
    it.gold = j["gold"];
    items.push_back(std::move(it));
  }
  if (items.empty()) fail("eval data '{}' has no rows", path);
  return items;
}

EvalSummary summarize_eval(const std::vector<EvalRecord>& records) {
  EvalSummary s;
  double sum = 0;
  for (const auto& r : records) {
    ++s.n;
    if (!r.error.empty()) ++s.errors;
    auto& t = s.per_task[r.task];
    ++t.n;
    t.sum += r.score;
    sum += r.score;
  }
  s.ori_accuracy = s.n ? 100.0 * sum / static_cast<double>(s.n) : 0;
  s.overall_accuracy = std::min(s.ori_accuracy / 80.0 * 100.0, 100.0);
  return s;
}

std::string format_eval_summary(const EvalSummary& s) {
  std::string o = fmt::format("\n{:<10} {:>8} {:>10}\n", "task", "n", "accuracy");
  for (const auto& [task, t] : s.per_task)
    o += fmt::format("{:<10} {:>8} {:>9.2f}%\n", task, t.n, t.n ? 100.0 * t.sum / static_cast<double>(t.n) : 0.0);
  o += fmt::format("{:<10} {:>8}\n", "failed", s.errors);
  o += fmt::format("ori_accuracy: {:.2f}\noverall_accuracy: {:.2f}\n", s.ori_accuracy, s.overall_accuracy);
  return o;
}

nlohmann::json eval_summary_json(const EvalSummary& s) {
  nlohmann::json pt = nlohmann::json::object();
  for (const auto& [task, t] : s.per_task)
    pt[task] = {{"n", t.n}, {"accuracy", t.n ? 100.0 * t.sum / static_cast<double>(t.n) : 0.0}};
  return {{"n", s.n}, {"failed", s.errors}, {"per_task", pt},
          {"ori_accuracy", s.ori_accuracy}, {"overall_accuracy", s.overall_accuracy}};
}

nlohmann::json eval_record_json(const EvalRecord& r) {
  nlohmann::json j{{"index", r.index}, {"task", r.task}, {"gold", r.gold}, {"prediction", r.prediction},
                   {"score", r.score}, {"finish_reason", r.finish_reason},
                   {"completion_tokens", r.completion_tokens}, {"latency_s", r.latency_s}};
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

nlohmann::json chat_payload(const std::string& model, const std::string& question, int64_t max_tokens) {
  return {{"model", model},
          {"messages", nlohmann::json::array({{{"role", "user"}, {"content", question}}})},
          {"temperature", 0},
          {"max_tokens", max_tokens},
          {"stop", nlohmann::json::array({"</s>", "<|im_end|>"})}};
}

EvalRecord eval_one(const EvalOptions& opt, const std::string& model, const EvalItem& item) {
  EvalRecord r;
  r.index = item.index;
  r.task = item.task;
  r.gold = item.gold;
  auto t0 = std::chrono::steady_clock::now();
  auto cli = make_client(opt.base_url, opt.timeout_s);
  auto res = cli->Post("/v1/chat/completions", chat_payload(model, item.question, opt.max_tokens).dump(),
                       "application/json");
  r.latency_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!res) {
    r.error = fmt::format("request failed: {}", httplib::to_string(res.error()));
  } else if (res->status != 200) {
    r.error = fmt::format("HTTP {}: {}", res->status, res->body.substr(0, 500));
  } else {
    try {
      auto j = nlohmann::json::parse(res->body);
      const auto& c = j.at("choices").at(0);
      const auto& content = c.at("message").at("content");
      r.prediction = content.is_string() ? content.get<std::string>() : std::string();
      if (c.contains("finish_reason") && c["finish_reason"].is_string())
        r.finish_reason = c["finish_reason"].get<std::string>();
      if (j.contains("usage") && j["usage"].is_object() && j["usage"].contains("completion_tokens"))
        r.completion_tokens = j["usage"]["completion_tokens"].get<int64_t>();
    } catch (const std::exception& e) {
      r.error = fmt::format("bad response ({}): {}", e.what(), res->body.substr(0, 300));
    }
  }
  r.score = r.error.empty() ? score_prediction(item.task, item.gold, r.prediction) : 0.0;
  return r;
}

std::vector<EvalRecord> run_eval(const EvalOptions& opt, const std::vector<EvalItem>& items) {
  std::string model = opt.model.empty() ? served_model_id(opt.base_url) : opt.model;
  const size_t n = items.size();
  std::vector<EvalRecord> recs(n);
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::condition_variable cv;
  size_t done = 0;
  double score_sum = 0;
  size_t failed = 0;
  auto t0 = std::chrono::steady_clock::now();
  size_t workers = std::min<size_t>(static_cast<size_t>(std::max(opt.concurrency, 1)), n);
  std::vector<std::thread> th;
  for (size_t w = 0; w < workers; ++w)
    th.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < n;) {
        EvalRecord r = eval_one(opt, model, items[i]);
        std::lock_guard<std::mutex> lk(mu);
        score_sum += r.score;
        failed += !r.error.empty();
        recs[i] = std::move(r);
        ++done;
        cv.notify_all();
      }
    });
  size_t shown = static_cast<size_t>(-1);
  auto last_draw = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  for (;;) {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait_for(lk, std::chrono::milliseconds(500), [&] { return done != shown; });
    if (done != shown) {
      shown = done;
      auto now = std::chrono::steady_clock::now();
      if (!opt.progress || (done != n && now - last_draw < std::chrono::milliseconds(250))) {
        if (done == n) break;
        continue;
      }
      last_draw = now;
      double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      size_t filled = n ? done * 30 / n : 30;
      fmt::print(stderr, "\reval [{}{}] {}/{} acc {:.1f}% failed {} {:.0f}s", std::string(filled, '#'),
                 std::string(30 - filled, '.'), done, n, done ? 100.0 * score_sum / static_cast<double>(done) : 0.0,
                 failed, el);
    }
    if (done == n) break;
  }
  if (opt.progress) fmt::print(stderr, "\n");
  for (auto& t : th) t.join();
  return recs;
}

}  // namespace sala::harness
