// infllm: InfLLM (Xiao et al.) in the same engine (docs/DESIGN.md section 4, docs/selection.md).
//
// ObserveChunk (every forward step): the chunk's received attention (chunk_attention.h), the
// attention each token received from the queries of the chunk that wrote it, summed over heads,
// into the layer state.
//
// Select over N cached tokens: the candidates [n_init, N - n_local) are cut into blocks of
// baselines.infllm_block_size tokens from n_init (the last block may be shorter). A block's
// representatives are its baselines.infllm_representatives tokens with the highest received
// attention (ties: lower index); its score is sum_h max_r q_h . K[r, h / g] (per-head best
// representative, summed over heads). The top k / block_size blocks (higher score, then lower
// block) are selected, plus the init and local windows. Budget mapping: InfLLM's 16 blocks of
// 128 = k 2048; its n_local (4096 in the paper) and init tokens are our n_local and n_init, so
// at equal budget every policy attends n_init + k + n_local tokens (k < block size: no block).
#ifndef TOKENSELECT_ENGINE_SELECTION_INFLLM_POLICY_H_
#define TOKENSELECT_ENGINE_SELECTION_INFLLM_POLICY_H_

#include <memory>

#include "engine/selection/selection_policy.h"

namespace tokenselect::engine {

std::unique_ptr<SelectionPolicy> CreateInfLlmPolicy(const SelectionOptions& options);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_INFLLM_POLICY_H_
