#include "engine/selection/token_list_scores.h"

#include <algorithm>
#include <cmath>

#include "common/logging.h"

namespace tokenselect::engine {

void ScoreTokenList(const float* query, int64_t num_heads, const KeyCacheView& keys,
                    absl::Span<const int32_t> tokens, float scale, std::vector<float>* logits,
                    std::vector<int32_t>* slot_scratch) {
  const int64_t m = static_cast<int64_t>(tokens.size());
  slot_scratch->resize(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    TS_CHECK(tokens[i] >= 0 && tokens[i] < keys.num_tokens, "token {} of {}", tokens[i],
             keys.num_tokens);
    (*slot_scratch)[i] = keys.slots[tokens[i]];
  }
  logits->resize(static_cast<size_t>(num_heads * m));
  if (m == 0) return;
  KeyCacheView view = keys;
  view.slots = slot_scratch->data();
  view.num_tokens = m;
  ScoreCandidates(query, num_heads, view, 0, m, scale, logits->data());
}

double SumOfHeadMaxima(const float* query, int64_t num_heads, const KeyCacheView& keys,
                       absl::Span<const int32_t> tokens, float scale) {
  TS_CHECK(!tokens.empty(), "no tokens to score");
  const int64_t d = keys.head_dim;
  const int64_t group = num_heads / keys.num_kv_heads;
  double total = 0.0;
  for (int64_t h = 0; h < num_heads; ++h) {
    const float* q = query + h * d;
    double best = -INFINITY;
    for (int32_t t : tokens) {
      const float* k =
          keys.k_cache + (static_cast<int64_t>(keys.slots[t]) * keys.num_kv_heads + h / group) * d;
      double dot = 0.0;
      for (int64_t e = 0; e < d; ++e) dot += static_cast<double>(q[e]) * k[e];
      best = std::max(best, static_cast<double>(scale) * dot);
    }
    total += best;
  }
  return total;
}

}  // namespace tokenselect::engine
