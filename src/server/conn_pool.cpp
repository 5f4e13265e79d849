#include "server/conn_pool.h"

namespace sala::server {

ConnectionPool::ConnectionPool(size_t threads, size_t lifo_after) : lifo_after_(lifo_after) {
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
}

ConnectionPool::~ConnectionPool() { shutdown(); }

void ConnectionPool::enqueue(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    jobs_.push_back(std::move(fn));
  }
  cv_.notify_one();
}

void ConnectionPool::shutdown() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ConnectionPool::work() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [this] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and nothing is left to run
      if (jobs_.size() > lifo_after_) {
        fn = std::move(jobs_.back());
        jobs_.pop_back();
      } else {
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
    }
    fn();
  }
}

}  // namespace sala::server
