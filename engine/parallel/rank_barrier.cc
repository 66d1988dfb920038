#include "engine/parallel/rank_barrier.h"

namespace tokenselect::engine {
namespace {

absl::Status Aborted() {
  return absl::FailedPreconditionError(
      "tensor-parallel group aborted after an error: a rank left the step");
}

}  // namespace

absl::Status RankBarrier::Wait() {
  int64_t mine = 0;
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) return Aborted();
    mine = generation_;
    if (++arrived_ == parties_) {
      arrived_ = 0;
      ++generation_;
      published_.store(generation_, std::memory_order_release);
      return absl::OkStatus();
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1;; ++i) {
    if (published_.load(std::memory_order_acquire) != mine) return absl::OkStatus();
    if (aborting_.load(std::memory_order_relaxed)) break;
    if (i % 64 == 0 && std::chrono::steady_clock::now() > deadline) break;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  absl::MutexLock lock(&mu_);
  struct Done {
    RankBarrier* self;
    int64_t mine;
  } done{this, mine};
  mu_.Await(absl::Condition(
      +[](Done* d) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return d->self->aborted_ || d->self->generation_ != d->mine;
      },
      &done));
  return generation_ != mine ? absl::OkStatus() : Aborted();
}

void RankBarrier::Abort() {
  aborting_.store(true, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  aborted_ = true;
}

}  // namespace tokenselect::engine
