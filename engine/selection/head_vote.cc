#include "engine/selection/head_vote.h"

#include "common/logging.h"
#include "engine/selection/soft_vote.h"
#include "engine/selection/top_k.h"

namespace tokenselect::engine {

void HeadVote(const float* logits, int64_t num_heads, int64_t n, int64_t k,
              std::vector<int32_t>* out, HeadVoteScratch* scratch) {
  TS_CHECK(n >= 0 && k >= 0 && num_heads >= 1, "HeadVote(num_heads={}, n={}, k={})", num_heads, n,
           k);
  HeadVoteScratch local;
  HeadVoteScratch& s = scratch != nullptr ? *scratch : local;
  out->clear();
  if (k == 0 || n == 0) return;
  s.counts.assign(static_cast<size_t>(n), 0.0f);
  for (int64_t h = 0; h < num_heads; ++h) {
    TopKByScore(logits + h * n, n, k, &s.head_picks, &s.values);
    for (int32_t j : s.head_picks) s.counts[j] += 1.0f;
  }
  // Only voted-for candidates can win (at least min(k, n) of them have a vote).
  s.voted.clear();
  for (int64_t j = 0; j < n; ++j) {
    if (s.counts[j] > 0.0f) s.voted.push_back(static_cast<int32_t>(j));
  }
  s.summed.resize(static_cast<size_t>(n));
  SumOverHeads(logits, num_heads, n, s.summed.data());
  TopKByTwoScores(s.voted, s.counts.data(), s.summed.data(), k, out, &s.values);
}

}  // namespace tokenselect::engine
