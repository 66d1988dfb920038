#include "engine/selection/attention_list.h"

#include "absl/strings/str_cat.h"
#include "engine/selection/selection_options.h"

namespace tokenselect::engine {

absl::Status BuildAttentionList(absl::Span<const int32_t> selected,
                                absl::Span<const int32_t> token_slots, int64_t num_cached,
                                int64_t chunk_len, AttentionList* out) {
  if (num_cached < 0 || chunk_len < 0) {
    return absl::InvalidArgumentError(absl::StrCat("attention list: num_cached (", num_cached,
                                                   ") and chunk_len (", chunk_len,
                                                   ") must be >= 0"));
  }
  if (static_cast<int64_t>(token_slots.size()) < num_cached + chunk_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention list: token_slots has ", token_slots.size(),
                     " entries, need num_cached + ", "chunk_len = ", num_cached + chunk_len));
  }
  const int64_t num_selected = static_cast<int64_t>(selected.size());
  const int64_t kv_len = num_selected + chunk_len;
  if (kv_len > kMaxSelectionTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention list: ", kv_len, " entries exceed the int32 range"));
  }
  for (int64_t j = 0; j < num_selected; ++j) {
    const int32_t t = selected[j];
    if (t < 0 || t >= num_cached || (j > 0 && t <= selected[j - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attention list: selected[", j, "] = ", t,
          " breaks the strictly ascending order within [0, num_cached = ", num_cached, ")"));
    }
  }
  out->kv_slots.resize(static_cast<size_t>(kv_len));
  out->kv_positions.resize(static_cast<size_t>(kv_len));
  out->q_positions.resize(static_cast<size_t>(chunk_len));
  out->visible.resize(static_cast<size_t>(chunk_len));
  for (int64_t j = 0; j < num_selected; ++j) out->kv_slots[j] = token_slots[selected[j]];
  for (int64_t i = 0; i < chunk_len; ++i) {
    out->kv_slots[num_selected + i] = token_slots[num_cached + i];
    out->q_positions[i] = static_cast<int32_t>(num_selected + i);
    out->visible[i] = static_cast<int32_t>(num_selected + i + 1);
  }
  for (int64_t j = 0; j < kv_len; ++j) out->kv_positions[j] = static_cast<int32_t>(j);
  return absl::OkStatus();
}

}  // namespace tokenselect::engine
