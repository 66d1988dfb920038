// Per-thread scratch buffers for the CPU kernels. A kernel call needs a few MiB of temporary
// space (rotated queries, softmax state, key/value tiles); allocating it per call costs page
// faults and zeroing on every layer of every step. Instead each thread keeps one growable buffer
// per slot and reuses it: memory held is the largest request seen per (thread, slot), which is
// bounded by the kernels' own bounds (e.g. GatherAttention: about the size of its output plus
// fixed-size tiles, independent of kv_len).
#ifndef TOKENSELECT_KERNELS_CPU_SCRATCH_H_
#define TOKENSELECT_KERNELS_CPU_SCRATCH_H_

#include <cstddef>

namespace tokenselect::kernels::cpu {

// Slots: a caller must not use one slot for two live buffers. Slots used by a thread that
// starts a parallel region stay distinct from those its worker threads use, because the calling
// thread is also worker 0.
enum class ScratchSlot : int {
  kQueries = 0,
  kRowMax,
  kRowSum,
  kAccumulator,
  kKeyTile,
  kValueTile,
  kCos,
  kSin,
  kWorkerCos,
  kWorkerSin,
  kWorkerKeyTile,
  kWorkerValueTile,
  kWorkerScores,
  kCount,
};

// At least `count` floats owned by the calling thread; contents unspecified. Valid until the
// same thread asks for the same slot again.
float* ThreadScratch(ScratchSlot slot, size_t count);

}  // namespace tokenselect::kernels::cpu

#endif  // TOKENSELECT_KERNELS_CPU_SCRATCH_H_
