// The worker pool that runs connections (httplib's TaskQueue: the listener thread accepts
// and enqueues one job per connection; a worker runs its keep-alive loop, http_guard.cpp).
//
// Why not httplib's ThreadPool: it takes queued connections strictly in arrival order. Under
// a flood (a swarm of slow clients connecting faster than workers make room by evicting
// them) a fresh connection then waits behind every queued swarm member: a probe behind
// 10,000 of them took 2.9 s (tests/server/test_slow_swarm.py). Here, while more than
// `lifo_after` connections wait, the newest is taken first: a queue that long only builds
// up when arrivals outrun the workers, its oldest members are the flood's, and a client
// that just connected is likely still there to be answered. A shorter queue stays in order.
#pragma once

#include <httplib.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sala::server {

class ConnectionPool final : public httplib::TaskQueue {
 public:
  ConnectionPool(size_t threads, size_t lifo_after);
  ~ConnectionPool() override;
  void enqueue(std::function<void()> fn) override;
  // Runs every queued job, then joins the workers (as httplib's ThreadPool).
  void shutdown() override;

 private:
  void work();

  const size_t lifo_after_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace sala::server
