#include "engine/selection/quest_policy.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tokenselect::engine {
namespace {

class QuestPolicy final : public SelectionPolicy {
 public:
  explicit QuestPolicy(const SelectionOptions& options) : SelectionPolicy(options) {}
  bool scores_keys() const override { return true; }
  bool uses_selection_cache() const override { return false; }

 protected:
  void DoSelect(const SelectionInput& input, SelectionScratch* scratch,
                SelectionResult* out) const override {
    const SelectionOptions& opt = options();
    const KeyCacheView& keys = input.keys;
    const int64_t num_tokens = keys.num_tokens;
    const int64_t begin = opt.n_init;
    const int64_t end = num_tokens - opt.n_local;
    const int64_t page = opt.baselines.quest_page_size;
    const int64_t h_kv = keys.num_kv_heads;
    const int64_t d = keys.head_dim;
    const int64_t group = input.num_heads / h_kv;
    std::vector<int32_t>& picks = scratch->picks;
    picks.clear();
    const int64_t num_pages = (end - begin + page - 1) / page;
    out->num_candidates_scored = opt.k > 0 ? num_pages : 0;
    if (opt.k > 0 && num_pages > 0) {
      std::vector<double> scores(static_cast<size_t>(num_pages));
      std::vector<float> lo(static_cast<size_t>(h_kv * d));
      std::vector<float> hi(static_cast<size_t>(h_kv * d));
      for (int64_t p = 0; p < num_pages; ++p) {
        const int64_t p0 = begin + p * page;
        const int64_t p1 = std::min(end, p0 + page);
        std::fill(lo.begin(), lo.end(), INFINITY);
        std::fill(hi.begin(), hi.end(), -INFINITY);
        for (int64_t t = p0; t < p1; ++t) {
          const float* k = keys.k_cache + static_cast<int64_t>(keys.slots[t]) * h_kv * d;
          for (int64_t e = 0; e < h_kv * d; ++e) {
            lo[e] = std::min(lo[e], k[e]);
            hi[e] = std::max(hi[e], k[e]);
          }
        }
        double bound = 0.0;
        for (int64_t h = 0; h < input.num_heads; ++h) {
          const float* q = input.query + h * d;
          const int64_t base = (h / group) * d;
          for (int64_t e = 0; e < d; ++e) {
            bound += std::max(static_cast<double>(q[e]) * lo[base + e],
                              static_cast<double>(q[e]) * hi[base + e]);
          }
        }
        scores[p] = opt.scale * bound;
      }
      std::vector<int64_t> order(static_cast<size_t>(num_pages));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t l, int64_t r) { return scores[l] > scores[r]; });
      std::vector<int64_t> chosen;
      int64_t used = 0;
      for (int64_t p : order) {
        if (used == opt.k) break;
        const int64_t len = std::min(end, begin + (p + 1) * page) - (begin + p * page);
        if (used + len > opt.k) continue;
        used += len;
        chosen.push_back(p);
      }
      std::sort(chosen.begin(), chosen.end());
      for (int64_t p : chosen) {
        for (int64_t t = begin + p * page; t < std::min(end, begin + (p + 1) * page); ++t) {
          picks.push_back(static_cast<int32_t>(t));
        }
      }
    }
    AssembleSelection(num_tokens, opt.n_init, opt.n_local, picks, out);
  }
};

}  // namespace

std::unique_ptr<SelectionPolicy> CreateQuestPolicy(const SelectionOptions& options) {
  return std::unique_ptr<SelectionPolicy>(new QuestPolicy(options));
}

}  // namespace tokenselect::engine
