#include "common/thread_pool.h"

#include <algorithm>
#include <utility>

#include "absl/synchronization/blocking_counter.h"
#include "common/logging.h"

namespace tokenselect::common {

ThreadPool::ThreadPool(int num_threads) {
  const int n = std::max(1, num_threads);
  threads_.reserve(n);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void ThreadPool::Schedule(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  TS_CHECK(!stopping_, "ThreadPool::Schedule after destruction began");
  queue_.push_back(std::move(fn));
}

void ThreadPool::WorkerLoop() {
  while (true) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping and drained
      fn = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    fn();
    absl::MutexLock lock(&mu_);
    --running_;
  }
}

void ThreadPool::WaitIdle() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() && running_ == 0;
  };
  mu_.Await(absl::Condition(&idle));
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t parts = std::min<int64_t>(n, num_threads());
  const int64_t step = (n + parts - 1) / parts;
  const int64_t ranges = (n + step - 1) / step;
  absl::BlockingCounter done(static_cast<int>(ranges - 1));
  for (int64_t r = 1; r < ranges; ++r) {
    const int64_t begin = r * step;
    const int64_t end = std::min(n, begin + step);
    Schedule([&fn, &done, begin, end] {
      fn(begin, end);
      done.DecrementCount();
    });
  }
  fn(0, std::min(n, step));
  done.Wait();
}

}  // namespace tokenselect::common
