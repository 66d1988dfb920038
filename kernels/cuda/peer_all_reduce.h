// All-reduce (sum) over the GPUs of one process through peer memory (NVLink), for tensor
// parallelism's small and mid-sized collectives (engine/parallel/peer_all_reduce.h owns the
// buffers; docs/parallel.md says when it is used instead of NCCL).
//
// One kernel per rank and call, on the rank's stream (so it can be captured in a CUDA graph).
// The data is its own flag ("marker" protocol): every word of a rank's receive areas holds the
// empty marker (all bits set) except while a peer's values sit in it. Thread t of block b owns
// the same elements of `data` on every rank and walks them in steps (one 16-byte vector per
// step); at each step it
//   1. writes its next vector of the rank's values into every peer's slot for this rank (volatile
//      stores over NVLink, no round trip; a value whose bits equal the marker, a NaN, is sent as
//      the canonical NaN instead - on every rank alike, own values included),
//   2. polls its own slots of the vector it wrote one step earlier (volatile loads) until no word
//      of it is the marker in any peer's slot, sums the ranks' values in rank order
//      (((x0 + x1) + x2) + ...; 4 ranks in pairs, (x0 + x1) + (x2 + x3), the fixed tree of
//      TP-invariant numerics), writes the sum into `data` and writes the marker back over what
//      it read.
// No fence and no flag: one NVLink crossing, and the sums of one step overlap the stores of the
// next. Every rank adds the same values in the same order: the sums are bitwise equal across
// ranks.
//
// Two areas, each with its own fixed grid and per-block call counters: messages of at most
// small_slot_bytes use the small one (kPeerSmallBlocks x kPeerSmallThreads: the latency of a
// decode step's 16 KiB), the others the large one (kPeerBlocks x kPeerThreads: as many vectors
// in flight as the GPU holds). Slots alternate by the parity of the block's call count. Why
// the reset cannot wipe a peer's next values, and why no closing barrier is needed: a grid is
// fixed, so an element belongs to the same block in every call of its area, and a peer writes
// this element's slot of parity P again only in the call after next, which starts after the
// peer has read this rank's values of the next call, which this rank writes after this call
// (reset included) has finished - a rank's calls run in stream order. Requirements: the ranks
// make the same calls in the same order with the same counts, and each rank issues them on one
// stream (or orders them); an element count fits the slot (PeerAllReduceView::slot_bytes).
// Measured (bench_allreduce_cuda --tp 2, 2 x H200, fifteenth session, docs/parallel.md): 8 MiB
// 27.5 us against 34.6 for the flags-and-fences protocol this replaced (every block pushed its
// whole slice, fenced, raised a flag per peer and waited before summing).
//
// A rank whose peer never arrives spins until `abort` (host-mapped memory) becomes non-zero;
// then the call ends with `data` undefined (the group is being torn down).
#ifndef TOKENSELECT_KERNELS_CUDA_PEER_ALL_REDUCE_H_
#define TOKENSELECT_KERNELS_CUDA_PEER_ALL_REDUCE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tokenselect::kernels::cuda {

inline constexpr int kPeerMaxRanks = 8;
// The fixed grid of the large area's calls (bench_allreduce_cuda at 8 MiB, 128 blocks: 27.4-28.2
// us with 1024 threads, 30.7 with 768, 30.5-31.1 with 512; docs/parallel.md has the sweep).
inline constexpr int kPeerBlocks = 128;
inline constexpr int kPeerThreads = 1024;
// The grid of the small area's calls (at most kPeerBlocks: the counter arrays have that many).
inline constexpr int kPeerSmallBlocks = 32;
inline constexpr int kPeerSmallThreads = 128;

// One rank's view of the group. Pointers of other ranks are their device memory, reachable
// through peer access (cudaDeviceEnablePeerAccess).
struct PeerAllReduceView {
  // Rank p's (large) receive area: 2 parities x size source slots x slot_bytes, 16-B aligned,
  // every word set to the marker (0xff bytes) at start; slot (parity, source) starts at
  // recv[p] + (parity * size + source) * slot_bytes (a rank's own slot is not used).
  unsigned char* recv[kPeerMaxRanks] = {};
  uint32_t* epochs = nullptr;           // this rank's [kPeerBlocks] call counters (zeroed)
  const volatile int* abort = nullptr;  // host-mapped; non-zero ends every wait (may be null)
  int64_t slot_bytes = 0;               // multiple of 16
  // Rank p's small receive area, laid out as recv with small_slot_bytes. null / 0: none.
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
// small area. cudaErrorInvalidValue when count * sizeof(T) exceeds slot_bytes, count < 0, or
// the view's rank/size are out of range; otherwise the launch's error.
cudaError_t PeerAllReduceSum(float* data, int64_t count, const PeerAllReduceView& view,
                             cudaStream_t stream, const int32_t* skip = nullptr);
cudaError_t PeerAllReduceSum(double* data, int64_t count, const PeerAllReduceView& view,
                             cudaStream_t stream, const int32_t* skip = nullptr);

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_PEER_ALL_REDUCE_H_
