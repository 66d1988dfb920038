// Clocks behind an interface so that leases, deadlines and timeouts can be tested without
// sleeping: production code takes a Clock*, tests pass a FakeClock and advance it.
#ifndef TOKENSELECT_COMMON_CLOCK_H_
#define TOKENSELECT_COMMON_CLOCK_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tokenselect::common {

class Clock {
 public:
  virtual ~Clock() = default;
  // Wall-clock time (for deadlines exchanged between processes).
  virtual absl::Time Now() = 0;
  // Blocks the caller for `d` of this clock's time.
  virtual void SleepFor(absl::Duration d) = 0;
  // The process-wide real clock.
  static Clock* Real();
};

// Monotonic nanoseconds for measuring intervals in benchmarks and timings.
int64_t MonotonicNanos();

// A stopwatch over MonotonicNanos().
class Stopwatch {
 public:
  Stopwatch() : start_(MonotonicNanos()) {}
  void Reset() { start_ = MonotonicNanos(); }
  int64_t ElapsedNanos() const { return MonotonicNanos() - start_; }
  double ElapsedSeconds() const { return static_cast<double>(ElapsedNanos()) * 1e-9; }

 private:
  int64_t start_;
};

// A clock that moves only when told to. SleepFor blocks until another thread advances the clock
// past the sleeper's wake-up time.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}
  absl::Time Now() override;
  void SleepFor(absl::Duration d) override;
  void Advance(absl::Duration d);
  // Number of threads blocked in SleepFor right now (lets tests wait for a sleeper).
  int sleepers();

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  int sleepers_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tokenselect::common

#endif  // TOKENSELECT_COMMON_CLOCK_H_
