// Helpers of the engine tests on the bundled tiny model (CPU backend, fp32).
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/config.h"
#include "core/safetensors.h"
#include "engine/engine.h"
#include "model/minicpm_sala.h"

namespace sala {
namespace {

using namespace std::chrono_literals;

const std::string kModelDir = std::string(SALA_SOURCE_DIR) + "/models/sala-tiny-chat";

const ModelConfig& tiny_config() {
  static const ModelConfig cfg = load_model_config(kModelDir);
  return cfg;
}

// slots: requests' state slots (doubled for speculation's snapshots: spec_rows > 1);
// spec_rows: rows per request per step (1 + drafts), which sizes the logit rows; keep_rows:
// with speculation, keep verify steps' lightning rows (as plan_limits), so that a rollback
// advances the state instead of recomputing the rows.
std::unique_ptr<Model> load_model(int32_t pages, int32_t slots, int32_t step_tokens,
                                  KvCacheDtype kv = KvCacheDtype::Auto, int32_t spec_rows = 1,
                                  bool keep_rows = true) {
  static const Checkpoint ckpt(kModelDir);
  ModelLimits lim;
  lim.max_step_tokens = step_tokens;
  lim.max_logit_rows = slots * spec_rows;
  lim.caches.page_size = tiny_config().sparse.block_size;
  lim.caches.num_pages = pages;
  lim.caches.num_slots = slots * (spec_rows > 1 ? 2 : 1);
  lim.keep_verify_rows = spec_rows > 1 && keep_rows ? lim.max_logit_rows : 0;
  BackendOptions bo{NumericMode::F32, 0};
  bo.kv_cache_dtype = kv;
  return std::make_unique<Model>(tiny_config(), make_backend("cpu", bo), ckpt, lim);
}

struct EngineSetup {
  int32_t pages = 512, slots = 8, step_tokens = 512;
  EngineOptions opts;
  KvCacheDtype kv = KvCacheDtype::Auto;  // BackendOptions::kv_cache_dtype
  bool keep_rows = true;                 // load_model's
};

std::unique_ptr<Engine> start(const EngineSetup& s) {
  EngineOptions o = s.opts;
  o.max_running_requests = std::min(o.max_running_requests, s.slots);
  o.max_step_tokens = std::min(o.max_step_tokens, s.step_tokens);
  const int32_t rows = 1 + o.speculative.num_draft_tokens;
  return make_engine(load_model(s.pages, s.slots, s.step_tokens, s.kv, rows, s.keep_rows), o);
}

std::vector<int32_t> make_prompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p{1};  // BOS
  while (int(p.size()) < n) p.push_back(int32_t(3 + rng() % 780));
  return p;
}

struct Result {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::None;
  int32_t matched = -1;
  int32_t completion_tokens = 0;
  std::string error;
};

Result collect(RequestHandle& h) {
  Result r;
  TokenEvent ev;
  for (;;) {
    if (!h.next(ev, 120s)) {
      ADD_FAILURE() << "request " << h.id() << " timed out";
      return r;
    }
    r.tokens.insert(r.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    r.completion_tokens = ev.completion_tokens;
    if (ev.finished) {
      r.reason = ev.reason;
      r.matched = ev.matched_stop_token;
      r.error = ev.error;
      return r;
    }
  }
}

GenerationRequest greedy(std::vector<int32_t> prompt, int32_t n) {
  GenerationRequest g;
  g.prompt = std::move(prompt);
  g.sampling.temperature = 0;
  g.sampling.max_new_tokens = n;
  g.sampling.ignore_eos = true;
  return g;
}

// Waits until the engine holds nothing: every page and slot back in the pools.
void expect_idle(const Engine& e) {
  EngineStats s;
  for (int i = 0; i < 500; ++i) {
    s = e.stats();
    if (s.running == 0 && s.queued == 0 && s.kv_pages_used == 0 && s.state_slots_used == 0)
      break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.queued, 0);
  EXPECT_EQ(s.kv_pages_used, 0);
  EXPECT_EQ(s.state_slots_used, 0);
}

}  // namespace
}  // namespace sala
