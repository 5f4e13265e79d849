// The request rules (engine/request_check.h): one set of sampling bounds and the context
// rules, each failure an InvalidRequest naming the parameter.
#include "engine/request_check.h"

#include <gtest/gtest.h>

#include <functional>

#include "engine/engine.h"

namespace sala {
namespace {

// The parameter the rules blame ("" when they accept), and the code.
std::pair<std::string, std::string> refused(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidRequest& e) {
    return {e.param(), e.code()};
  }
  return {"", ""};
}

std::string bad_sampling(const std::function<void(SamplingParams&)>& set) {
  SamplingParams p;
  set(p);
  std::string msg;
  try {
    check_sampling(p);
  } catch (const InvalidRequest& e) {
    msg = e.what();
    EXPECT_NE(msg.find("'" + e.param() + "' must be"), std::string::npos) << msg;
  }
  return refused([&] { check_sampling(p); }).first;
}

TEST(RequestCheck, SamplingBounds) {
  EXPECT_EQ(bad_sampling([](SamplingParams&) {}), "");
  EXPECT_EQ(bad_sampling([](SamplingParams& p) { p.temperature = 0; p.top_p = 1; p.top_k = -1; }), "");
  EXPECT_EQ(bad_sampling([](SamplingParams& p) { p.min_p = 1; p.repetition_penalty = 10; }), "");
  EXPECT_EQ(bad_sampling([](SamplingParams& p) { p.frequency_penalty = -2; p.presence_penalty = 2; }), "");
  EXPECT_EQ(bad_sampling([](SamplingParams& p) { p.temperature = -0.5f; }), "temperature");
  EXPECT_EQ(bad_sampling([](SamplingParams& p) { p.temperature = HUGE_VALF; }), "temperature");
  EXPECT_EQ(bad_sampling([](SamplingParams& p) { p.top_p = 0; }), "top_p");
  EXPECT_EQ(bad_sampling([](SamplingParams& p) { p.top_p = 1.5f; }), "top_p");
  EXPECT_EQ(bad_sampling([](SamplingParams& p) { p.top_k = -2; }), "top_k");
  EXPECT_EQ(bad_sampling([](SamplingParams& p) { p.min_p = -0.1f; }), "min_p");
  EXPECT_EQ(bad_sampling([](SamplingParams& p) { p.repetition_penalty = 0; }), "repetition_penalty");
  EXPECT_EQ(bad_sampling([](SamplingParams& p) { p.repetition_penalty = 10.5f; }), "repetition_penalty");
  EXPECT_EQ(bad_sampling([](SamplingParams& p) { p.frequency_penalty = 2.5f; }), "frequency_penalty");
  EXPECT_EQ(bad_sampling([](SamplingParams& p) { p.presence_penalty = -3; }), "presence_penalty");
}

TEST(RequestCheck, ContextRules) {
  using R = std::pair<std::string, std::string>;
  EXPECT_EQ(refused([] { check_prompt_length(99, 100); }), R("", ""));
  EXPECT_EQ(refused([] { check_prompt_length(0, 100); }), R("prompt", ""));
  EXPECT_EQ(refused([] { check_prompt_length(100, 100, "prompt[1]"); }),
            R("prompt[1]", "context_length_exceeded"));
  EXPECT_EQ(refused([] { check_new_tokens(1, 99, 100); }), R("", ""));
  EXPECT_EQ(refused([] { check_new_tokens(0, 10, 100, "max_tokens"); }), R("max_tokens", ""));
  EXPECT_EQ(refused([] { check_new_tokens(91, 10, 100, "max_tokens"); }),
            R("max_tokens", "context_length_exceeded"));
  EXPECT_EQ(refused([] { check_new_tokens(101, 0, 100); }), R("max_new_tokens", "context_length_exceeded"));
  EXPECT_EQ(refused([] { check_new_tokens(1000000, 10, 0); }), R("", ""));  // no limit: the engine
}

TEST(RequestCheck, ModelContext) {
  ModelConfig c;
  c.source = "m/config.json";
  c.max_position_embeddings = 4096;
  EXPECT_NO_THROW(check_model_context(c, 4096, "--context-length"));
  try {
    check_model_context(c, 4097, "--context-length");
    ADD_FAILURE() << "4097 > 4096 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--context-length 4097 exceeds the model's "
                                         "max_position_embeddings 4096 (m/config.json)"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sala
