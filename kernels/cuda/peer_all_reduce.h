// All-reduce (sum) over the GPUs of one process through peer memory (NVLink), for tensor
// parallelism's small and mid-sized collectives (engine/parallel/peer_all_reduce.h owns the
// buffers; docs/parallel.md says when it is used instead of NCCL).
//
// One kernel per rank and call, on the rank's stream (so it can be captured in a CUDA graph).
// "Push, then sum locally": block b of every rank
//   1. writes its slice of the rank's values into every peer's receive slot for this rank
//      (remote stores over NVLink, no round trip),
//   2. fences (system scope) and raises its flag in every peer's flag array to this call's
//      epoch, then waits until each peer's block b has raised its flag here,
//   3. sums the slice over the ranks in rank order (((x0 + x1) + x2) + ...), its own values
//      read from `data`, the others from its local receive slots, and writes it into `data`.
// Every rank adds the same values in the same order: the sums are bitwise equal across ranks.
//
// Why it is safe without a closing barrier: the grid is fixed (kPeerBlocks blocks in every
// call), receive slots alternate by the epoch's parity, and a rank's calls run in stream order.
// When rank r's block b passes the barrier of call k + 1, every peer's block b has started
// call k + 1, so every peer's call k kernel has finished: nobody still reads the slots call
// k + 2 (same parity as k) writes. Each block keeps its epoch in this rank's memory (written
// at its end, read by the next call's same block). Requirements: the ranks make the same
// calls in the same order with the same counts, and each rank issues them on one stream (or
// orders them); an element count fits the slot (PeerAllReduceView::slot_bytes).
//
// A rank whose peer never arrives spins until `abort` (host-mapped memory) becomes non-zero;
// then the call ends with `data` undefined (the group is being torn down).
#ifndef TOKENSELECT_KERNELS_CUDA_PEER_ALL_REDUCE_H_
#define TOKENSELECT_KERNELS_CUDA_PEER_ALL_REDUCE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tokenselect::kernels::cuda {

inline constexpr int kPeerMaxRanks = 8;
inline constexpr int kPeerBlocks = 128;  // the fixed grid of every call
inline constexpr int kPeerThreads = 512;

// Words of a rank's flag array: [kPeerBlocks][kPeerMaxRanks] uint32.
inline constexpr int kPeerFlagWords = kPeerBlocks * kPeerMaxRanks;

// One rank's view of the group. Pointers of other ranks are their device memory, reachable
// through peer access (cudaDeviceEnablePeerAccess).
struct PeerAllReduceView {
  // Rank p's receive area: 2 parities x size source slots x slot_bytes, 16-B aligned; slot
  // (parity, source) starts at recv[p] + (parity * size + source) * slot_bytes (a rank's own
  // slot is not used).
  unsigned char* recv[kPeerMaxRanks] = {};
  uint32_t* flags[kPeerMaxRanks] = {};  // rank p's flag array (kPeerFlagWords, zeroed at start)
  uint32_t* epochs = nullptr;           // this rank's [kPeerBlocks] counters (zeroed at start)
  const volatile int* abort = nullptr;  // host-mapped; non-zero ends every wait (may be null)
  int64_t slot_bytes = 0;               // multiple of 16
  int rank = 0;
  int size = 0;
};

// Loads the kernels on the current device now. With lazy module loading a first launch loads
// them, and a module load may wait for peer GPUs to go idle: a peer spinning in this kernel,
// waiting for the launch that loads, would never be. Call it on every device before the first
// call.
cudaError_t PeerAllReducePrepare();

// Sums `count` values of `data` (this rank's device memory) over the view's ranks, in place.
// `skip` (optional, device memory): when *skip != 0 the call does nothing at all, as if it had
// not been made; it must then be set on every rank alike (a flag every rank computes from the
// same values, as the selection cache's hit). cudaErrorInvalidValue when count * sizeof(T)
// exceeds slot_bytes, count < 0, or the view's rank/size are out of range; otherwise the
// launch's error.
cudaError_t PeerAllReduceSum(float* data, int64_t count, const PeerAllReduceView& view,
                             cudaStream_t stream, const int32_t* skip = nullptr);
cudaError_t PeerAllReduceSum(double* data, int64_t count, const PeerAllReduceView& view,
                             cudaStream_t stream, const int32_t* skip = nullptr);

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_PEER_ALL_REDUCE_H_
