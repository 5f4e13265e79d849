// Request parsing and validation of the server's protocol layer (no model, no HTTP).
#include "server/protocol.h"

#include <gtest/gtest.h>

using namespace sala::server;

namespace {

ProtocolLimits lim() {
  ProtocolLimits l;
  l.max_context_len = 1000;
  l.vocab_size = 800;
  return l;
}

int status_of(const std::function<void()>& f, std::string* param = nullptr) {
  try {
    f();
  } catch (const ApiError& e) {
    if (param) *param = e.param;
    auto b = e.body();
    EXPECT_TRUE(b["error"].contains("message"));
    EXPECT_TRUE(b["error"].contains("type"));
    EXPECT_TRUE(b["error"].contains("param"));
    EXPECT_TRUE(b["error"].contains("code"));
    return e.status;
  }
  return 200;
}

}  // namespace

TEST(Protocol, ParseBody) {
  EXPECT_EQ(status_of([] { parse_body(""); }), 400);
  EXPECT_EQ(status_of([] { parse_body("{"); }), 400);
  EXPECT_EQ(status_of([] { parse_body("[1]"); }), 400);
  EXPECT_EQ(status_of([] { parse_body("{\"a\": \"\xff\"}"); }), 400);
  EXPECT_EQ(status_of([] { parse_body("{\"a\": 1}"); }), 200);
}

TEST(Protocol, GenerateBenchServingPayload) {
  auto j = json::parse(R"({"text": "hi", "sampling_params": {"temperature": 0.0, "max_new_tokens": 7,
    "ignore_eos": true}, "stream": true, "lora_path": null, "return_logprob": false,
    "return_routed_experts": false, "logprob_start_len": -1})");
  auto r = parse_generate(j, lim());
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(*r.prompts[0].text, "hi");
  EXPECT_FALSE(r.batch);
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.sampling.params.max_new_tokens, 7);
  EXPECT_TRUE(r.sampling.params.ignore_eos);
  EXPECT_EQ(r.sampling.params.temperature, 0.0f);
}

TEST(Protocol, GenerateForms) {
  auto r = parse_generate(json::parse(R"({"input_ids": [[1, 2], [3]]})"), lim());
  EXPECT_TRUE(r.batch);
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].ids, std::vector<int32_t>{3});
  EXPECT_EQ(r.sampling.params.max_new_tokens, 128);
  r = parse_generate(json::parse(R"({"text": ["a", "b"], "sampling_params": {"n": 2, "stop": "x"}})"), lim());
  EXPECT_EQ(r.prompts.size(), 4u);
  EXPECT_EQ(r.sampling.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(status_of([] { parse_generate(json::parse(R"({"input_ids": [900]})"), lim()); }), 400);
  EXPECT_EQ(status_of([] { parse_generate(json::parse(R"({"input_ids": []})"), lim()); }), 400);
  r = parse_generate(json::parse(R"({"text": "a", "return_logprob": true, "top_logprobs_num": 3})"), lim());
  EXPECT_TRUE(r.sampling.logprobs.enabled && r.sampling.logprobs.prompt);
  EXPECT_EQ(r.sampling.logprobs.top_n, 3);
  EXPECT_EQ(r.sampling.logprobs.start, -1);
  std::string param;
  EXPECT_EQ(status_of([] { parse_generate(json::parse(R"({"text": "a", "return_logprob": true, "top_logprobs_num": 21})"), lim()); }, &param), 400);
  EXPECT_EQ(param, "top_logprobs_num");
}

