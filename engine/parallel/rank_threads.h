// One driver thread per rank of a tensor-parallel group, each with its rank's GPU as the current
// device, running the same job on every rank at once (lock step). The ranks must run
// concurrently: a rank's host code may wait on its stream while that stream waits, in a
// collective, for the other ranks' launches. docs/parallel.md.
#ifndef TOKENSELECT_ENGINE_PARALLEL_RANK_THREADS_H_
#define TOKENSELECT_ENGINE_PARALLEL_RANK_THREADS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace tokenselect::engine {

class RankThreads {
 public:
  using Job = std::function<absl::Status(int rank)>;

  // Starts one thread per entry of `devices` (rank r uses devices[r]).
  explicit RankThreads(std::vector<int> devices);
  // Joins the threads (waits for a job in flight).
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return static_cast<int>(devices_.size()); }
  int device(int rank) const { return devices_[rank]; }

  // Runs job(rank) on every rank's thread at once and waits for all of them. Returns the first
  // error in rank order (prefixed with the rank), or the device's error when cudaSetDevice
  // failed on that thread. One caller at a time, never from inside a job.
  absl::Status Run(const Job& job);

 private:
  void Loop(int rank);

  const std::vector<int> devices_;
  absl::Mutex mu_;
  const Job* job_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped per job
  int pending_ ABSL_GUARDED_BY(mu_) = 0;         // ranks still running the job
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<absl::Status> results_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_PARALLEL_RANK_THREADS_H_
