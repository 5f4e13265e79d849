// Scoring of `sala eval` on hand-made answers (the SOAR eval_model.py rules, see eval.h).
#include <gtest/gtest.h>

#include <fstream>

#include "harness/eval.h"

using namespace sala::harness;
using nlohmann::json;

TEST(EvalScoring, AnswerRegionIsAfterLastThinkClose) {
  EXPECT_EQ(answer_region("abc"), "abc");
  EXPECT_EQ(answer_region("<think>x</think>y"), "y");
  EXPECT_EQ(answer_region("<think>a</think>b</think>c"), "c");
  EXPECT_EQ(answer_region("</think>"), "");
}

TEST(EvalScoring, McqAnswerColon) {
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "B", "Reasoning... ANSWER: B"), 1);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "B", "ANSWER: C"), 0);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "B", "Answer: B."), 1);      // keyword in any case
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "B", "answer:B"), 1);        // no space
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "B", "ANSWER: (B)"), 1);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "B", "ANSWER: **B**"), 1);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "B", "ANSWER\xEF\xBC\x9A" "B"), 1);  // full-width colon
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "B", "The answer is B"), 0);  // no colon: no match
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "B", "no answer here"), 0);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "B", ""), 0);
}

TEST(EvalScoring, McqLetterMustEndTheWord) {
  // "ANSWER: Because" is not a choice; a later real one still counts.
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "B", "ANSWER: Because of x"), 0);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "B", "ANSWER: Because of x. ANSWER: B"), 1);
  // Lower-case letter after ANSWER: is not taken (could be the article "a").
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "A", "answer: a good one"), 0);
  // "ANSWER" inside a longer word does not count.
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "B", "REANSWER: B"), 0);
}

TEST(EvalScoring, McqBoxed) {
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "D", "so \\boxed{D}"), 1);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "D", "so \\boxed{d}"), 1);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "D", "so \\boxed{ D }"), 1);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "D", "so \\boxed{\\text{D}}"), 1);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "D", "so \\boxed{(D)}"), 1);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "D", "so \\boxed{42}"), 0);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "D", "so \\boxed{DE}"), 0);
}

TEST(EvalScoring, McqLastMentionWinsBoxedVsAnswer) {
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "A", "ANSWER: B ... on reflection \\boxed{A}"), 1);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "A", "\\boxed{A} hmm, no. ANSWER: B"), 0);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "B", "ANSWER: A then ANSWER: B"), 1);
  EXPECT_EQ(extract_mcq_choice("x \\boxed{C} y ANSWER: D z"), std::optional<char>('D'));
  EXPECT_EQ(extract_mcq_choice("nothing"), std::nullopt);
}

TEST(EvalScoring, McqOnlyAfterLastThink) {
  // The choice inside the thinking is ignored.
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "A", "<think>ANSWER: A</think>I pick ANSWER: C"), 0);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "C", "<think>ANSWER: A</think>I pick ANSWER: C"), 1);
  // Several </think>: only the text after the last counts.
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "A", "<think>x</think>ANSWER: A</think>nothing"), 0);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "B", "<think>x</think>ANSWER: A</think>ANSWER: B"), 1);
  // Unclosed thinking: the whole text is the answer region.
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "A", "<think>ANSWER: A"), 1);
}

TEST(EvalScoring, McqGoldForms) {
  EXPECT_DOUBLE_EQ(score_prediction("mcq", json::array({"B"}), "ANSWER: B"), 1);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", json::array({"A", "B"}), "ANSWER: B"), 1);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", " b ", "ANSWER: B"), 1);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "(B)", "ANSWER: B"), 1);
  EXPECT_DOUBLE_EQ(score_prediction("MCQ", "B", "ANSWER: B"), 1);  // task name case
  // Gold written as an answer itself (the shared tiny-chat set does this).
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "ANSWER: B", "ANSWER: B"), 1);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "ANSWER: B", "\\boxed{B}"), 1);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "ANSWER: B", "ANSWER: C"), 0);
  EXPECT_DOUBLE_EQ(score_prediction("mcq", "\\boxed{C}", "ANSWER: C"), 1);
}

