#include "engine/selection/selection_cache.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace tokenselect::engine {

double SelectionQueryCosine(absl::Span<const float> a, absl::Span<const float> b) {
  TS_CHECK(a.size() == b.size(), "cosine of sizes {} and {}", a.size(), b.size());
  double dot = 0.0;
  double norm_a = 0.0;
  double norm_b = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += static_cast<double>(a[i]) * b[i];
    norm_a += static_cast<double>(a[i]) * a[i];
    norm_b += static_cast<double>(b[i]) * b[i];
  }
  if (norm_a == 0.0 || norm_b == 0.0) return 0.0;
  const double cosine = dot / (std::sqrt(norm_a) * std::sqrt(norm_b));
  return std::clamp(cosine, -1.0, 1.0);
}

SelectionCache::SelectionCache(int64_t num_layers, double theta)
    : theta_(theta),
      entries_(static_cast<size_t>(std::max<int64_t>(num_layers, 0))),
      counters_(entries_.size()) {
  TS_CHECK(num_layers >= 0, "SelectionCache with {} layers", num_layers);
}

bool SelectionCache::Matches(int64_t layer, absl::Span<const float> query) const {
  const Entry& entry = entries_[layer];
  // NaN compares false, so a NaN cosine (NaN in a query) misses.
  return entry.valid && entry.query.size() == query.size() &&
         SelectionQueryCosine(query, entry.query) >= theta_;
}

bool SelectionCache::Lookup(int64_t layer, absl::Span<const float> query,
                            std::vector<int32_t>* picks) {
  TS_CHECK(layer >= 0 && layer < num_layers(), "layer {} of {}", layer, num_layers());
  const bool hit = Matches(layer, query);
  if (hit) {
    ++counters_[layer].hits;
    picks->assign(entries_[layer].picks.begin(), entries_[layer].picks.end());
  } else {
    ++counters_[layer].misses;
  }
  return hit;
}

void SelectionCache::Store(int64_t layer, absl::Span<const float> query,
                           absl::Span<const int32_t> picks) {
  TS_CHECK(layer >= 0 && layer < num_layers(), "layer {} of {}", layer, num_layers());
  Entry& entry = entries_[layer];
  entry.valid = true;
  entry.query.assign(query.begin(), query.end());
  entry.picks.assign(picks.begin(), picks.end());
  std::sort(entry.picks.begin(), entry.picks.end());
}

absl::Status SelectionCache::Select(int64_t layer, const SelectionPolicy& policy,
                                    const SelectionInput& input, SelectionResult* out,
                                    SelectionScratch* scratch, bool* hit) {
  if (hit != nullptr) *hit = false;
  if (layer < 0 || layer >= num_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("selection cache: layer ", layer, " outside [0, ", num_layers(), ")"));
  }
  const SelectionOptions& opt = policy.options();
  if (!policy.uses_selection_cache() || input.keys.num_tokens < 0 ||
      BudgetCoversAll(opt, input.keys.num_tokens)) {
    return policy.Select(input, out, scratch);  // not a lookup
  }
  RETURN_IF_ERROR(ValidateSelectionInput(input, /*check_slots=*/false));
  const absl::Span<const float> query(input.query,
                                      static_cast<size_t>(input.num_heads * input.keys.head_dim));
  if (Matches(layer, query)) {
    ++counters_[layer].hits;
    AssembleSelection(input.keys.num_tokens, opt.n_init, opt.n_local, entries_[layer].picks, out);
    out->num_candidates_scored = 0;
    if (hit != nullptr) *hit = true;
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(policy.Select(input, out, scratch));
  ++counters_[layer].misses;
  Store(layer, query, out->picks);
  return absl::OkStatus();
}

void SelectionCache::Clear() {
  for (Entry& entry : entries_) entry = Entry();
}

SelectionCacheCounters SelectionCache::layer_counters(int64_t layer) const {
  TS_CHECK(layer >= 0 && layer < num_layers(), "layer {} of {}", layer, num_layers());
  return counters_[layer];
}

SelectionCacheCounters SelectionCache::total_counters() const {
  SelectionCacheCounters total;
  for (const SelectionCacheCounters& c : counters_) {
    total.hits += c.hits;
    total.misses += c.misses;
  }
  return total;
}

}  // namespace tokenselect::engine
