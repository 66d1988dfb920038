#include "engine/selection/cascade_policy.h"

#include <algorithm>

#include "engine/selection/layer_state.h"
#include "engine/selection/soft_vote.h"
#include "engine/selection/token_list_scores.h"

namespace tokenselect::engine {
namespace {

class CascadePolicy final : public SelectionPolicy {
 public:
  explicit CascadePolicy(const SelectionOptions& options) : SelectionPolicy(options) {}
  bool scores_keys() const override { return true; }
  bool uses_selection_cache() const override { return false; }
  bool needs_state() const override { return true; }

 protected:
  void DoSelect(const SelectionInput& input, SelectionScratch* scratch,
                SelectionResult* out) const override {
    const SelectionOptions& opt = options();
    const int64_t num_tokens = input.keys.num_tokens;
    CascadeCache& cache = input.state->cascade;
    const std::vector<int64_t> caps =
        CascadeCache::EqualCapacities(opt.k + opt.n_local, opt.baselines.cascade_sub_caches);
    if (cache.capacities() != caps || cache.next_token > num_tokens) {
      cache.Configure(caps);
    }
    cache.next_token = std::max(cache.next_token, opt.n_init);

    // The step's attention over held + new tokens.
    std::vector<int32_t> tokens;
    for (int64_t i = 0; i < cache.num_sub_caches(); ++i) {
      for (const CascadeCache::Entry& e : cache.sub_cache(i)) tokens.push_back(e.token);
    }
    const int64_t held = static_cast<int64_t>(tokens.size());
    for (int64_t t = cache.next_token; t < num_tokens; ++t) {
      tokens.push_back(static_cast<int32_t>(t));
    }
    const int64_t m = static_cast<int64_t>(tokens.size());
    out->num_candidates_scored = m;
    if (m > 0) {
      std::vector<int32_t> slot_scratch;
      ScoreTokenList(input.query, input.num_heads, input.keys, tokens, opt.scale, &scratch->logits,
                     &slot_scratch);
      scratch->votes.resize(static_cast<size_t>(m));
      SoftVote(scratch->logits.data(), input.num_heads, m, scratch->votes.data());
      const float decay = static_cast<float>(opt.baselines.cascade_ema_decay);
      int64_t i = 0;
      for (int64_t s = 0; s < cache.num_sub_caches(); ++s) {
        for (CascadeCache::Entry& e : cache.sub_cache(s)) {
          e.ema = decay * e.ema + (1.0f - decay) * scratch->votes[i++];
        }
      }
      for (int64_t j = held; j < m; ++j) cache.Push(tokens[j], scratch->votes[j]);
    }
    cache.next_token = std::max(cache.next_token, num_tokens);
    cache.Tokens(&scratch->picks);
    AssembleSelection(num_tokens, opt.n_init, 0, scratch->picks, out);
  }
};

}  // namespace

std::unique_ptr<SelectionPolicy> CreateCascadePolicy(const SelectionOptions& options) {
  return std::unique_ptr<SelectionPolicy>(new CascadePolicy(options));
}

}  // namespace tokenselect::engine