TEST(Protocol, ChatValidation) {
  auto r = parse_chat(json::parse(R"({"model": "m", "messages": [{"role": "system", "content": "s"},
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
    "temperature": 0, "max_tokens": 5, "stop": ["</s>", "<|im_end|>"], "seed": 3, "n": 2,
    "stream": true, "stream_options": {"include_usage": true}})"), lim());
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1].content, "a\nb");
  EXPECT_EQ(r.sampling.params.max_new_tokens, 5);
  EXPECT_EQ(r.sampling.stop.size(), 2u);
  EXPECT_EQ(*r.sampling.params.seed, 3u);
  EXPECT_EQ(r.sampling.n, 2);
  EXPECT_TRUE(r.include_usage);
  // max_completion_tokens wins over max_tokens; default: until the context is full
  r = parse_chat(json::parse(R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 9, "max_tokens": 3})"), lim());
  EXPECT_EQ(r.sampling.params.max_new_tokens, 9);
  r = parse_chat(json::parse(R"({"messages": [{"role": "user", "content": "x"}]})"), lim());
  EXPECT_EQ(r.sampling.params.max_new_tokens, -1);

  std::string param;
  for (const char* bad : {
           R"({"messages": []})", R"({"messages": "x"})", R"({})",
           R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})",
           R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1001})",
           R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"})",
           R"({"messages": [{"role": "user", "content": "x"}], "n": 100000})",
           R"({"messages": [{"role": "user", "content": "x"}], "temperature": "0"})",
           R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})",
           R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})",
           R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 2})",
           R"({"messages": [{"role": "user", "content": "x"}], "stop": [1]})",
           R"({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}})",
           R"({"messages": [{"role": "bot", "content": "x"}]})"}) {
    EXPECT_EQ(status_of([&] { parse_chat(json::parse(bad), lim()); }, &param), 400) << bad;
  }
  status_of([&] { parse_chat(json::parse(R"({"messages": [{"role": "user", "content": "x"}], "top_p": 2})"), lim()); }, &param);
  EXPECT_EQ(param, "top_p");
}

// The bounds are the engine's (engine/request_check.h), applied while parsing: a 400 naming
// the field, on every route.
TEST(Protocol, EngineBoundsNameTheField) {
  std::string param;
  for (const char* field : {"repetition_penalty\": 11", "frequency_penalty\": -2.5", "presence_penalty\": 3",
                            "top_k\": -5", "min_p\": 1.5", "temperature\": -1"}) {
    const std::string name = std::string(field).substr(0, std::string(field).find('"'));
    const std::string chat = std::string(R"({"messages": [{"role": "user", "content": "x"}], ")") + field + "}";
    EXPECT_EQ(status_of([&] { parse_chat(json::parse(chat), lim()); }, &param), 400) << chat;
    EXPECT_EQ(param, name);
    const std::string gen = std::string(R"({"text": "x", "sampling_params": {")") + field + "}}";
    EXPECT_EQ(status_of([&] { parse_generate(json::parse(gen), lim()); }, &param), 400) << gen;
    EXPECT_EQ(param, name);
  }
  EXPECT_EQ(status_of([&] {
              parse_chat(json::parse(R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 1001})"), lim());
            }, &param), 400);
  EXPECT_EQ(param, "max_completion_tokens");
  EXPECT_EQ(status_of([&] { parse_chat(json::parse(R"({"messages": [{"role": "user", "content": "x"}], "repetition_penalty": 10})"), lim()); }), 200);
}

TEST(Protocol, CompletionPrompts) {
  auto r = parse_completion(json::parse(R"({"prompt": [1, 2, 3], "logprobs": null, "echo": false})"), lim());
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].ids.size(), 3u);
  EXPECT_EQ(r.sampling.params.max_new_tokens, 16);
  r = parse_completion(json::parse(R"({"prompt": ["a", "b"], "n": 2})"), lim());
  EXPECT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(status_of([] { parse_completion(json::parse(R"({"prompt": {}})"), lim()); }), 400);
  r = parse_completion(json::parse(R"({"prompt": "a", "logprobs": 2, "echo": true, "max_tokens": 0})"), lim());
  EXPECT_TRUE(r.sampling.logprobs.enabled && r.sampling.logprobs.prompt);
  EXPECT_EQ(r.sampling.logprobs.top_n, 2);
  EXPECT_EQ(r.sampling.params.max_new_tokens, 0);
  std::string param;
  EXPECT_EQ(status_of([] { parse_completion(json::parse(R"({"prompt": "a", "logprobs": 21})"), lim()); }, &param), 400);
  EXPECT_EQ(param, "logprobs");
  EXPECT_EQ(status_of([] { parse_completion(json::parse(R"({"prompt": "a", "max_tokens": 0})"), lim()); }, &param), 400);
  EXPECT_EQ(param, "max_tokens");
}

