#include "common/thread_pool.h"

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace tokenselect::common {
namespace {

TEST(ThreadPoolTest, RunsEveryScheduledClosure) {
  std::atomic<int> sum{0};
  {
    ThreadPool pool(3);
    for (int i = 1; i <= 1000; ++i) pool.Schedule([&sum, i] { sum += i; });
    pool.WaitIdle();
    EXPECT_EQ(sum.load(), 500500);
  }
}

TEST(ThreadPoolTest, DestructorDrainsTheQueue) {
  std::atomic<int> count{0};
  {
    ThreadPool pool(2);
    for (int i = 0; i < 200; ++i) pool.Schedule([&count] { ++count; });
  }
  EXPECT_EQ(count.load(), 200);
}

TEST(ThreadPoolTest, RunsClosuresConcurrently) {
  // Two closures that each wait for the other can only finish on two threads at once.
  ThreadPool pool(2);
  absl::Notification a, b;
  pool.Schedule([&] {
    a.Notify();
    b.WaitForNotification();
  });
  pool.Schedule([&] {
    b.Notify();
    a.WaitForNotification();
  });
  pool.WaitIdle();
  EXPECT_TRUE(a.HasBeenNotified() && b.HasBeenNotified());
}

TEST(ThreadPoolTest, ParallelForCoversTheRangeExactlyOnce) {
  ThreadPool pool(4);
  for (int64_t n : {0, 1, 3, 4, 5, 17, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    std::atomic<int> calls{0};
    pool.ParallelFor(n, [&](int64_t begin, int64_t end) {
      ++calls;
      EXPECT_LT(begin, end);
      for (int64_t i = begin; i < end; ++i) ++hits[i];
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    EXPECT_LE(calls.load(), 4);
    EXPECT_EQ(calls.load() == 0, n == 0);
  }
}

TEST(ThreadPoolTest, ZeroThreadsMeansOne) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.num_threads(), 1);
  std::atomic<bool> ran{false};
  pool.Schedule([&] { ran = true; });
  pool.WaitIdle();
  EXPECT_TRUE(ran.load());
}

}  // namespace
}  // namespace tokenselect::common
