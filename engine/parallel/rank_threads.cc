#include "engine/parallel/rank_threads.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/cuda_status.h"

namespace tokenselect::engine {

RankThreads::RankThreads(std::vector<int> devices) : devices_(std::move(devices)) {
  {
    absl::MutexLock lock(&mu_);
    results_.assign(devices_.size(), absl::OkStatus());
  }
  for (int r = 0; r < size(); ++r) threads_.emplace_back([this, r] { Loop(r); });
}

RankThreads::~RankThreads() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void RankThreads::Loop(int rank) {
  const absl::Status device =
      kernels::cuda::CudaStatus(cudaSetDevice(devices_[rank]), "cudaSetDevice");
  int64_t seen = 0;
  while (true) {
    const Job* job = nullptr;
    {
      struct Wake {
        RankThreads* self;
        int64_t seen;
      } wake{this, seen};
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Wake* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return w->self->stop_ || w->self->generation_ != w->seen;
          },
          &wake));
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    absl::Status status = device.ok() ? (*job)(rank) : device;
    absl::MutexLock lock(&mu_);
    results_[rank] = std::move(status);
    --pending_;
  }
}

absl::Status RankThreads::Run(const Job& job) {
  absl::MutexLock lock(&mu_);
  job_ = &job;
  for (absl::Status& s : results_) s = absl::OkStatus();
  pending_ = size();
  ++generation_;
  mu_.Await(absl::Condition(
      +[](int* pending) { return *pending == 0; }, &pending_));
  job_ = nullptr;
  for (int r = 0; r < size(); ++r) {
    if (!results_[r].ok()) {
      return common::Annotate(results_[r], absl::StrCat("rank ", r, ": "));
    }
  }
  return absl::OkStatus();
}

}  // namespace tokenselect::engine
