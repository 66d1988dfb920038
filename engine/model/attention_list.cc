#include "engine/model/attention_list.h"

namespace tokenselect::engine {

absl::Status DenseAttentionList::Select(const AttentionQuery& query, AttentionList* list) {
  const int64_t total = query.cache_length + query.num_new;
  // Layers after the first see the same tokens: keep the list built for layer 0 of this step
  // (the model hands the same list to every layer and does not modify it).
  const bool same_step = query.layer > 0 && static_cast<int64_t>(list->kv_slots.size()) == total &&
                         static_cast<int64_t>(list->visible.size()) == query.num_new;
  if (same_step) return absl::OkStatus();
  list->kv_slots.resize(total);
  query.table->Slots(0, total, list->kv_slots.data());
  list->kv_positions.resize(total);
  for (int64_t j = 0; j < total; ++j) list->kv_positions[j] = static_cast<int32_t>(j);
  list->q_positions.assign(query.new_positions, query.new_positions + query.num_new);
  list->visible.resize(query.num_new);
  for (int64_t i = 0; i < query.num_new; ++i) {
    list->visible[i] = static_cast<int32_t>(query.cache_length + i + 1);
  }
  return absl::OkStatus();
}

}  // namespace tokenselect::engine
