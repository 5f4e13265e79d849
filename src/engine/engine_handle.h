// The engine's hand-offs with HTTP threads (engine.cpp's internals): the inbox (new requests,
// cancellations) and each request's handle, whose outbox the engine thread fills.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace sala {
namespace engine_detail {

struct Request;  // engine.cpp: a request as the engine thread keeps it

// What HTTP threads hand to the engine thread. Shared with handles so that cancel() stays
// safe after the engine is gone.
struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Request*> incoming;  // owned (released into the engine's map on drain)
  std::vector<uint64_t> cancels;
  bool stop = false;
};

class Handle final : public RequestHandle {
 public:
  Handle(uint64_t id, std::shared_ptr<Inbox> inbox) : id_(id), inbox_(std::move(inbox)) {}

  bool next(TokenEvent& ev, std::chrono::milliseconds timeout) override {
    std::unique_lock lk(mu_);
    if (!cv_.wait_for(lk, timeout, [&] { return !events_.empty() || final_read_; }))
      return false;
    if (events_.empty()) {  // the final event was read before
      ev = final_;
      return true;
    }
    ev = std::move(events_.front());
    events_.pop_front();
    if (ev.finished) final_read_ = true;
    return true;
  }

  void cancel() override {
    if (cancelled_.exchange(true)) return;
    std::lock_guard lk(inbox_->mu);
    inbox_->cancels.push_back(id_);
    inbox_->cv.notify_one();
  }

  uint64_t id() const override { return id_; }
  bool cancelled() const { return cancelled_.load(); }

  // Engine thread: new tokens, merged into the last unread event when there is one.
  // lps: n_lps log-probabilities (toks', then a matched stop token's); prompt_lps: moved in.
  void emit(const int32_t* toks, size_t n, bool finished, FinishReason reason, int32_t matched,
            const std::string& error, int32_t prompt_tokens, int32_t completion_tokens,
            const TokenLogprob* lps = nullptr, size_t n_lps = 0,
            std::vector<TokenLogprob>* prompt_lps = nullptr) {
    {
      std::lock_guard lk(mu_);
      if (final_pushed_) return;
      if (events_.empty()) events_.emplace_back();
      TokenEvent& ev = events_.back();
      ev.tokens.insert(ev.tokens.end(), toks, toks + n);
      if (lps) ev.logprobs.insert(ev.logprobs.end(), lps, lps + n_lps);
      if (prompt_lps) {
        for (auto& lp : *prompt_lps) ev.prompt_logprobs.push_back(std::move(lp));
        prompt_lps->clear();
      }
      ev.finished = finished;
      ev.reason = reason;
      ev.matched_stop_token = matched;
      ev.error = error;
      ev.prompt_tokens = prompt_tokens;
      ev.completion_tokens = completion_tokens;
      if (finished) {
        final_pushed_ = true;
        final_ = ev;
        final_.tokens.clear();
        final_.logprobs.clear();
        final_.prompt_logprobs.clear();
      }
    }
    cv_.notify_all();
  }

 private:
  const uint64_t id_;
  std::shared_ptr<Inbox> inbox_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  TokenEvent final_;
  bool final_pushed_ = false, final_read_ = false;
};

}  // namespace engine_detail
}  // namespace sala
