// `sala generate`: one request through the engine, text printed as it streams, tok/s at the end.
//   sala generate --model-path DIR (--prompt-ids 1,2,3 | --prompt TEXT) [--chat]
//                 [--max-new-tokens N] [--temperature T --top-p P --top-k K --seed S] [--ignore-eos]
// requires: sala_server sala_engine
#include <fmt/core.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "core/error.h"
#include "server/launch.h"
#include "tokenizer/detokenizer.h"

namespace {

struct GenOpts {
  std::string model_path, prompt, prompt_ids, device = "cpu", dtype = "auto";
  bool chat = false, ignore_eos = false, show_ids = false;
  int max_new_tokens = 64, top_k = -1, cpu_threads = 0, context_length = 0, tp_size = 1;
  float temperature = 0.0f, top_p = 1.0f;
  int64_t seed = -1;
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::string cur;
  auto flush = [&] {
    if (cur.empty()) return;
    try {
      size_t pos = 0;
      long v = std::stol(cur, &pos);
      if (pos != cur.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(cur);
      ids.push_back(int32_t(v));
    } catch (const std::exception&) {
      sala::fail("--prompt-ids: '{}' is not a token id", cur);
    }
    cur.clear();
  };
  for (char c : s) {
    if (c == ',' || c == ' ' || c == '[' || c == ']') flush();
    else cur += c;
  }
  flush();
  return ids;
}

int run_generate(const GenOpts& o) {
  if (o.prompt.empty() == o.prompt_ids.empty()) sala::fail("give exactly one of --prompt or --prompt-ids");
  sala::server::LaunchOptions lo;
  lo.model_path = o.model_path.empty() ? sala::server::default_model_dir() : o.model_path;
  lo.device = o.device;
  lo.dtype = o.dtype;
  lo.cpu_threads = o.cpu_threads;
  lo.tp_size = o.tp_size;
  lo.engine.max_running_requests = 1;
  lo.engine.max_context_len = o.context_length;
  lo.engine.max_step_tokens = lo.engine.chunked_prefill_size + 1;
  lo.kv_memory_bytes = size_t(64) << 20;
  lo.verbose = false;
  auto L = sala::server::launch(lo);

  std::vector<int32_t> ids;
  if (!o.prompt_ids.empty()) {
    ids = parse_ids(o.prompt_ids);
  } else if (o.chat) {
    if (!L.tmpl) sala::fail("--chat: the model has no usable chat template ({})", L.template_error);
    sala::ChatMessage user;
    user.role = "user";
    user.content = o.prompt;
    ids = L.tok->encode(L.tmpl->render({user}, true), false);
  } else {
    ids = L.tok->encode(o.prompt, true);
  }
  // Engine::submit checks the prompt (engine/request_check.h) and the sampling bounds.
  sala::GenerationRequest req;
  req.prompt = ids;
  req.sampling.temperature = o.temperature;
  req.sampling.top_p = o.top_p;
  req.sampling.top_k = o.top_k;
  req.sampling.max_new_tokens = o.max_new_tokens;
  req.sampling.ignore_eos = o.ignore_eos;
  if (o.seed >= 0) req.sampling.seed = uint64_t(o.seed);

  const auto t0 = std::chrono::steady_clock::now();
  auto h = L.engine->submit(std::move(req));
  sala::IncrementalDetokenizer detok(*L.tok, true);
  std::chrono::steady_clock::time_point t_first;
  int32_t n = 0;
  std::string reason = "?";
  std::vector<int32_t> out_ids;
  for (;;) {
    sala::TokenEvent ev;
    if (!h->next(ev, std::chrono::milliseconds(1000))) continue;
    for (int32_t id : ev.tokens) {
      if (n++ == 0) t_first = std::chrono::steady_clock::now();
      out_ids.push_back(id);
      fmt::print("{}", detok.push(id));
    }
    std::fflush(stdout);
    if (ev.finished) {
      fmt::print("{}\n", detok.flush());
      switch (ev.reason) {
        case sala::FinishReason::Length: reason = "length"; break;
        case sala::FinishReason::StopToken: reason = fmt::format("stop token {}", ev.matched_stop_token); break;
        case sala::FinishReason::Aborted: reason = "aborted"; break;
        case sala::FinishReason::Error: reason = "error: " + ev.error; break;
        case sala::FinishReason::None: reason = "none"; break;
        case sala::FinishReason::GrammarComplete: reason = "grammar complete"; break;
      }
      break;
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  const double ttft = n ? std::chrono::duration<double>(t_first - t0).count() : 0;
  const double decode = n > 1 ? std::chrono::duration<double>(t1 - t_first).count() : 0;
  fmt::print(stderr, "[{} prompt tokens, {} generated, finish: {}; TTFT {:.1f} ms; decode {:.1f} tok/s; total {:.2f} s]\n",
             ids.size(), n, reason, ttft * 1e3, decode > 0 ? (n - 1) / decode : 0.0,
             std::chrono::duration<double>(t1 - t0).count());
  if (o.show_ids) {
    std::string s;
    for (size_t i = 0; i < out_ids.size(); ++i) s += (i ? "," : "") + std::to_string(out_ids[i]);
    fmt::print(stderr, "[output ids: {}]\n", s);
  }
  L.engine->shutdown();
  return reason.rfind("error", 0) == 0 ? 1 : 0;
}

sala::cli::Registrar reg("generate", "Generate from one prompt through the engine, streaming the text", [](CLI::App& app) {
  auto o = std::make_shared<GenOpts>();
  app.add_option("--model-path,--model", o->model_path, "Model directory (default: $SALA_MODEL_DIR or the bundled tiny model)");
  app.add_option("--prompt", o->prompt, "Prompt text (BOS added; with --chat: the user message)");
  app.add_option("--prompt-ids", o->prompt_ids, "Prompt token ids, e.g. 1,2,3");
  app.add_flag("--chat", o->chat, "Apply the model's chat template to --prompt");
  app.add_option("--max-new-tokens", o->max_new_tokens, "Tokens to generate at most")->capture_default_str();
  app.add_option("--temperature", o->temperature, "0: greedy")->capture_default_str();
  app.add_option("--top-p", o->top_p, "Nucleus sampling")->capture_default_str();
  app.add_option("--top-k", o->top_k, "Top-k sampling (-1: off)")->capture_default_str();
  app.add_option("--seed", o->seed, "Sampling seed");
  app.add_flag("--ignore-eos", o->ignore_eos, "Do not stop at EOS");
  app.add_flag("--show-ids", o->show_ids, "Print the generated token ids at the end");
  app.add_option("--device", o->device, "cpu | cuda")->capture_default_str();
  app.add_option("--dtype", o->dtype, "auto | float32 | bfloat16")->capture_default_str();
  app.add_option("--cpu-threads", o->cpu_threads, "CPU backend threads (0: all cores)");
  app.add_option("--tp-size", o->tp_size, "tensor-parallel ranks, one thread each (CUDA: one GPU each, over NCCL)");
  app.add_option("--context-length", o->context_length, "Max prompt + output tokens");
  return sala::cli::Run([o] { return run_generate(*o); });
});

}  // namespace
