// A host barrier for the driver threads of a tensor-parallel group (docs/parallel.md, "Launch
// barrier"): Wait returns once every one of `parties` threads has called it (as often); Abort
// releases the waiters and fails every later Wait with FailedPrecondition. The ranks of a step
// arrive within microseconds of each other, less than a sleeping thread takes to wake, so a
// waiter first spins (up to 100 us) on an atomic copy of the generation, then sleeps.
#ifndef TOKENSELECT_ENGINE_PARALLEL_RANK_BARRIER_H_
#define TOKENSELECT_ENGINE_PARALLEL_RANK_BARRIER_H_

#include <atomic>
#include <chrono>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace tokenselect::engine {

class RankBarrier {
 public:
  explicit RankBarrier(int parties) : parties_(parties) {}
  RankBarrier(const RankBarrier&) = delete;
  RankBarrier& operator=(const RankBarrier&) = delete;

  absl::Status Wait();
  void Abort();

 private:
  static constexpr std::chrono::microseconds kSpin{100};

  absl::Mutex mu_;
  const int parties_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> published_{0};  // generation_, read without the mutex
  std::atomic<bool> aborting_{false};
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_PARALLEL_RANK_BARRIER_H_
