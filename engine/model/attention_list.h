// The hook through which a selection policy chooses, per layer, which cached tokens the new
// tokens attend to. The forward pass (model.h) writes the new tokens' K/V into the cache, asks
// the request's AttentionListProvider for the list, and runs kernels::cpu::GatherAttention over
// it. The list is the kernel's index form (kernels/ops.h GatherAttentionParams):
//   kv_slots[j]      cache slot of the j-th attended token, in attention order
//   kv_positions[j]  the RoPE position that token gets (its true position for dense attention;
//                    j itself for TokenSelect's compact positions, docs/DESIGN.md section 4)
//   q_positions[i]   the RoPE position of new token i
//   visible[i]       new token i attends to entries [0, visible[i]) of the list (causal masks
//                    are prefixes: selected tokens first, then the current chunk)
// DenseAttentionList is full attention; TokenSelect and the baselines implement the same
// interface in engine/selection/.
#ifndef TOKENSELECT_ENGINE_MODEL_ATTENTION_LIST_H_
#define TOKENSELECT_ENGINE_MODEL_ATTENTION_LIST_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/kvcache/token_table.h"
#include "engine/model/model_config.h"

namespace tokenselect::engine {

// What a provider sees for one layer of one forward step.
struct AttentionQuery {
  int64_t layer = 0;
  // Tokens cached before this step; the new tokens follow at cache_length + i, and their K/V
  // are already written (the table's length is cache_length + num_new).
  int64_t cache_length = 0;
  int64_t num_new = 0;
  const int32_t* new_positions = nullptr;  // [num_new]: cache_length + i
  const float* q = nullptr;                // [num_new, num_heads, head_dim], un-rotated
  const float* k_cache = nullptr;          // this layer's [num_slots, num_kv_heads, head_dim]
  const float* v_cache = nullptr;          // this layer's [num_slots, num_kv_heads, head_dim]
  const TokenTable* table = nullptr;       // slot of every token of the request
  const ModelConfig* config = nullptr;
  const float* inv_freq = nullptr;  // [head_dim / 2], for policies that rotate queries
};

// The GatherAttention index lists. The vectors are reused from step to step (resize keeps their
// capacity), so providers should resize rather than rebuild them.
struct AttentionList {
  std::vector<int32_t> kv_slots;
  std::vector<int32_t> kv_positions;
  std::vector<int32_t> q_positions;
  std::vector<int32_t> visible;
};

// One per request (a provider may keep per-request state such as a selection cache). Called
// for layers 0, 1, ... in order on each step, from one thread at a time.
class AttentionListProvider {
 public:
  virtual ~AttentionListProvider() = default;
  // Fills `list` for `query`. The model checks the result (sizes; slots within the pool;
  // visible[i] <= kv_len) and fails the step with Internal if it is malformed; a provider's own
  // error aborts the step and is returned as is.
  virtual absl::Status Select(const AttentionQuery& query, AttentionList* list) = 0;
};

// Full causal attention: every cached token in order at its true position, and the new tokens
// causally (new token i sees the cache and new tokens 0..i). The list is the same for every
// layer of a step, so it is built on layer 0 and kept for the others.
class DenseAttentionList : public AttentionListProvider {
 public:
  absl::Status Select(const AttentionQuery& query, AttentionList* list) override;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_MODEL_ATTENTION_LIST_H_
