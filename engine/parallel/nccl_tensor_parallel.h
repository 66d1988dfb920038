// CudaTensorParallel (engine/model/cuda_attention.h) over NCCL: one communicator per rank of a
// group of GPUs in this process, made together by ncclCommInitAll. AllReduceSum is one
// ncclAllReduce (sum) on the caller's stream, so it can be captured in a CUDA graph; NCCL
// returns the same reduced values on every rank. Messages small enough for the group's
// PeerAllReduceGroup (peer_all_reduce.h; GPUs with peer access) go through its kernel instead,
// also one launch on the caller's stream with bitwise-equal sums on every rank. docs/parallel.md.
//
// Each rank's calls must come from a thread whose current device is that rank's device (the
// rank threads of rank_threads.h); the ranks' calls must match in order and size, as NCCL
// requires. NVLink multicast (NVLS) is left to the environment: the device hosts set
// NCCL_NVLS_ENABLE=0, and nothing here turns it on.
#ifndef TOKENSELECT_ENGINE_PARALLEL_NCCL_TENSOR_PARALLEL_H_
#define TOKENSELECT_ENGINE_PARALLEL_NCCL_TENSOR_PARALLEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/model/cuda_attention.h"
#include "engine/parallel/peer_all_reduce.h"

struct ncclComm;  // nccl.h's ncclComm_t is a ncclComm*; the header stays free of nccl.h

namespace tokenselect::engine {

class RankBarrier;  // the group's host barrier (rank_barrier.h)

class NcclTensorParallel : public CudaTensorParallel {
 public:
  // One rank per entry of `devices` (distinct CUDA device ordinals, at least one), in that
  // order. InvalidArgument for an empty or repeated list; Internal naming the NCCL error.
  // fixed_tree: every all-reduce sums in one fixed binary tree (SumsInFixedTree), for
  // TP-invariant numerics: with more than 2 ranks every message then goes through the peer-memory
  // group, made with room for kFixedTreeMaxBytes per message (Unavailable when the GPUs cannot
  // reach each other's memory), and a larger message is refused with ResourceExhausted.
  static absl::StatusOr<std::vector<std::unique_ptr<NcclTensorParallel>>> CreateGroup(
      const std::vector<int>& devices, bool fixed_tree = false);
  // The largest message of a fixed-tree group of more than 2 ranks: a 512-token chunk's residual
  // at hidden size 8192, or the votes of 4M candidates.
  static constexpr int64_t kFixedTreeMaxBytes = int64_t{16} << 20;
  bool SumsInFixedTree() const override { return size_ <= 2 || fixed_tree_; }
  // Destroys the communicator; call it on the rank's thread once its work has finished.
  ~NcclTensorParallel() override;
  NcclTensorParallel(const NcclTensorParallel&) = delete;
  NcclTensorParallel& operator=(const NcclTensorParallel&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduceSum(float* data, int64_t count, cudaStream_t stream) override;
  absl::Status AllReduceSum(double* data, int64_t count, cudaStream_t stream) override;
  // Skips only on the peer-memory path (NCCL has no device-side condition).
  absl::Status AllReduceSumUnless(float* data, int64_t count, const int32_t* skip,
                                  cudaStream_t stream) override;
  // Whether an all-reduce of `bytes` goes through the peer-memory kernel rather than NCCL.
  bool UsesPeerMemory(int64_t bytes) const { return peer_ != nullptr && peer_->Takes(bytes); }
  // A host barrier over the group's ranks (CudaTensorParallel::WaitForRanks).
  absl::Status WaitForRanks() override;

  // ncclCommAbort (and PeerAllReduceGroup::Abort): the rank's unfinished collectives end (their
  // kernels stop waiting for the other ranks), the group's barrier releases its waiters, and every
  // later call fails with FailedPrecondition. For a group in which one rank failed in the middle of
  // a step while the others wait for it in a collective; callable from any thread, also while the
  // rank's own thread enqueues (a mutex orders the two).
  void Abort();

  // TS_TP_TRACE=1 in the environment: every all-reduce is logged to stderr with the rank and
  // its sequence number (to find where ranks' collectives stop matching).
  static bool Tracing();

 private:
  NcclTensorParallel(::ncclComm* comm, int rank, int size, std::shared_ptr<RankBarrier> barrier,
                     std::shared_ptr<PeerAllReduceGroup> peer, bool fixed_tree)
      : comm_(comm),
        rank_(rank),
        size_(size),
        fixed_tree_(fixed_tree),
        barrier_(std::move(barrier)),
        peer_(std::move(peer)) {}
  absl::Status AllReduce(void* data, int64_t count, int type, cudaStream_t stream,
                         const int32_t* skip = nullptr);

  absl::Mutex mu_;
  ::ncclComm* comm_ ABSL_GUARDED_BY(mu_);  // ncclComm_t
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  const int rank_;
  const int size_;
  const bool fixed_tree_;
  const std::shared_ptr<RankBarrier> barrier_;      // shared by the group's ranks
  const std::shared_ptr<PeerAllReduceGroup> peer_;  // shared; null: NCCL only
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_PARALLEL_NCCL_TENSOR_PARALLEL_H_
