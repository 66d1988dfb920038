#include "common/clock.h"

#include <thread>

#include "gtest/gtest.h"

namespace tokenselect::common {
namespace {

TEST(ClockTest, FakeClockMovesOnlyWhenAdvanced) {
  FakeClock clock(absl::FromUnixSeconds(100));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(100));
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(105));
}

TEST(ClockTest, FakeSleepWakesWhenTheClockPassesTheDeadline) {
  FakeClock clock;
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    clock.SleepFor(absl::Seconds(10));
    woke = true;
  });
  while (clock.sleepers() == 0) absl::SleepFor(absl::Milliseconds(1));
  clock.Advance(absl::Seconds(9));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(woke.load());  // 9 s of fake time is not enough
  clock.Advance(absl::Seconds(1));
  sleeper.join();
  EXPECT_TRUE(woke.load());
  EXPECT_EQ(clock.sleepers(), 0);
}

TEST(ClockTest, RealClockAndStopwatchMoveForward) {
  Stopwatch watch;
  const absl::Time before = Clock::Real()->Now();
  Clock::Real()->SleepFor(absl::Milliseconds(5));
  EXPECT_GE(Clock::Real()->Now() - before, absl::Milliseconds(4));
  EXPECT_GE(watch.ElapsedNanos(), 4'000'000);
  EXPECT_GT(MonotonicNanos(), 0);
}

}  // namespace
}  // namespace tokenselect::common
