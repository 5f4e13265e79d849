// The engine thread: inbox → scheduler → one StepMeta → Model::forward → sample → outboxes.
// Ownership: the engine thread owns the model, the pools, the scheduler and every Request;
// HTTP threads touch only the inbox (under its mutex) and their own handle's outbox.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "core/check.h"
#include "core/error.h"
#include "engine/block_pool.h"
#include "engine/device_sampling.h"
#include "engine/draft_model.h"
#include "engine/engine.h"
#include "engine/engine_handle.h"
#include "engine/request_check.h"
#include "engine/request_grammar.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/state_pool.h"
#include "engine/step_logprobs.h"

namespace sala {
namespace engine_detail {
struct Request : Sequence {
  std::shared_ptr<Handle> handle;
  SamplingParams sampling;
  SamplerState sampler;
  int32_t generated = 0;
  LogprobState lp;
  std::unique_ptr<RequestGrammar> grammar;  // structured output (request_grammar.h)
  bool grammar_complete = false;            // the last token completed the grammar
};
}  // namespace engine_detail

namespace {
using engine_detail::Handle;
using engine_detail::Inbox;
using engine_detail::Request;

class EngineImpl final : public Engine {
 public:
  EngineImpl(std::unique_ptr<Model> model, const EngineOptions& opts, std::unique_ptr<Model> draft)
      : model_(std::move(model)), inbox_(std::make_shared<Inbox>()),
        speculator_(opts.speculative, model_->limits().caches.num_slots / 2,
                    make_drafter(opts.speculative, std::move(draft), model_->config(),
                                 opts.dense_as_sparse),
                    [this](const Sequence& s) { return draft_policy(s); }) {
    const ModelConfig& cfg = model_->config();
    const ModelLimits& lim = model_->limits();
    const EngineOptions o = fit_engine_options(opts, cfg, lim);
    const int32_t slots = request_state_slots(o, lim);
    opts_ = o;
    info_.options = o;
    info_.max_context_len = o.max_context_len;
    info_.vocab_size = cfg.vocab_size;
    info_.page_size = lim.caches.page_size;
    info_.num_pages = lim.caches.num_pages;
    info_.num_slots = slots;
    info_.max_total_tokens = int64_t(lim.caches.num_pages) * lim.caches.page_size;
    info_.eos_token_ids.assign(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end());
    blocks_ = std::make_unique<BlockPool>(lim.caches.num_pages, lim.caches.page_size);
    states_ = std::make_unique<StatePool>(slots);
    scheduler_ = std::make_unique<Scheduler>(
        SchedulerOptions{o.max_running_requests, o.chunked_prefill_size, o.max_step_tokens,
                         cfg.sparse.first_sparse_len(o.dense_as_sparse), o.schedule_policy},
        *blocks_, *states_);
    stats_.kv_pages_total = lim.caches.num_pages;
    stats_.state_slots_total = slots;
    requests_.reserve(size_t(o.max_running_requests + o.max_queued_requests) * 2);
    alive_ = true;
    thread_ = std::thread([this] { loop(); });
  }

  ~EngineImpl() override { shutdown(); }

