// A fixed-size pool of worker threads running closures in FIFO order.
//   ThreadPool pool(4);
//   pool.Schedule([&] { ... });
//   pool.ParallelFor(n, [&](int64_t begin, int64_t end) { ... });  // blocks until all done
// The destructor runs every closure already scheduled, then joins the threads.
#ifndef TOKENSELECT_COMMON_THREAD_POOL_H_
#define TOKENSELECT_COMMON_THREAD_POOL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tokenselect::common {

class ThreadPool {
 public:
  // num_threads < 1 is treated as 1.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `fn` to run on a worker. Scheduling after destruction has begun is a programming
  // error (checked).
  void Schedule(std::function<void()> fn);

  // Splits [0, n) into at most num_threads() contiguous ranges, runs fn(begin, end) on each
  // (the caller runs one of them) and returns when all have finished.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

  // Blocks until the queue is empty and no closure is running.
  void WaitIdle();

  int num_threads() const { return static_cast<int>(threads_.size()); }

 private:
  void WorkerLoop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace tokenselect::common

#endif  // TOKENSELECT_COMMON_THREAD_POOL_H_
