#include "engine/parallel/rank_barrier.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace tokenselect::engine {
namespace {

// No thread passes round r before every thread has arrived at it: each thread bumps a counter
// before the barrier and checks after it that all threads' bumps of that round are visible.
TEST(RankBarrierTest, NoThreadPassesBeforeAllArrived) {
  for (int parties : {1, 2, 4}) {
    RankBarrier barrier(parties);
    constexpr int kRounds = 2000;
    std::atomic<int> arrived{0};
    std::atomic<int> early{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < parties; ++t) {
      threads.emplace_back([&, t] {
        for (int r = 0; r < kRounds; ++r) {
          // Uneven arrival: one thread sleeps now and then, so waiters also take the sleep path.
          if (t == 0 && r % 500 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
          arrived.fetch_add(1);
          ASSERT_TRUE(barrier.Wait().ok());
          if (arrived.load() < (r + 1) * parties) early.fetch_add(1);
          ASSERT_TRUE(barrier.Wait().ok());  // nobody starts round r + 1 before all checked r
        }
      });
    }
    for (std::thread& th : threads) th.join();
    EXPECT_EQ(early.load(), 0) << parties << " parties";
    EXPECT_EQ(arrived.load(), kRounds * parties);
  }
}

// Abort releases a thread waiting for a rank that never comes, and fails later waits.
TEST(RankBarrierTest, AbortReleasesWaitersAndFailsLaterWaits) {
  RankBarrier barrier(2);
  absl::Status waited;
  std::thread waiter([&] { waited = barrier.Wait(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the spin: asleep
  barrier.Abort();
  waiter.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(waited.message().find("aborted"), std::string::npos);
  EXPECT_EQ(barrier.Wait().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tokenselect::engine
