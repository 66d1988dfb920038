#include "engine/selection/span_policy.h"

#include <algorithm>
#include <numeric>

#include "common/status.h"
#include "engine/selection/chunk_attention.h"
#include "engine/selection/layer_state.h"
#include "engine/selection/soft_vote.h"
#include "engine/selection/span_detection.h"
#include "engine/selection/token_list_scores.h"
#include "engine/selection/top_k.h"

namespace tokenselect::engine {
namespace {

class SpanPolicy final : public SelectionPolicy {
 public:
  explicit SpanPolicy(const SelectionOptions& options) : SelectionPolicy(options) {}
  bool scores_keys() const override { return true; }
  bool needs_state() const override { return true; }
  bool observes_chunks() const override { return true; }

  absl::Status ObserveChunk(const ChunkObservation& chunk,
                            SelectionLayerState* state) const override {
    RETURN_IF_ERROR(ValidateChunkObservation(chunk));
    state->TruncateTo(chunk.first_token);
    if (const int64_t missed = chunk.first_token - state->spans.covered_end(); missed > 0) {
      // Tokens the index never saw: one span without index vectors, always a candidate.
      DetectedSpan unindexed;
      unindexed.y = static_cast<int32_t>(missed - 1);
      unindexed.gap = true;
      state->spans.AppendChunk(state->spans.covered_end(), missed, {unindexed});
    }
    const int64_t c = chunk.num_new;
    std::vector<float> a;
    ChunkAttentionMap(chunk, &a);
    std::vector<float> received;
    ReceivedAttention(a, c, &received);
    state->received.resize(static_cast<size_t>(chunk.first_token));
    state->received.insert(state->received.end(), received.begin(), received.end());
    const std::vector<DetectedSpan> spans =
        DetectSpans(a, c, options().span, SpanLambda(options().span, chunk.layer));
    state->spans.AppendChunk(chunk.first_token, c, spans);
    return absl::OkStatus();
  }

 protected:
  void DoSelect(const SelectionInput& input, SelectionScratch* scratch,
                SelectionResult* out) const override {
    const SelectionOptions& opt = options();
    const int64_t num_tokens = input.keys.num_tokens;
    const int64_t begin = opt.n_init;
    const int64_t end = num_tokens - opt.n_local;
    const SpanIndex& index = input.state->spans;
    std::vector<int32_t>& picks = scratch->picks;
    picks.clear();
    out->num_candidates_scored = 0;
    if (opt.k == 0) {
      AssembleSelection(num_tokens, opt.n_init, opt.n_local, picks, out);
      return;
    }
    // 1. Span scores.
    struct Scored {
      double score;
      int32_t begin;
      int32_t end;
    };
    std::vector<Scored> scored;
    int64_t vectors_scored = 0;
    std::vector<char> keep(static_cast<size_t>(end - begin), 0);
    for (const IndexedSpan& s : index.spans()) {
      const int32_t b = static_cast<int32_t>(std::max<int64_t>(s.begin, begin));
      const int32_t e = static_cast<int32_t>(std::min<int64_t>(s.end, end));
      if (b >= e) continue;
      if (s.num_vectors == 0) {  // unindexed tokens are always candidates
        for (int32_t t = b; t < e; ++t) keep[t - begin] = 1;
        continue;
      }
      absl::Span<const int32_t> v = index.vectors(s);
      if (v.back() >= num_tokens) continue;  // stale (index ahead of the cache)
      scored.push_back(
          {SumOfHeadMaxima(input.query, input.num_heads, input.keys, v, opt.scale), b, e});
      vectors_scored += s.num_vectors;
    }
    std::stable_sort(scored.begin(), scored.end(), [](const Scored& l, const Scored& r) {
      return l.score != r.score ? l.score > r.score : l.begin < r.begin;
    });
    // 2. Best spans within the token budget, plus the uncovered candidates.
    const int64_t budget = SpanTokenBudget(opt);
    int64_t used = 0;
    for (const Scored& s : scored) {
      const int64_t len = s.end - s.begin;
      if (used + len > budget) continue;
      used += len;
      for (int32_t t = s.begin; t < s.end; ++t) keep[t - begin] = 1;
    }
    for (int64_t t = std::max<int64_t>(index.covered_end(), begin); t < end; ++t) {
      keep[t - begin] = 1;
    }
    std::vector<int32_t> kept;
    for (int64_t i = 0; i < end - begin; ++i) {
      if (keep[i]) kept.push_back(static_cast<int32_t>(begin + i));
    }
    // 3. Exact soft vote over the kept tokens.
    const int64_t m = static_cast<int64_t>(kept.size());
    if (m <= opt.k) {
      picks = kept;
    } else {
      std::vector<int32_t> slot_scratch;
      ScoreTokenList(input.query, input.num_heads, input.keys, kept, opt.scale, &scratch->logits,
                     &slot_scratch);
      scratch->votes.resize(static_cast<size_t>(m));
      SoftVote(scratch->logits.data(), input.num_heads, m, scratch->votes.data());
      std::vector<int32_t> winners;
      TopKByScore(scratch->votes.data(), m, opt.k, &winners, &scratch->values);
      for (int32_t w : winners) picks.push_back(kept[w]);
      out->num_candidates_scored = m;
    }
    out->num_candidates_scored += vectors_scored;
    AssembleSelection(num_tokens, opt.n_init, opt.n_local, picks, out);
  }
};

}  // namespace

std::unique_ptr<SelectionPolicy> CreateSpanPolicy(const SelectionOptions& options) {
  return std::unique_ptr<SelectionPolicy>(new SpanPolicy(options));
}

}  // namespace tokenselect::engine
