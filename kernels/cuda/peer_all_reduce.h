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
//   3. sums the slice over the ranks in rank order (((x0 + x1) + x2) + ...; 4 ranks in pairs,
//      (x0 + x1) + (x2 + x3), the fixed tree of TP-invariant numerics), its own values read
//      from `data`, the others from its local receive slots, and writes it into `data`.
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
// Small messages (count * sizeof(T) <= PeerAllReduceView::small_slot_bytes) take a second
// protocol in which the data is its own flag ("marker" protocol, one NVLink crossing instead of
// three): every word of a rank's small receive area holds the empty marker (all bits set)
// except while a peer's values sit in it. Block b of every rank
//   1. writes its slice of the rank's values into every peer's small slot for this rank
//      (volatile stores; a value whose bits equal the marker, a NaN, is sent as the canonical
//      NaN instead - on every rank alike, own values included),
//   2. for each element, polls its own slot of each peer (volatile loads) until no word of it
//      is the marker, sums in rank order as above and writes `data`,
//   3. writes the marker back over what it read.
// No fence, no flag. Why the reset cannot wipe a peer's next values: the small slots alternate
// by the parity of the block's small-call count, and a peer writes this slot again only in the
// call after next, which starts after the peer has read this rank's values of the next call,
// which this rank writes after this call (reset included) has finished.
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
// The grid of the small-message kernel (at most kPeerBlocks: its counters are per block).
inline constexpr int kPeerSmallBlocks = 32;
inline constexpr int kPeerSmallThreads = 128;

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
  // Rank p's small receive area: 2 parities x size source slots x small_slot_bytes, every
  // word set to the marker (0xff bytes) at start, laid out as recv. null / 0: no small path.
  unsigned char* small[kPeerMaxRanks] = {};
  uint32_t* small_epochs = nullptr;  // this rank's [kPeerBlocks] small-call counters (zeroed)
  int64_t small_slot_bytes = 0;      // multiple of 16
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
// same values, as the selection cache's hit). Messages of at most small_slot_bytes take the
// marker protocol. cudaErrorInvalidValue when count * sizeof(T) exceeds slot_bytes, count < 0, or
// the view's rank/size are out of range; otherwise the launch's error.
cudaError_t PeerAllReduceSum(float* data, int64_t count, const PeerAllReduceView& view,
                             cudaStream_t stream, const int32_t* skip = nullptr);
cudaError_t PeerAllReduceSum(double* data, int64_t count, const PeerAllReduceView& view,
                             cudaStream_t stream, const int32_t* skip = nullptr);

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_PEER_ALL_REDUCE_H_