  std::shared_ptr<RequestHandle> submit(GenerationRequest req) override {
    const SamplingParams& sp = req.sampling;
    const int64_t n = int64_t(req.prompt.size());
    check_prompt_length(n, info_.max_context_len);
    for (int32_t t : req.prompt)
      if (t < 0 || t >= info_.vocab_size)
        throw InvalidRequest("prompt", fmt::format("prompt token id {} is out of range "
                                                   "(vocabulary size {})", t, info_.vocab_size));
    if (blocks_->pages_for(n) > blocks_->total())
      fail("the prompt has {} tokens; the KV cache holds at most {} tokens", n,
           info_.max_total_tokens);
    const LogprobOptions& lo = req.logprobs;
    if (lo.top_n < 0 || lo.top_n > kMaxTopLogprobs)
      throw InvalidRequest("top_logprobs", fmt::format("'top_logprobs' must be in [0, {}], got {}",
                                                       kMaxTopLogprobs, lo.top_n));
    if (lo.prompt_start < -1 || lo.prompt_start >= n)
      throw InvalidRequest("logprob_start_len",
                           fmt::format("'logprob_start_len' must be in [-1, {}) (the prompt's "
                                       "length), got {}", n, lo.prompt_start));
    // No context limit on the budget here: generation ends at the context (finish "length").
    // A budget of 0 scores the prompt (its logprobs) and generates nothing.
    check_new_tokens(sp.max_new_tokens, n, /*max_context_len=*/0, "max_new_tokens",
                     /*allow_zero=*/lo.prompt_start >= 0);
    check_sampling(sp);
    check_logit_bias_ids(sp, info_.vocab_size);
    check_min_new_tokens(sp.min_new_tokens, sp.max_new_tokens);

    auto r = std::make_unique<Request>();
    r->id = next_id_.fetch_add(1) + 1;
    r->prompt_len = int32_t(n);
    r->sampling = std::move(req.sampling);
    r->lp.opts = lo;
    r->lp.prompt_next = lo.prompt_start;
    r->sampler.init(r->sampling, req.prompt, info_.vocab_size);
    if (req.grammar) {  // the first mask is filled here, on the caller's thread
      r->grammar = std::make_unique<RequestGrammar>(std::move(req.grammar));
      SALA_CHECK(r->grammar->vocab_size() == info_.vocab_size,
                 "grammar compiled for a vocabulary of {}, the model's is {}",
                 r->grammar->vocab_size(), info_.vocab_size);
    }
    r->tokens = std::move(req.prompt);
    r->tokens.reserve(size_t(std::min<int64_t>(n + r->sampling.max_new_tokens,
                                               info_.max_context_len)));
    r->handle = std::make_shared<Handle>(r->id, inbox_);
    std::shared_ptr<RequestHandle> h = r->handle;
    {
      std::lock_guard lk(inbox_->mu);
      if (inbox_->stop) fail("the engine is shut down");
      if (int64_t(inbox_->incoming.size()) + waiting_count_.load() >= opts_.max_queued_requests)
        throw QueueFull();
      inbox_->incoming.push_back(r.release());
      inbox_->cv.notify_one();
    }
    {
      std::lock_guard lk(stats_mu_);
      ++stats_.requests_total;
      ++stats_.queued;
    }
    return h;
  }

  EngineStats stats() const override {
    std::lock_guard lk(stats_mu_);
    return stats_;
  }

  bool alive() const override { return alive_.load(); }

  EngineInfo info() const override { return info_; }

  void shutdown() override {
    {
      std::lock_guard lk(inbox_->mu);
      inbox_->stop = true;
      inbox_->cv.notify_one();
    }
    std::lock_guard lk(join_mu_);
    if (thread_.joinable()) thread_.join();
  }

 private:
  bool has_work() const {
    return !scheduler_->running().empty() || !scheduler_->waiting().empty();
  }

  void loop() {
    std::vector<Request*> incoming;
    std::vector<uint64_t> cancels;
    for (;;) {
      {
        std::unique_lock lk(inbox_->mu);
        inbox_->cv.wait(lk, [&] {
          return inbox_->stop || !inbox_->incoming.empty() || !inbox_->cancels.empty() ||
                 has_work();
        });
        if (inbox_->stop) {
          incoming.swap(inbox_->incoming);
          break;
        }
        incoming.swap(inbox_->incoming);
        cancels.swap(inbox_->cancels);
        // They join the waiting queue now: keep submit's queue bound exact.
        waiting_count_ += int64_t(incoming.size());
      }
      for (Request* raw : incoming) {
        std::unique_ptr<Request> r(raw);
        Request* p = r.get();
        requests_.emplace(p->id, std::move(r));
        scheduler_->add(p);
        if (p->handle->cancelled()) finish(p, FinishReason::Aborted);
      }
      incoming.clear();
      for (uint64_t id : cancels) {
        auto it = requests_.find(id);
        if (it != requests_.end()) finish(it->second.get(), FinishReason::Aborted);
      }
      cancels.clear();
      if (has_work()) {
        try {
          step();
        } catch (const std::exception& e) {
          std::fprintf(stderr, "engine: step failed: %s\n", e.what());
          fail_all(fmt::format("engine step failed: {}", e.what()));
        }
      }
      publish_stats();
    }
    // Shutdown: abort everything, queued or running.
    for (Request* raw : incoming) {
      std::unique_ptr<Request> r(raw);
      r->handle->emit(nullptr, 0, true, FinishReason::Aborted, -1, {}, int32_t(r->prompt_len), 0);
      std::lock_guard lk(stats_mu_);
      ++stats_.requests_aborted;
    }
    while (!requests_.empty()) finish(requests_.begin()->second.get(), FinishReason::Aborted);
    publish_stats();
    alive_ = false;
  }

  void fail_all(const std::string& msg) {
    while (!requests_.empty())
      finish(requests_.begin()->second.get(), FinishReason::Error, -1, msg);
  }

