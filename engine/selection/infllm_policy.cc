#include "engine/selection/infllm_policy.h"

#include <algorithm>

#include "common/status.h"
#include "engine/selection/chunk_attention.h"
#include "engine/selection/layer_state.h"
#include "engine/selection/token_list_scores.h"
#include "engine/selection/top_k.h"

namespace tokenselect::engine {
namespace {

class InfLlmPolicy final : public SelectionPolicy {
 public:
  explicit InfLlmPolicy(const SelectionOptions& options) : SelectionPolicy(options) {}
  bool scores_keys() const override { return true; }
  bool uses_selection_cache() const override { return false; }
  bool needs_state() const override { return true; }
  bool observes_chunks() const override { return true; }

  absl::Status ObserveChunk(const ChunkObservation& chunk,
                            SelectionLayerState* state) const override {
    RETURN_IF_ERROR(ValidateChunkObservation(chunk));
    std::vector<float> a;
    ChunkAttentionMap(chunk, &a);
    std::vector<float> received;
    ReceivedAttention(a, chunk.num_new, &received);
    state->received.resize(static_cast<size_t>(chunk.first_token));
    state->received.insert(state->received.end(), received.begin(), received.end());
    return absl::OkStatus();
  }

 protected:
  void DoSelect(const SelectionInput& input, SelectionScratch* scratch,
                SelectionResult* out) const override {
    const SelectionOptions& opt = options();
    const int64_t num_tokens = input.keys.num_tokens;
    const int64_t begin = opt.n_init;
    const int64_t end = num_tokens - opt.n_local;
    const int64_t block = opt.baselines.infllm_block_size;
    const int64_t reps = opt.baselines.infllm_representatives;
    const int64_t keep_blocks = opt.k / block;
    const std::vector<float>& received = input.state->received;
    std::vector<int32_t>& picks = scratch->picks;
    picks.clear();
    out->num_candidates_scored = 0;
    const int64_t num_blocks = (end - begin + block - 1) / block;
    if (keep_blocks > 0 && num_blocks > 0) {
      std::vector<float> scores(static_cast<size_t>(num_blocks));
      std::vector<std::pair<float, int32_t>> by_received;
      std::vector<int32_t> rep_tokens;
      for (int64_t b = 0; b < num_blocks; ++b) {
        const int64_t b0 = begin + b * block;
        const int64_t b1 = std::min(end, b0 + block);
        by_received.clear();
        for (int64_t t = b0; t < b1; ++t) {
          const float r = t < static_cast<int64_t>(received.size()) ? received[t] : 0.0f;
          by_received.emplace_back(r, static_cast<int32_t>(t));
        }
        const int64_t r = std::min<int64_t>(reps, b1 - b0);
        std::partial_sort(by_received.begin(), by_received.begin() + r, by_received.end(),
                          [](const auto& l, const auto& x) {
                            return l.first != x.first ? l.first > x.first : l.second < x.second;
                          });
        rep_tokens.clear();
        for (int64_t i = 0; i < r; ++i) rep_tokens.push_back(by_received[i].second);
        scores[b] = static_cast<float>(
            SumOfHeadMaxima(input.query, input.num_heads, input.keys, rep_tokens, opt.scale));
        out->num_candidates_scored += r;
      }
      std::vector<int32_t> winners;
      TopKByScore(scores.data(), num_blocks, keep_blocks, &winners, &scratch->values);
      for (int32_t b : winners) {
        const int64_t b0 = begin + b * block;
        const int64_t b1 = std::min(end, b0 + block);
        for (int64_t t = b0; t < b1; ++t) picks.push_back(static_cast<int32_t>(t));
      }
    }
    AssembleSelection(num_tokens, opt.n_init, opt.n_local, picks, out);
  }
};

}  // namespace

std::unique_ptr<SelectionPolicy> CreateInfLlmPolicy(const SelectionOptions& options) {
  return std::unique_ptr<SelectionPolicy>(new InfLlmPolicy(options));
}

}  // namespace tokenselect::engine
