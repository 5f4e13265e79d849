// Request parsing and validation of the server's protocol layer (no model, no HTTP).
#include "server/protocol.h"
#include "server/tool_calls.h"

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
           R"({"messages": [{"role": "bot", "content": "x"}]})",
           // a part's or a tool's "type" that is not a string (fuzz_protocol's finding: a JSON
           // type error escaped instead of a 400)
           R"({"messages": [{"role": "user", "content": [{"type": ["text"], "text": "a"}]}]})",
           R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": 1}]})"}) {
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
TEST(Protocol, StructuredOutputAndTools) {
  using Kind = sala::grammar::GrammarSpec::Kind;
  auto chat = [](const std::string& extra) {
    return parse_chat(json::parse(R"({"messages": [{"role": "user", "content": "x"}])" + extra + "}"), lim());
  };
  auto c = chat(R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "n",
      "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}})");
  ASSERT_TRUE(c.sampling.grammar.has_value());
  EXPECT_EQ(c.sampling.grammar->kind, Kind::JsonSchema);
  EXPECT_EQ(json::parse(c.sampling.grammar->text)["properties"]["a"]["type"], "integer");
  EXPECT_EQ(c.sampling.grammar_param, "response_format");
  EXPECT_EQ(chat(R"(, "response_format": {"type": "json_object"})").sampling.grammar->kind, Kind::JsonObject);
  EXPECT_FALSE(chat(R"(, "response_format": {"type": "text"})").sampling.grammar.has_value());
  EXPECT_EQ(chat(R"(, "guided_choice": ["a.b", "c"])").sampling.grammar->text, "(a\\.b)|(c)");
  EXPECT_EQ(chat(R"(, "regex": "[0-9]+")").sampling.grammar->kind, Kind::Regex);
  auto g = parse_generate(json::parse(R"({"text": "a", "sampling_params": {"ebnf": "root ::= \"x\""}})"), lim());
  ASSERT_TRUE(g.sampling.grammar.has_value());
  EXPECT_EQ(g.sampling.grammar->kind, Kind::Ebnf);
  std::string param;
  EXPECT_EQ(status_of([&] { chat(R"(, "regex": "a", "guided_json": {"type": "object"})"); }, &param), 400);
  EXPECT_EQ(param, "guided_json");  // the second constraint is named
  EXPECT_EQ(status_of([&] { chat(R"(, "response_format": {"type": "yaml"})"); }, &param), 400);
  EXPECT_EQ(param, "response_format");
  // Tools: validated, tool_choice required / named becomes a structural-tag grammar.
  const std::string tools = R"(, "tools": [{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}])";
  auto t = chat(tools + R"(, "tool_choice": "required", "parallel_tool_calls": false)");
  EXPECT_TRUE(t.tools.active());
  EXPECT_FALSE(t.tools.parallel);
  ASSERT_TRUE(t.sampling.grammar.has_value());
  EXPECT_EQ(t.sampling.grammar->kind, Kind::StructuralTag);
  EXPECT_EQ(json::parse(t.sampling.grammar->text)["format"]["stop_after_first"], true);
  EXPECT_FALSE(chat(tools).sampling.grammar.has_value());  // auto: free text, parsed afterwards
  EXPECT_FALSE(chat(tools + R"(, "tool_choice": "none")").tools.active());
  EXPECT_EQ(chat(tools + R"(, "tool_choice": {"type": "function", "function": {"name": "f"}})").tools.named, "f");
  EXPECT_EQ(status_of([&] { chat(tools + R"(, "tool_choice": {"type": "function", "function": {"name": "g"}})"); }, &param), 400);
  EXPECT_EQ(param, "tool_choice");
  EXPECT_EQ(status_of([&] { chat(R"(, "tools": [{"type": "function", "function": {}}])"); }, &param), 400);
  EXPECT_EQ(param, "tools[0].function.name");
  EXPECT_EQ(status_of([&] { chat(tools + R"(, "tool_choice": "required", "response_format": {"type": "json_object"})"); }, &param), 400);
  EXPECT_EQ(param, "tool_choice");
  // History: an assistant's tool_calls and the tool's answer.
  auto h = parse_chat(json::parse(R"({"messages": [{"role": "user", "content": "x"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
          "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "2"}]})"), lim());
  EXPECT_EQ(h.messages[1].tool_calls[0]["function"]["name"], "f");
  EXPECT_EQ(h.messages[2].tool_call_id, "c1");
  EXPECT_EQ(status_of([] { parse_chat(json::parse(R"({"messages": [{"role": "user", "content": "x",
      "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]})"), lim()); }, &param), 400);
  EXPECT_EQ(param, "messages[0].tool_calls");
  EXPECT_EQ(status_of([] { parse_chat(json::parse(R"({"messages": [{"role": "assistant", "content": "x",
      "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]})"), lim()); }, &param), 400);
}

