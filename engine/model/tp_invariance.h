// TP-invariant numerics (CudaModelOptions::invariant_shards, docs/parallel.md): which shard
// counts S a model of tensor-parallel size T may ask for. One rule for every place that checks
// it (the GPU model, its selection providers, the workers' and `tokenselect generate`'s flags),
// each of which names its own field or flag in the error. Header only: the CPU build's flag
// checks use it too.
#ifndef TOKENSELECT_ENGINE_MODEL_TP_INVARIANCE_H_
#define TOKENSELECT_ENGINE_MODEL_TP_INVARIANCE_H_

#include <cstdint>

namespace tokenselect::engine {

// 0 (off), or S in {1, 2, 4} that T (>= 1) divides: the row-parallel trees have 1, 2 or 4 leaves
// and every rank holds S / T of them.
inline bool ValidInvariantShards(int64_t shards, int64_t tp_size) {
  return shards == 0 ||
         ((shards == 1 || shards == 2 || shards == 4) && tp_size >= 1 && shards % tp_size == 0);
}

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_MODEL_TP_INVARIANCE_H_
