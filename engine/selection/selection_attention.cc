#include "engine/selection/selection_attention.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status.h"
#include "engine/kvcache/page_pool.h"
#include "engine/kvcache/token_table.h"
#include "engine/model/model_config.h"
#include "engine/selection/attention_list.h"
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
    : policy_(std::move(policy)), cache_(num_layers, policy_->options().theta) {}

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

  const common::Stopwatch watch;
  const bool decode = query.num_new == 1;
  if (!policy_->scores_keys() || BudgetCoversAll(policy_->options(), n)) {
    // Dense, streaming, or a budget that covers the cache: no query is needed.
    SelectionInput input;
    input.num_heads = config.num_heads;
    input.keys.num_tokens = n;
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
    if (decode) {
      RETURN_IF_ERROR(cache_.Select(query.layer, *policy_, input, &result_, &scratch_));
    } else {
      RETURN_IF_ERROR(policy_->Select(input, &result_, &scratch_));
    }
  }
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
