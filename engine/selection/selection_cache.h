// Selection Cache (TokenSelect, decode; docs/DESIGN.md section 4): consecutive decode queries are
// similar, so a layer may reuse its previous top-k instead of scanning every key again.
//
// Per request and layer the cache keeps the last selection query that was scored (flattened
// over heads, [num_heads * head_dim]) and that selection's top-k picks. A lookup compares the
// new query q with it: if cosine(q, cached_q) >= theta the cached picks are reused (a hit),
// otherwise the policy scores the keys and its query and picks replace the entry (a miss). The
// first lookup of a layer is always a miss.
//
// On a hit only the picks are reused: the init window [0, n_init) and the local window
// [N - n_local, N) are rebuilt for the current N, so the local window still moves with every
// new token. Cached picks that now fall inside the local window or at/after N (possible only
// when N shrank, e.g. after a rollback) are dropped and not refilled, so a hit may attend fewer
// than k picked tokens. The entry itself stays as it was stored.
//
// cosine(a, b) = a.b / (|a| |b|) in double, clamped to [-1, 1]; it is 0 when either vector is
// zero. theta = -1 therefore hits on every lookup after the first; theta > 1 never hits.
//
// A "lookup" is a Select call that needs a selection: a policy that uses the cache
// (SelectionPolicy::uses_selection_cache: tokenselect, topk, head_vote, tokenselect_span) and
// n_init + k + n_local < N. Calls for other policies or with the budget covering N just run the
// policy; they neither count nor touch the entry.
//
// Not thread-safe: one request's cache is used by one thread at a time (like its TokenTable).
#ifndef TOKENSELECT_ENGINE_SELECTION_SELECTION_CACHE_H_
#define TOKENSELECT_ENGINE_SELECTION_SELECTION_CACHE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/selection/selection_policy.h"

namespace tokenselect::engine {

struct SelectionCacheCounters {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t lookups() const { return hits + misses; }
};

// cosine(a, b) as defined above. Sizes must match (checked).
double SelectionQueryCosine(absl::Span<const float> a, absl::Span<const float> b);

class SelectionCache {
 public:
  // num_layers >= 0 (checked); theta: see SelectionOptions::theta (validated there).
  SelectionCache(int64_t num_layers, double theta);

  // The selection for `layer` through the cache, as described above. `*hit` (optional) is set to
  // whether cached picks were reused. On a hit out->num_candidates_scored is 0 and no key or
  // slot is read. InvalidArgument when layer is outside [0, num_layers) or the input is invalid
  // (ValidateSelectionInput; slots are checked on misses only); nothing is counted or stored
  // then.
  absl::Status Select(int64_t layer, const SelectionPolicy& policy, const SelectionInput& input,
                      SelectionResult* out, SelectionScratch* scratch = nullptr,
                      bool* hit = nullptr);

  // The two halves of Select, for callers that run the policy themselves.
  // Lookup: counts a hit or a miss for `layer` and, on a hit, copies the cached picks to
  // `picks`. A miss when the layer has no entry or its query has another size.
  bool Lookup(int64_t layer, absl::Span<const float> query, std::vector<int32_t>* picks);
  // Store: replaces the layer's entry (the picks are kept sorted). Counts nothing.
  void Store(int64_t layer, absl::Span<const float> query, absl::Span<const int32_t> picks);

  // Forgets every entry (the next lookup of each layer misses); counters are kept.
  void Clear();

  int64_t num_layers() const { return static_cast<int64_t>(entries_.size()); }
  double theta() const { return theta_; }
  // Counters of one layer (in range, checked) and their sum over layers.
  SelectionCacheCounters layer_counters(int64_t layer) const;
  SelectionCacheCounters total_counters() const;

 private:
  struct Entry {
    bool valid = false;
    std::vector<float> query;
    std::vector<int32_t> picks;
  };

  // Whether the layer's entry is reusable for `query`. Counts nothing.
  bool Matches(int64_t layer, absl::Span<const float> query) const;

  double theta_;
  std::vector<Entry> entries_;
  std::vector<SelectionCacheCounters> counters_;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_SELECTION_CACHE_H_