TEST(EvalScoring, ContainsTasks) {
  for (const char* task : {"qa", "niah", "lcx"}) {
    SCOPED_TRACE(task);
    EXPECT_DOUBLE_EQ(score_prediction(task, "1176", "The sum is 1176."), 1);
    EXPECT_DOUBLE_EQ(score_prediction(task, "1176", "The sum is 1170."), 0);
    EXPECT_DOUBLE_EQ(score_prediction(task, "Paris", "the capital is PARIS"), 1);  // case-insensitive
    EXPECT_DOUBLE_EQ(score_prediction(task, json::array({"x9", "Paris"}), "paris"), 1);  // any gold
    EXPECT_DOUBLE_EQ(score_prediction(task, json::array({"x9", "y8"}), "paris"), 0);
    EXPECT_DOUBLE_EQ(score_prediction(task, "1176", "<think>1176</think>no idea"), 0);  // after think only
    EXPECT_DOUBLE_EQ(score_prediction(task, json::array(), "anything"), 0);
  }
  EXPECT_DOUBLE_EQ(score_prediction("somethingelse", "abc", "xxabcxx"), 1);
  EXPECT_DOUBLE_EQ(score_prediction("qa", 1176, "it is 1176"), 1);  // numeric gold
}

TEST(EvalScoring, WordFractionTasks) {
  json gold = json::array({"apple", "Banana", "cherry", "date"});
  EXPECT_DOUBLE_EQ(score_prediction("cwe", gold, "apple, banana, cherry, date"), 1);
  EXPECT_DOUBLE_EQ(score_prediction("cwe", gold, "APPLE and cherry"), 0.5);
  EXPECT_DOUBLE_EQ(score_prediction("fwe", gold, "banana"), 0.25);
  EXPECT_DOUBLE_EQ(score_prediction("fwe", gold, "<think>apple banana cherry date</think>date"), 0.25);
  EXPECT_DOUBLE_EQ(score_prediction("cwe", "apple", "apple"), 1);  // gold as a string
  EXPECT_DOUBLE_EQ(score_prediction("cwe", json::array(), "apple"), 0);
}

TEST(EvalScoring, SummaryAccuracies) {
  std::vector<EvalRecord> r(5);
  r[0].task = "mcq"; r[0].score = 1;
  r[1].task = "mcq"; r[1].score = 0;
  r[2].task = "qa";  r[2].score = 1;
  r[3].task = "cwe"; r[3].score = 0.5;
  r[4].task = "qa";  r[4].score = 0; r[4].error = "HTTP 500";
  auto s = summarize_eval(r);
  EXPECT_EQ(s.n, 5);
  EXPECT_EQ(s.errors, 1);
  EXPECT_DOUBLE_EQ(s.ori_accuracy, 50.0);            // 2.5 / 5
  EXPECT_DOUBLE_EQ(s.overall_accuracy, 62.5);        // 50 / 80 * 100
  EXPECT_EQ(s.per_task["mcq"].n, 2);
  EXPECT_DOUBLE_EQ(s.per_task["cwe"].sum, 0.5);
  std::vector<EvalRecord> good(4);
  for (auto& g : good) g.score = 1;
  good[0].score = 0.5;  // ori 87.5 -> overall capped at 100
  auto s2 = summarize_eval(good);
  EXPECT_DOUBLE_EQ(s2.ori_accuracy, 87.5);
  EXPECT_DOUBLE_EQ(s2.overall_accuracy, 100.0);
}

TEST(EvalScoring, TinyChatSetGoldIsScorable) {
  // The hand-made tiny-chat set (tests/fixtures/eval) loads, and a perfect echo of each
  // gold scores 100.
  auto items = load_eval_items(SALA_EVAL_FIXTURES "/tiny-chat.jsonl");
  ASSERT_GT(items.size(), 0u);
  std::vector<EvalRecord> recs;
  for (const auto& it : items) {
    EvalRecord r;
    r.task = it.task;
    std::string ans = gold_list(it.gold).at(0);
    r.score = score_prediction(it.task, it.gold, ans);  // mcq gold there is "ANSWER: X"
    recs.push_back(r);
  }
  EXPECT_DOUBLE_EQ(summarize_eval(recs).ori_accuracy, 100.0);
}

TEST(EvalScoring, AgreesWithTheReferenceCorrectFlags) {
  // tiny-chat.reference.jsonl records, per row, the reference answer and whether the
  // toolkit's scoring counts it correct; our scoring must agree on every row.
  auto items = load_eval_items(SALA_EVAL_FIXTURES "/tiny-chat.jsonl");
  std::ifstream f(SALA_EVAL_FIXTURES "/tiny-chat.reference.jsonl");
  ASSERT_TRUE(f.is_open()) << SALA_EVAL_FIXTURES "/tiny-chat.reference.jsonl";
  std::string line;
  size_t i = 0, correct = 0;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    ASSERT_LT(i, items.size());
    auto ref = nlohmann::json::parse(line);
    double s = score_prediction(items[i].task, items[i].gold, ref["output_text"].get<std::string>());
    EXPECT_EQ(s == 1.0, ref["correct"].get<bool>()) << "row " << i << ": " << ref["output_text"];
    correct += s == 1.0;
    ++i;
  }
  EXPECT_EQ(i, items.size());
  EXPECT_EQ(correct, 110u);
}