TEST(Protocol, Responses) {
  SeqResult s;
  s.text = "hi";
  s.prompt_tokens = 3;
  s.completion_tokens = 4;
  s.finished = true;
  s.finish = "length";
  auto g = generate_result(s, "abc", false);
  EXPECT_EQ(g["meta_info"]["finish_reason"], json({{"type", "length"}, {"length", 4}}));
  EXPECT_TRUE(g["meta_info"].contains("e2e_latency"));
  s.finish = "stop";
  s.matched_token = 2;
  EXPECT_EQ(sglang_finish_reason(s), json({{"type", "stop"}, {"matched", 2}}));
  auto c = chat_response("id", "m", 1, {s}, usage_json(3, 4));
  EXPECT_EQ(c["choices"][0]["message"]["content"], "hi");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(c["usage"]["total_tokens"], 7);
  EXPECT_NO_THROW(dump(json("\xff")));
}

// Parameters beyond the basic sampling fields (protocol_params.cpp): implemented ones land in
// the typed request, unsupported ones are a 400 naming them.
TEST(Protocol, ExtraParams) {
  auto c = parse_chat(json::parse(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 9,
      "min_tokens": 3, "logit_bias": {"5": -100, "7": 2.5}, "include_stop_str_in_output": true,
      "add_generation_prompt": false, "continue_final_message": true, "echo": true,
      "reasoning_effort": "none"})"), lim());
  EXPECT_EQ(c.sampling.params.min_new_tokens, 3);
  ASSERT_EQ(c.sampling.params.logit_bias.size(), 2u);
  EXPECT_TRUE(c.sampling.include_stop_str);
  EXPECT_TRUE(c.continue_final_message && !c.add_generation_prompt && c.echo);
  EXPECT_EQ(c.template_kwargs["enable_thinking"], false);
  std::string param;
  auto chat = [&](const char* extra) {
    return status_of([extra] {
      parse_chat(json::parse(std::string(R"({"messages": [{"role": "user", "content": "x"}])") + extra + "}"), lim());
    }, &param);
  };
  EXPECT_EQ(chat(R"(, "min_tokens": 10, "max_tokens": 5)"), 400);
  EXPECT_EQ(param, "min_tokens");
  EXPECT_EQ(chat(R"(, "logit_bias": {"abc": 1})"), 400);
  EXPECT_EQ(param, "logit_bias");
  EXPECT_EQ(chat(R"(, "logit_bias": {"5": 101})"), 400);
  EXPECT_EQ(chat(R"(, "logit_bias": {"900": 1})"), 400);  // beyond the vocabulary
  EXPECT_EQ(chat(R"(, "continue_final_message": true)"), 400);
  EXPECT_EQ(param, "continue_final_message");
  for (const char* k : {"regex", "guided_json", "structured_outputs", "json_schema", "ebnf"}) {
    EXPECT_EQ(chat((std::string(", \"") + k + "\": \"a\"").c_str()), 400) << k;
    EXPECT_EQ(param, k);
  }
  EXPECT_EQ(chat(R"(, "tool_choice": "none", "store": false, "service_tier": "auto", "user": "u")"), 200);
  EXPECT_EQ(chat(R"(, "tool_choice": "required")"), 400);
  EXPECT_EQ(chat(R"(, "web_search_options": {})"), 400);
  auto g = parse_generate(json::parse(R"({"text": "a", "sampling_params": {"min_new_tokens": 2,
      "no_stop_trim": true, "stream_interval": 3, "logit_bias": {"1": 1}}})"), lim());
  EXPECT_EQ(g.sampling.params.min_new_tokens, 2);
  EXPECT_TRUE(g.sampling.include_stop_str);
  EXPECT_EQ(g.sampling.stream_interval, 3);
  EXPECT_EQ(status_of([] { parse_generate(json::parse(R"({"text": "a", "sampling_params": {"min_new_tokens": 200}})"), lim()); }), 400);
  EXPECT_EQ(status_of([] { parse_generate(json::parse(R"({"text": "a", "lora_path": "x"})"), lim()); }), 400);
}
