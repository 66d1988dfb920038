#include "common/clock.h"

#include <chrono>

namespace tokenselect::common {
namespace {

class RealClock : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
  void SleepFor(absl::Duration d) override { absl::SleepFor(d); }
};

}  // namespace

Clock* Clock::Real() {
  static RealClock* clock = new RealClock();
  return clock;
}

int64_t MonotonicNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::Time FakeClock::Now() {
  absl::MutexLock lock(&mu_);
  return now_;
}

void FakeClock::SleepFor(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  const absl::Time wake = now_ + d;
  ++sleepers_;
  auto woken = [this, wake]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return now_ >= wake; };
  mu_.Await(absl::Condition(&woken));
  --sleepers_;
}

void FakeClock::Advance(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  now_ += d;
}

int FakeClock::sleepers() {
  absl::MutexLock lock(&mu_);
  return sleepers_;
}

}  // namespace tokenselect::common
