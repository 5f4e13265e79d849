// ConnectionPool's order (src/server/conn_pool.h): arrival order while few connections wait,
// newest first once more than `lifo_after` do, so a flood cannot queue a fresh one behind it.
#include "server/conn_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <vector>

using sala::server::ConnectionPool;

namespace {

// One worker, held busy by a first job until released, with `queued` jobs queued behind it;
// returns the order in which the queued jobs ran.
std::vector<int> run_order(int queued, size_t lifo_after) {
  std::vector<int> order;
  std::mutex mu;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> started{false};
  {
    ConnectionPool pool(1, lifo_after);
    pool.enqueue([&] {
      started = true;
      released.wait();
    });
    while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (int i = 0; i < queued; ++i)
      pool.enqueue([&, i] {
        std::lock_guard<std::mutex> lk(mu);
        order.push_back(i);
      });
    release.set_value();
    pool.shutdown();  // runs every queued job before it returns
  }
  return order;
}

TEST(ConnectionPool, ShortQueueInArrivalOrder) {
  EXPECT_EQ(run_order(4, 8), (std::vector<int>{0, 1, 2, 3}));
}

TEST(ConnectionPool, LongQueueNewestFirstUntilShort) {
  // 12 waiting, more than 8: the newest go first (11, 10, 9, 8) until 8 wait, then in order.
  EXPECT_EQ(run_order(12, 8), (std::vector<int>{11, 10, 9, 8, 0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(ConnectionPool, ShutdownRunsQueuedJobsAndIsIdempotent) {
  std::atomic<int> ran{0};
  ConnectionPool pool(2, 64);
  for (int i = 0; i < 100; ++i) pool.enqueue([&] { ran++; });
  pool.shutdown();
  EXPECT_EQ(ran.load(), 100);
  pool.shutdown();  // the destructor calls it again, as httplib's listener did first
}

}  // namespace