  // Plain requests may draft (speculative.h; grammar: masked rows): at most the tokens they may
  // still generate beyond the step's bonus token, within the context.
  DraftPolicy draft_policy(const Sequence& s) const {
    const auto& r = static_cast<const Request&>(s);
    if (!r.sampler.plain(r.sampling) || r.lp.opts.output || r.grammar) return {};
    const int64_t left = std::min<int64_t>(r.sampling.max_new_tokens - r.generated,
                                           info_.max_context_len - int64_t(r.tokens.size())) - 1;
    return {true, int32_t(std::clamp<int64_t>(left, 0, opts_.speculative.num_draft_tokens)),
            &r.sampling, r.sampler.seed()};
  }

  void step() {
    const auto t_step = std::chrono::steady_clock::now();
    speculator_.draft(scheduler_->running(), *scheduler_);
    scheduler_->schedule(plan_);
    sync_waiting_count();  // before any event of this step reaches a client
    for (Sequence* s : plan_.out_of_memory)  // the KV pool is this request's context limit
      finish(static_cast<Request*>(s), FinishReason::Length);
    if (plan_.items.empty()) {
      SALA_CHECK(!plan_.out_of_memory.empty() || !plan_.preempted.empty() || !has_work(),
                 "scheduler planned nothing with {} running, {} waiting",
                 scheduler_->running().size(), scheduler_->waiting().size());
      return;
    }
    meta_.token_ids.clear();
    meta_.positions.clear();
    meta_.seqs.clear();
    meta_.page_table.clear();
    meta_.logit_rows.clear();
    meta_.dense_as_sparse = opts_.dense_as_sparse;
    meta_.keep_lightning_rows = false;  // set below for steps with a verify call
    bool chunk = false, decode = false;  // the step's kind (EngineStats); verify calls decode
    logit_rows_.clear();
    for (const ScheduledSeq& it : plan_.items) {
      const Sequence* s = it.seq;
      const int32_t n = call_logit_rows(it);  // all rows for verify calls and recomputes
      logit_rows_.push_back(n);
      meta_.add_seq(s->tokens.data() + s->num_computed, it.num_tokens, s->num_computed, s->slot,
                    s->pages, n > 1, n == 1);
      (s->spec.drafts > 0 || it.num_tokens == 1 ? decode : chunk) = true;
      meta_.keep_lightning_rows |= s->spec.drafts > 0 && it.sample;  // Speculator::settle
    }
    speculator_.planned(plan_, *model_);
    // A step whose sampled rows are all plain greedy takes the argmax on the device and
    // moves R ids instead of R × vocab logits to the host; other steps sample on the backend
    // (device_sampling.h) unless a sampled verify call needs its rows on the host.
    bool greedy_only = true, host_rows = false;
    for (const ScheduledSeq& it : plan_.items) {
      const Request* r = static_cast<const Request*>(it.seq);
      greedy_only &= !it.sample || r->sampler.plain_greedy(r->sampling);
      host_rows |= it.sample && r->spec.drafts > 0;
    }
    const bool on_device = !greedy_only && !(host_rows || !opts_.device_sampling ||
                                             !model_->backend().samples_rows());
    prompt_rows_.plan(plan_, meta_, [](Sequence* s) -> LogprobState& {
      return static_cast<Request*>(s)->lp;
    });
    collect_grammar_masks(plan_, logit_rows_, masks_, [](const Sequence* s) {
      return static_cast<const Request*>(s)->grammar.get();
    });
    const auto t_forward = std::chrono::steady_clock::now();
    model_->forward(meta_, logits_, nullptr, greedy_only ? &argmax_ : nullptr,
                    &prompt_rows_.rows(), &masks_, on_device);
    const double forward_s = seconds_since(t_forward);
    if (on_device) sample_on_device();
    prompt_rows_.collect();
    for (const ScheduledSeq& it : plan_.items) {
      Request* r = static_cast<Request*>(it.seq);
      if (!r->lp.pending.empty())
        r->handle->emit(nullptr, 0, false, FinishReason::None, -1, {}, int32_t(r->prompt_len),
                        r->generated, nullptr, 0, &r->lp.pending);
    }
    scheduler_->commit(plan_);
    const int32_t V = info_.vocab_size;
    size_t row = 0;
    int64_t generated = 0;
    sampled_.clear();
    sampled_lp_.clear();
    for (size_t i = 0; i < plan_.items.size(); ++i) {
      const ScheduledSeq& it = plan_.items[i];
      if (!it.sample) continue;
      Request* r = static_cast<Request*>(it.seq);
      if (r->spec.drafts > 0) {  // a verify call: its rows decide which drafts are kept
        const int32_t a = verify_rows(
            r->tokens.data() + r->spec.base, r->spec.drafts,
            greedy_only ? argmax_.data() + row : nullptr, logits_.data() + row * size_t(V), V,
            sampler_, r->sampling, r->sampler, spec_emit_, speculator_.proposal(*r));
        row += size_t(logit_rows_[i]);
        speculator_.settle(*r, a, *model_);
        // Emitted one by one (no logprobs: draft_cap), so that a stop token or the length
        // limit ends the request at its own token and the rest is dropped.
        for (int32_t tok : spec_emit_) {
          r->sampler.observe(tok);
          r->tokens.push_back(tok);
          ++r->generated;
          ++generated;
          if (!on_token(r, tok, nullptr)) break;  // finished (and freed)
        }
        continue;
      }
      row += size_t(logit_rows_[i]);
      const size_t this_row = row - 1;  // the call's last row
      if (r->sampling.max_new_tokens == 0) {  // scoring: its prompt logprobs are out, no token
        finish(r, FinishReason::Length);
        continue;
      }
      float* row_logits = logits_.data() + this_row * size_t(V);
      const bool host = !greedy_only && !on_device;
      if (host) adjust_logits(row_logits, V, r->sampling, r->generated, info_.eos_token_ids);
      const int32_t tok = greedy_only ? argmax_[this_row]
                          : on_device ? device_tokens_[this_row]
                                      : sampler_.sample(row_logits, V, r->sampling, r->sampler);
      if (r->grammar && !advance_grammar(r, tok)) continue;
      r->sampler.observe(tok);
      r->tokens.push_back(tok);
      ++r->generated;
      ++generated;
      sampled_.push_back({r, tok});
      if (r->lp.opts.output) {
        sampled_lp_.rows.push_back(int32_t(this_row));
        sampled_lp_.targets.push_back(tok);
        sampled_lp_.top_n = std::max(sampled_lp_.top_n, r->lp.opts.top_n);
      }
    }
    SALA_CHECK(row == meta_.logit_rows.size());
    // The sampled tokens' logprobs, from the logits the step left on the device.
    model_->logprobs(sampled_lp_);
    size_t li = 0;
    for (const auto& [r, tok] : sampled_) {
      if (!r->lp.opts.output) {
        on_token(r, tok, nullptr);
        continue;
      }
      TokenLogprob lp = logprob_at(sampled_lp_, li++, tok, r->lp.opts.top_n);
      on_token(r, tok, &lp);
    }
    speculator_.end_step();
    std::lock_guard lk(stats_mu_);
    ++stats_.steps;
    stats_.step_tokens_total += plan_.num_tokens;
    stats_.generated_tokens_total += generated;
    (chunk && decode ? stats_.mixed_steps : chunk ? stats_.prefill_steps : stats_.decode_steps)
        .add(seconds_since(t_step), forward_s);
  }

