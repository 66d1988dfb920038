// The buffers of a peer-memory all-reduce group (kernels/cuda/peer_all_reduce.h): per GPU the
// two areas' per-block call counters and receive areas (2 parities x one slot per rank, every
// word at the marker between calls: a large one for messages up to the push limit, a small one
// for decode's), plus one host-mapped abort word shared by the group. NcclTensorParallel sends
// a collective here instead of to NCCL when its message fits (docs/parallel.md;
// bench_allreduce_cuda on 2 x H200, fifteenth session: 4 MiB, the soft vote over 1M tokens,
// 15.6 us against NCCL's 32.4; 8 MiB, a 512-token chunk's residual, 27.5 against 46.0; 16 KiB,
// a decode step's residual, 3.3 us against 6.7 in the small area). With 2 ranks a sum of two
// values does not depend on the order, so the results are bitwise NCCL's.
//
// Environment: TS_TP_ALLREDUCE=nccl sends everything to NCCL (for comparisons);
// TS_TP_PEER_MAX_BYTES=N caps the bytes one call pushes to its peers, message bytes x (ranks -
// 1); TS_TP_PEER_SMALL_BYTES=N the largest message of the small area (default
// kDefaultSmallBytes; 0: none). Default: 8 MiB on 2 GPUs; on more GPUs the group is off (on
// 4 x H200, eighth session, it was no faster than NCCL for small messages and slower from
// 256 KiB, and its rank-order sums differ from NCCL's ring in the last bits, which changes
// near-tie selections against earlier runs).
#ifndef TOKENSELECT_ENGINE_PARALLEL_PEER_ALL_REDUCE_H_
#define TOKENSELECT_ENGINE_PARALLEL_PEER_ALL_REDUCE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/peer_all_reduce.h"

namespace tokenselect::engine {

class PeerAllReduceGroup {
 public:
  static constexpr int64_t kDefaultMaxPushBytes = int64_t{8} << 20;
  // Decode's small all-reduces (a 4096-float hidden state, a 32 x 128 query) fit.
  static constexpr int64_t kDefaultSmallBytes = int64_t{64} << 10;

  // Buffers on every device of `devices` (rank order), peer access enabled between every
  // pair. max_push_bytes: see above (<= 0: the environment's or the default). Unavailable
  // when some pair of devices cannot reach each other's memory, there are fewer than 2 or
  // more than kPeerMaxRanks devices, TS_TP_ALLREDUCE=nccl, or the limit is 0; ResourceExhausted
  // when an allocation fails (everything made so far is freed).
  static absl::StatusOr<std::shared_ptr<PeerAllReduceGroup>> Create(
      const std::vector<int>& devices, int64_t max_push_bytes = 0);
  ~PeerAllReduceGroup();  // frees every device's buffers: only after the group's last call ran
  PeerAllReduceGroup(const PeerAllReduceGroup&) = delete;
  PeerAllReduceGroup& operator=(const PeerAllReduceGroup&) = delete;

  int size() const { return static_cast<int>(devices_.size()); }
  const kernels::cuda::PeerAllReduceView& view(int rank) const { return views_[rank]; }
  // Whether a message of `bytes` goes through this group.
  bool Takes(int64_t bytes) const { return bytes <= views_.front().slot_bytes; }
  // Ends every wait of a call in flight or to come (their results are undefined): for tearing
  // a group down after one rank failed. Callable from any thread.
  void Abort();

 private:
  PeerAllReduceGroup() = default;

  std::vector<int> devices_;
  // Per rank: call counters, receive area, small receive area.
  std::vector<void*> buffers_;
  std::vector<kernels::cuda::PeerAllReduceView> views_;
  volatile int* abort_ = nullptr;  // pinned, mapped host memory
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_PARALLEL_PEER_ALL_REDUCE_H_