TEST(Protocol, ToolCallParserStreams) {
  // The same calls whether the answer comes whole or a character at a time; text around them
  // is content, whitespace between calls is not, a broken block stays content.
  const std::string answer = "Let me check.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>\n"
                             "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
  for (size_t step : {answer.size(), size_t(1), size_t(7)}) {
    ToolCallParser p;
    std::string content;
    json calls = json::array();
    for (size_t i = 0; i < answer.size(); i += step) {
      auto o = p.push(answer.substr(i, step));
      content += o.content;
      for (auto& c : o.calls) calls.push_back(c);
    }
    auto o = p.finish();
    content += o.content;
    for (auto& c : o.calls) calls.push_back(c);
    EXPECT_EQ(content, "Let me check.\n") << step;
    ASSERT_EQ(calls.size(), 2u) << step;
    EXPECT_EQ(calls[0]["index"], 0);
    EXPECT_EQ(calls[0]["function"]["name"], "f");
    EXPECT_EQ(json::parse(calls[0]["function"]["arguments"].get<std::string>())["x"], 1);
    EXPECT_EQ(calls[1]["function"]["name"], "g");
    EXPECT_NE(calls[0]["id"], calls[1]["id"]);
  }
  json choice = {{"message", {{"role", "assistant"}, {"content", "x"}}}, {"finish_reason", "stop"}};
  apply_tool_calls(choice, "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  choice = {{"message", {{"role", "assistant"}, {"content", "x"}}}, {"finish_reason", "stop"}};
  apply_tool_calls(choice, "a <tool_call>{not json}</tool_call> <tool");
  EXPECT_EQ(choice["message"]["content"], "x");  // no valid call: the text stays as it is
  EXPECT_EQ(choice["finish_reason"], "stop");
}

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
  for (const char* k : {"guided_json", "structured_outputs", "json_schema"}) {  // "a" is no schema
    EXPECT_EQ(chat((std::string(", \"") + k + "\": \"a\"").c_str()), 400) << k;
    EXPECT_EQ(param, k);
  }
  EXPECT_EQ(chat(R"(, "tool_choice": "none", "store": false, "service_tier": "auto", "user": "u")"), 200);
  EXPECT_EQ(chat(R"(, "tool_choice": "required")"), 400);  // no tools
  EXPECT_EQ(param, "tool_choice");
  EXPECT_EQ(chat(R"(, "web_search_options": {})"), 400);
  auto g = parse_generate(json::parse(R"({"text": "a", "sampling_params": {"min_new_tokens": 2,
      "no_stop_trim": true, "stream_interval": 3, "logit_bias": {"1": 1}}})"), lim());
  EXPECT_EQ(g.sampling.params.min_new_tokens, 2);
  EXPECT_TRUE(g.sampling.include_stop_str);
  EXPECT_EQ(g.sampling.stream_interval, 3);
  EXPECT_EQ(status_of([] { parse_generate(json::parse(R"({"text": "a", "sampling_params": {"min_new_tokens": 200}})"), lim()); }), 400);
  EXPECT_EQ(status_of([] { parse_generate(json::parse(R"({"text": "a", "lora_path": "x"})"), lim()); }), 400);
}