  static double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  // The step's sampled rows (no verify call among them) on the backend, in row order.
  void sample_on_device() {
    device_.clear();
    int32_t row = 0;
    for (size_t i = 0; i < plan_.items.size(); ++i) {
      if (!plan_.items[i].sample) continue;
      Request* r = static_cast<Request*>(plan_.items[i].seq);
      row += logit_rows_[i];
      if (r->sampling.max_new_tokens > 0)  // else scoring: no token; the call's last row
        device_.add(row - 1, r->id, r->sampling, r->sampler, r->tokens, int32_t(r->prompt_len),
                    r->generated, r->slot, info_.eos_token_ids, info_.vocab_size,
                    model_->backend());
    }
    if (!device_.empty()) device_.run(model_->backend(), model_->logits(), device_tokens_);
  }

  // The sampled token through the request's grammar; false if the request ended (the grammar
  // refused the token: an engine bug, reported as the request's error, not a crash).
  bool advance_grammar(Request* r, int32_t tok) {
    switch (r->grammar->accept(tok)) {
      case RequestGrammar::Next::Continue: return true;
      case RequestGrammar::Next::Complete:
        // a stop token ends the request anyway
        r->grammar_complete = !is_stop_token(r->sampling, info_.eos_token_ids, tok);
        return true;
      case RequestGrammar::Next::Refused: break;
    }
    finish(r, FinishReason::Error, -1, fmt::format("the grammar refused sampled token {}", tok));
    return false;
  }

