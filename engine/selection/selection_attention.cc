#include "engine/selection/selection_attention.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status.h"
#include "engine/kvcache/page_pool.h"
#include "engine/kvcache/token_table.h"
#include "engine/model/model_config.h"
#include "engine/selection/attention_list.h"
#include "engine/selection/chunk_attention.h"
#include "engine/selection/selection_query.h"

namespace tokenselect::engine {

absl::StatusOr<std::unique_ptr<SelectionAttention>> SelectionAttention::Create(
    const SelectionOptions& options, int64_t num_layers) {
  if (num_layers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_layers must be >= 1, got ", num_layers));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<SelectionPolicy> policy, CreateSelectionPolicy(options));
  return std::unique_ptr<SelectionAttention>(
      new SelectionAttention(std::move(policy), num_layers));
}

SelectionAttention::SelectionAttention(std::unique_ptr<SelectionPolicy> policy,
                                       int64_t num_layers)
    : policy_(std::move(policy)),
      cache_(num_layers, policy_->options().theta),
      layer_states_(static_cast<size_t>(num_layers)) {}

const SelectionLayerState& SelectionAttention::layer_state(int64_t layer) const {
  TS_CHECK(layer >= 0 && layer < static_cast<int64_t>(layer_states_.size()), "layer {} of {}",
           layer, layer_states_.size());
  return layer_states_[layer];
}

SelectionLayerState* SelectionAttention::mutable_layer_state(int64_t layer) {
  TS_CHECK(layer >= 0 && layer < static_cast<int64_t>(layer_states_.size()), "layer {} of {}",
           layer, layer_states_.size());
  return &layer_states_[layer];
}

absl::Status SelectionAttention::ObserveChunk(const AttentionQuery& query) {
  const ModelConfig& config = *query.config;
  ChunkObservation chunk;
  chunk.layer = query.layer;
  chunk.first_token = query.cache_length;
  chunk.num_new = query.num_new;
  chunk.q = query.q;
  chunk.num_heads = config.num_heads;
  chunk.num_kv_heads = config.num_kv_heads;
  chunk.head_dim = config.head_dim;
  chunk.k_cache = query.k_cache;
  chunk.slots = token_slots_.data() + query.cache_length;
  chunk.num_slots = query.table->pool()->num_slots();
  chunk.positions = query.new_positions;
  chunk.inv_freq = query.inv_freq;
  chunk.scale = 1.0f / std::sqrt(static_cast<float>(config.head_dim));
  return policy_->ObserveChunk(chunk, &layer_states_[query.layer]);
}

absl::Status SelectionAttention::Select(const AttentionQuery& query, AttentionList* list) {
  const ModelConfig& config = *query.config;
  const int64_t n = query.cache_length;
  const int64_t total = n + query.num_new;
  // The table does not change within a step: its slots are listed once, on the first layer.
  if (slots_for_length_ != total || query.layer == 0) {
    token_slots_.resize(total);
    query.table->Slots(0, total, token_slots_.data());
    slots_for_length_ = total;
  }

  if (query.layer < 0 || query.layer >= static_cast<int64_t>(layer_states_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("selection attention: layer ", query.layer,
                                                   " outside [0, ", layer_states_.size(), ")"));
  }
  SelectionLayerState* state = &layer_states_[query.layer];
  const common::Stopwatch watch;
  const bool decode = query.num_new == 1;
  if (!policy_->scores_keys() || BudgetCoversAll(policy_->options(), n)) {
    // Dense, streaming, or a budget that covers the cache: no query is needed.
    SelectionInput input;
    input.num_heads = config.num_heads;
    input.keys.num_tokens = n;
    input.state = state;
    RETURN_IF_ERROR(policy_->Select(input, &result_, &scratch_));
  } else {
    selection_query_.resize(config.num_heads * config.head_dim);
    RETURN_IF_ERROR(BuildSelectionQuery(query.q, query.num_new, config.num_heads,
                                        config.head_dim, policy_->options().n_local,
                                        query.inv_freq, selection_query_.data()));
    SelectionInput input;
    input.query = selection_query_.data();
    input.num_heads = config.num_heads;
    input.keys.k_cache = query.k_cache;
    input.keys.slots = token_slots_.data();
    input.keys.num_tokens = n;
    input.keys.num_slots = query.table->pool()->num_slots();
    input.keys.num_kv_heads = config.num_kv_heads;
    input.keys.head_dim = config.head_dim;
    input.state = state;
    if (decode && policy_->uses_selection_cache()) {
      RETURN_IF_ERROR(cache_.Select(query.layer, *policy_, input, &result_, &scratch_));
    } else {
      RETURN_IF_ERROR(policy_->Select(input, &result_, &scratch_));
    }
  }
  if (policy_->observes_chunks() && query.num_new > 0) RETURN_IF_ERROR(ObserveChunk(query));
  stats_.selection_seconds += watch.ElapsedSeconds();

  RETURN_IF_ERROR(BuildAttentionList(result_.tokens, token_slots_, n, query.num_new, list));
  const int64_t attended = static_cast<int64_t>(list->kv_slots.size());
  ++stats_.layer_steps;
  stats_.attended_tokens += attended;
  stats_.candidates_scored += result_.num_candidates_scored;
  if (result_.full_attention) ++stats_.full_attention_steps;
  if (decode) {
    ++stats_.decode_layer_steps;
    stats_.decode_attended_tokens += attended;
  }
  return absl::OkStatus();
}

}  // namespace tokenselect::engine