  // false: the request finished (and is freed).
  bool on_token(Request* r, int32_t tok, const TokenLogprob* lp) {
    // A stop token is not shown, but counted, and its logprob reported.
    if (is_stop_token(r->sampling, info_.eos_token_ids, tok)) {
      finish(r, FinishReason::StopToken, tok, {}, nullptr, 0, lp);
      return false;
    }
    if (r->grammar_complete) {  // a complete output that cannot go on: done, as with a stop
      finish(r, FinishReason::GrammarComplete, -1, {}, &tok, 1, lp);
      return false;
    }
    const bool length = r->generated >= r->sampling.max_new_tokens ||
                        int64_t(r->tokens.size()) >= info_.max_context_len;
    if (length) {
      finish(r, FinishReason::Length, -1, {}, &tok, 1, lp);
      return false;
    }
    r->handle->emit(&tok, 1, false, FinishReason::None, -1, {}, int32_t(r->prompt_len), r->generated,
                    lp, lp ? 1 : 0);
    return true;
  }

  // Frees the request's pages and slot, sends its final event and forgets it.
  void finish(Request* r, FinishReason reason, int32_t matched = -1, const std::string& err = {},
              const int32_t* toks = nullptr, size_t n = 0, const TokenLogprob* lps = nullptr) {
    speculator_.forget(r);
    scheduler_->remove(r);
    // lps: one per token of toks, or the matched stop token's (toks empty).
    r->handle->emit(toks, n, true, reason, matched, err, int32_t(r->prompt_len), r->generated, lps,
                    lps ? std::max<size_t>(n, 1) : 0);
    {
      std::lock_guard lk(stats_mu_);
      if (reason == FinishReason::Aborted || reason == FinishReason::Error)
        ++stats_.requests_aborted;
      else
        ++stats_.requests_finished;
      stats_.prompt_tokens_total += r->prompt_len;
    }
    requests_.erase(r->id);
  }

  void sync_waiting_count() {
    std::lock_guard lk(inbox_->mu);
    waiting_count_ = int64_t(scheduler_->waiting().size());
  }

  void publish_stats() {
    const int64_t waiting = int64_t(scheduler_->waiting().size());
    int64_t inbox = 0;
    {
      std::lock_guard lk(inbox_->mu);
      inbox = int64_t(inbox_->incoming.size());
      waiting_count_ = waiting;
    }
    std::lock_guard lk(stats_mu_);
    stats_.running = int64_t(scheduler_->running().size());
    stats_.queued = waiting + inbox;
    stats_.kv_pages_used = blocks_->used();
    stats_.state_slots_used = states_->used();
    stats_.preemptions = scheduler_->preemptions();
    stats_.spec_verify_calls = speculator_.verify_calls();
    stats_.spec_drafted_tokens = speculator_.drafted_tokens();
    stats_.spec_accepted_tokens = speculator_.accepted_tokens();
    stats_.spec_rollbacks = speculator_.rollbacks();
    stats_.spec_draft_rollbacks = speculator_.drafter_rollbacks();
    std::tie(stats_.spec_draft_pages_used, stats_.spec_draft_slots_used) = speculator_.drafter_usage();
  }

  std::unique_ptr<Model> model_;
  EngineOptions opts_;
  EngineInfo info_;
  std::shared_ptr<Inbox> inbox_;
  std::unique_ptr<BlockPool> blocks_;
  std::unique_ptr<StatePool> states_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests_;  // engine thread only
  Sampler sampler_;
  std::vector<int32_t> argmax_;  // greedy-only steps: one id per logit row
  DeviceSampling device_;              // sampled steps on the backend
  std::vector<int32_t> device_tokens_;  // their tokens, by logit row
  Speculator speculator_;
  std::vector<int32_t> spec_emit_;  // a verify call's tokens to emit
  std::vector<int32_t> logit_rows_;  // per plan item: its logit rows (call_logit_rows)
  PromptLogprobRows prompt_rows_;       // this step's prompt-logprob rows
  std::vector<std::pair<Request*, int32_t>> sampled_;  // this step's sampled tokens
  RowLogprobs sampled_lp_;              // logit rows of sampled tokens that want logprobs
  LogitMasks masks_;                    // this step's grammar masks
  SchedulePlan plan_;
  StepMeta meta_;
  std::vector<float> logits_;
  std::atomic<uint64_t> next_id_{0};
  std::atomic<int64_t> waiting_count_{0};
  std::atomic<bool> alive_{false};
  mutable std::mutex stats_mu_;
  EngineStats stats_;
  std::mutex join_mu_;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Engine> make_engine(std::unique_ptr<Model> model, const EngineOptions& opts,
                                    std::unique_ptr<Model> draft_model) {
  SALA_CHECK(model != nullptr);
  return std::make_unique<EngineImpl>(std::move(model), opts, std::move(draft_model));
}

}  // namespace sala
