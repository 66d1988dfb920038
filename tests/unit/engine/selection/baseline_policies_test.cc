// The span policy and the InfLLM, Quest and Cascade baselines against brute-force references
// (plain loops in double, full sorts), and the Cascade cache's context length.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "engine/selection/cascade_cache.h"
#include "engine/selection/layer_state.h"
#include "engine/selection/selection_policy.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/selection/selection_reference.h"

namespace tokenselect::engine {
namespace {

using reference::Problem;

SelectionInput Input(const Problem& p, SelectionLayerState* state) {
  SelectionInput in;
  in.query = p.query.data();
  in.num_heads = p.num_heads;
  in.keys.k_cache = p.k_cache.data();
  in.keys.slots = p.slots.data();
  in.keys.num_tokens = p.num_tokens;
  in.keys.num_slots = p.num_slots;
  in.keys.num_kv_heads = p.num_kv_heads;
  in.keys.head_dim = p.head_dim;
  in.state = state;
  return in;
}

double Dot(const Problem& p, int64_t h, int32_t token) {
  const int64_t kv = h / (p.num_heads / p.num_kv_heads);
  double dot = 0;
  for (int64_t e = 0; e < p.head_dim; ++e) {
    dot += static_cast<double>(p.query[h * p.head_dim + e]) *
           p.k_cache[(p.slots[token] * p.num_kv_heads + kv) * p.head_dim + e];
  }
  return dot;
}

double HeadMaxSum(const Problem& p, const std::vector<int32_t>& tokens) {
  double total = 0;
  for (int64_t h = 0; h < p.num_heads; ++h) {
    double best = -INFINITY;
    for (int32_t t : tokens) best = std::max(best, Dot(p, h, t));
    total += best;
  }
  return total;
}

// Soft votes over an arbitrary token list, in double.
std::vector<double> ListVotes(const Problem& p, const std::vector<int32_t>& tokens) {
  std::vector<std::vector<double>> s(p.num_heads, std::vector<double>(tokens.size()));
  for (int64_t h = 0; h < p.num_heads; ++h) {
    for (size_t i = 0; i < tokens.size(); ++i) s[h][i] = Dot(p, h, tokens[i]);
  }
  return reference::SoftVotes(s);
}

std::unique_ptr<SelectionPolicy> Make(SelectionOptions o) {
  auto p = CreateSelectionPolicy(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return std::move(*p);
}

// Ranks [0, n) by (score desc, index asc).
std::vector<int64_t> Rank(const std::vector<double>& score) {
  std::vector<int64_t> order(score.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return score[a] != score[b] ? score[a] > score[b] : a < b;
  });
  return order;
}

TEST(BaselineOptionsTest, InvalidValuesNameTheField) {
  const std::vector<std::pair<void (*)(SelectionOptions*), const char*>> cases = {
      {[](SelectionOptions* o) { o->span.threshold_percentile = 101; },
       "span.threshold_percentile"},
      {[](SelectionOptions* o) { o->span.nms_iou = -0.1; }, "span.nms_iou"},
      {[](SelectionOptions* o) { o->span.min_vectors = 9; }, "span.min_vectors"},
      {[](SelectionOptions* o) { o->span.lambda = NAN; }, "span.lambda"},
      {[](SelectionOptions* o) { o->span.token_budget = -1; }, "span.token_budget"},
      {[](SelectionOptions* o) { o->baselines.infllm_block_size = 0; }, "infllm_block_size"},
      {[](SelectionOptions* o) { o->baselines.quest_page_size = 0; }, "quest_page_size"},
      {[](SelectionOptions* o) { o->baselines.cascade_sub_caches = 31; }, "cascade_sub_caches"},
      {[](SelectionOptions* o) { o->baselines.cascade_ema_decay = 1; }, "cascade_ema_decay"}};
  for (const auto& [mutate, field] : cases) {
    SelectionOptions o;
    mutate(&o);
    const absl::Status s = ValidateSelectionOptions(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(s.message().find(field), absl::string_view::npos) << s;
  }
  SelectionOptions o;
  EXPECT_EQ(SpanTokenBudget(o), 4 * o.k);
  o.span.token_budget = 100;
  EXPECT_EQ(SpanTokenBudget(o), 100);
}

TEST(QuestPolicyTest, MatchesBruteForce) {
  uint32_t seed = 1;
  for (int64_t n : {200, 333, 1000}) {
    for (int64_t page : {16, 7}) {
      const Problem p = reference::MakeProblem(8, 2, 16, n, seed++, true);
      SelectionOptions o;
      o.policy = SelectionPolicyKind::kQuest;
      o.n_init = 5, o.k = 50, o.n_local = 9;
      o.baselines.quest_page_size = page;
      SelectionResult r;
      ASSERT_TRUE(Make(o)->Select(Input(p, nullptr), &r).ok());
      const int64_t begin = o.n_init, end = n - o.n_local;
      const int64_t pages = (end - begin + page - 1) / page;
      std::vector<double> bound(pages, 0.0);
      for (int64_t g = 0; g < pages; ++g) {
        const int64_t p0 = begin + g * page, p1 = std::min(end, p0 + page);
        for (int64_t h = 0; h < p.num_heads; ++h) {
          const int64_t kv = h / (p.num_heads / p.num_kv_heads);
          for (int64_t e = 0; e < p.head_dim; ++e) {
            double lo = INFINITY, hi = -INFINITY;
            for (int64_t t = p0; t < p1; ++t) {
              const double x = p.k_cache[(p.slots[t] * p.num_kv_heads + kv) * p.head_dim + e];
              lo = std::min(lo, x), hi = std::max(hi, x);
            }
            const double q = p.query[h * p.head_dim + e];
            bound[g] += std::max(q * lo, q * hi);
          }
        }
      }
      std::vector<int32_t> picks;
      int64_t used = 0;
      for (int64_t g : Rank(bound)) {
        const int64_t p0 = begin + g * page, p1 = std::min(end, p0 + page);
        if (used + (p1 - p0) > o.k) continue;
        used += p1 - p0;
        for (int64_t t = p0; t < p1; ++t) picks.push_back(static_cast<int32_t>(t));
      }
      EXPECT_EQ(r.tokens, reference::Assemble(n, o.n_init, o.n_local, picks)) << n << " " << page;
      EXPECT_LE(static_cast<int64_t>(r.tokens.size()), o.n_init + o.k + o.n_local);
    }
  }
}

TEST(InfLlmPolicyTest, MatchesBruteForce) {
  uint32_t seed = 10;
  for (int64_t n : {300, 777}) {
    for (int64_t block : {16, 10}) {
      const Problem p = reference::MakeProblem(8, 4, 16, n, seed++, true);
      SelectionLayerState state;
      std::mt19937 rng(seed);
      std::uniform_int_distribution<int> r(0, 20);  // ties in received attention
      state.received.resize(n);
      for (float& x : state.received) x = static_cast<float>(r(rng));
      SelectionOptions o;
      o.policy = SelectionPolicyKind::kInfLlm;
      o.n_init = 4, o.k = 64, o.n_local = 12;
      o.baselines.infllm_block_size = block;
      o.baselines.infllm_representatives = 3;
      SelectionResult res;
      ASSERT_TRUE(Make(o)->Select(Input(p, &state), &res).ok());
      const int64_t begin = o.n_init, end = n - o.n_local;
      const int64_t blocks = (end - begin + block - 1) / block;
      std::vector<double> score(blocks);
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t b0 = begin + b * block, b1 = std::min(end, b0 + block);
        std::vector<double> rec;
        for (int64_t t = b0; t < b1; ++t) rec.push_back(state.received[t]);
        std::vector<int32_t> reps;
        for (int64_t i : Rank(rec)) {
          if (static_cast<int64_t>(reps.size()) == 3) break;
          reps.push_back(static_cast<int32_t>(b0 + i));
        }
        score[b] = static_cast<float>(HeadMaxSum(p, reps));
      }
      std::vector<int32_t> picks;
      const std::vector<int64_t> ranked = Rank(score);
      for (int64_t i = 0; i < o.k / block && i < blocks; ++i) {
        const int64_t b0 = begin + ranked[i] * block, b1 = std::min(end, b0 + block);
        for (int64_t t = b0; t < b1; ++t) picks.push_back(static_cast<int32_t>(t));
      }
      std::sort(picks.begin(), picks.end());
      EXPECT_EQ(res.tokens, reference::Assemble(n, o.n_init, o.n_local, picks)) << n;
    }
  }
}

TEST(InfLlmPolicyTest, NeedsState) {
  const Problem p = reference::MakeProblem(4, 2, 8, 500, 3, false);
  SelectionOptions o;
  o.policy = SelectionPolicyKind::kInfLlm;
  o.n_init = 4, o.k = 128, o.n_local = 8;
  SelectionResult r;
  EXPECT_EQ(Make(o)->Select(Input(p, nullptr), &r).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SpanPolicyTest, MatchesBruteForce) {
  const int64_t n = 600;
  const Problem p = reference::MakeProblem(8, 2, 16, n, 21, true);
  // An index over [0, 560): spans of 1..40 tokens with 1..3 index tokens; [560, 600) uncovered.
  SelectionLayerState state;
  std::mt19937 rng(4);
  std::vector<std::pair<int, int>> spans;
  std::vector<std::vector<int32_t>> vecs;
  std::vector<DetectedSpan> detected;
  for (int x = 0; x < 560;) {
    const int len = std::min<int>(560 - x, 1 + static_cast<int>(rng() % 40));
    DetectedSpan d;
    d.x = x, d.y = x + len - 1;
    for (int v = 0; v < 1 + static_cast<int>(rng() % 3) && v < len; ++v) {
      d.index_tokens.push_back(x + v * (len / 3 + 1) % len);
    }
    std::sort(d.index_tokens.begin(), d.index_tokens.end());
    d.index_tokens.erase(std::unique(d.index_tokens.begin(), d.index_tokens.end()),
                         d.index_tokens.end());
    spans.emplace_back(x, x + len);
    vecs.push_back(d.index_tokens);
    detected.push_back(d);
    x += len;
  }
  state.spans.AppendChunk(0, 560, detected);
  for (int64_t k : {40, 100}) {
    for (int64_t budget : {0, 250}) {
      SelectionOptions o;
      o.policy = SelectionPolicyKind::kTokenSelectSpan;
      o.n_init = 8, o.k = k, o.n_local = 16;
      o.span.token_budget = budget;
      SelectionResult r;
      ASSERT_TRUE(Make(o)->Select(Input(p, &state), &r).ok());
      const int64_t begin = o.n_init, end = n - o.n_local;
      const int64_t limit = budget == 0 ? 4 * k : budget;
      std::vector<double> score;
      std::vector<std::pair<int, int>> clipped;
      for (size_t i = 0; i < spans.size(); ++i) {
        const int b = std::max<int>(spans[i].first, begin), e = std::min<int>(spans[i].second, end);
        if (b >= e) continue;
        clipped.emplace_back(b, e);
        score.push_back(HeadMaxSum(p, vecs[i]));
      }
      std::vector<bool> keep(n, false);
      int64_t used = 0;
      for (int64_t i : Rank(score)) {  // equal scores: lower begin first, as spans are in order
        const int len = clipped[i].second - clipped[i].first;
        if (used + len > limit) continue;
        used += len;
        for (int t = clipped[i].first; t < clipped[i].second; ++t) keep[t] = true;
      }
      for (int64_t t = 560; t < end; ++t) keep[t] = true;
      std::vector<int32_t> kept;
      for (int64_t t = begin; t < end; ++t) {
        if (keep[t]) kept.push_back(static_cast<int32_t>(t));
      }
      std::vector<int32_t> picks;
      if (static_cast<int64_t>(kept.size()) <= k) {
        picks = kept;
      } else {
        for (int32_t i : reference::RankedTopK(ListVotes(p, kept), k)) picks.push_back(kept[i]);
        std::sort(picks.begin(), picks.end());
      }
      EXPECT_EQ(r.tokens, reference::Assemble(n, o.n_init, o.n_local, picks)) << k << " " << budget;
      EXPECT_GT(r.num_candidates_scored, 0);
    }
  }
}

TEST(CascadeCacheTest, BoundaryKeepsTheHigherEmaAndAFullSubCacheAcceptsEverySecondOffer) {
  CascadeCache cache;
  cache.Configure({1, 1});
  cache.Push(0, 1.0f);
  cache.Push(1, 5.0f);  // 0 evicted to sub-cache 1, which has a free slot: accepted
  EXPECT_EQ(cache.sub_cache(1).front().token, 0);
  cache.Push(2, 0.0f);  // 1 evicted, 1st offer while full: not accepted; 5 > 1 replaces 0
  EXPECT_EQ(cache.sub_cache(1).front().token, 1);
  cache.Push(3, 0.0f);  // 2 evicted, 2nd offer while full: accepted; 1 leaves the cache
  EXPECT_EQ(cache.sub_cache(1).front().token, 2);
  cache.Push(4, 0.0f);  // 3 evicted, 3rd offer: not accepted; 0 > 0 is false: 2 stays
  EXPECT_EQ(cache.sub_cache(1).front().token, 2);
  EXPECT_EQ(cache.size(), 2);
}

TEST(CascadeCacheTest, ContextLengthIsSizeOverNTimesSumOfPowersOfTwo) {
  // |C| = 2048, N = 4: (2048 / 4) * (1 + 2 + 4 + 8) = 7680.
  for (bool random_ema : {false, true}) {
    CascadeCache cache;
    cache.Configure(CascadeCache::EqualCapacities(2048, 4));
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(0, 1);
    const int32_t total = 30000;
    for (int32_t t = 0; t < total; ++t) cache.Push(t, random_ema ? u(rng) : 1.0f);
    std::vector<int32_t> tokens;
    cache.Tokens(&tokens);
    EXPECT_EQ(tokens.size(), 2048u);
    const int64_t span = total - tokens.front();
    if (random_ema) {
      EXPECT_NEAR(span, 7680, 7680 * 0.02);
    } else {
      EXPECT_NEAR(span, 7680, 8);
    }
  }
}

// Reference cascade: the rules of cascade_cache.h and cascade_policy.h in double.
struct RefCascade {
  std::vector<int64_t> caps;
  std::vector<std::vector<std::pair<int32_t, double>>> levels;
  std::vector<int64_t> offers;
  int64_t next = 0;

  void Offer(size_t l, std::pair<int32_t, double> e) {
    if (l == levels.size()) return;
    auto& lv = levels[l];
    if (l > 0 && static_cast<int64_t>(lv.size()) >= caps[l] && offers[l]++ % 2 == 0 &&
        !lv.empty()) {
      if (e.second > lv.back().second) lv.back() = e;
      return;
    }
    lv.push_back(e);
    if (static_cast<int64_t>(lv.size()) > caps[l]) {
      const auto out = lv.front();
      lv.erase(lv.begin());
      Offer(l + 1, out);
    }
  }
  std::vector<int32_t> Step(const Problem& p, int64_t n, double decay) {
    std::vector<int32_t> tokens;
    for (auto& lv : levels) {
      for (auto& e : lv) tokens.push_back(e.first);
    }
    const size_t held = tokens.size();
    for (int64_t t = next; t < n; ++t) tokens.push_back(static_cast<int32_t>(t));
    const std::vector<double> votes = ListVotes(p, tokens);
    size_t i = 0;
    for (auto& lv : levels) {
      for (auto& e : lv) e.second = decay * e.second + (1 - decay) * votes[i++];
    }
    for (size_t j = held; j < tokens.size(); ++j) Offer(0, {tokens[j], votes[j]});
    next = n;
    std::vector<int32_t> out;
    for (auto& lv : levels) {
      for (auto& e : lv) out.push_back(e.first);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
};

TEST(CascadePolicyTest, MatchesBruteForceStepByStep) {
  const Problem p = reference::MakeProblem(4, 2, 8, 700, 31, true);
  SelectionOptions o;
  o.policy = SelectionPolicyKind::kCascade;
  o.n_init = 4, o.k = 40, o.n_local = 8;
  o.baselines.cascade_sub_caches = 3;
  auto policy = Make(o);
  SelectionLayerState state;
  RefCascade ref;
  ref.caps = {16, 16, 16};
  ref.levels.resize(3);
  ref.offers.assign(3, 0);
  ref.next = o.n_init;
  // A prefill in chunks of 37, then decode steps; each step sees a different query.
  Problem q = p;
  int64_t n = 0;
  std::mt19937 rng(2);
  while (n < 700) {
    n = n < 400 ? std::min<int64_t>(n + 37, 700) : n + 1;
    for (float& x : q.query) x = static_cast<float>(static_cast<int>(rng() % 5) - 2);
    Problem view = q;
    view.num_tokens = n;
    SelectionResult r;
    ASSERT_TRUE(policy->Select(Input(view, &state), &r).ok());
    if (n <= o.n_init + o.k + o.n_local) {
      EXPECT_TRUE(r.full_attention);
      continue;
    }
    std::vector<int32_t> picks = ref.Step(view, n, 0.9);
    ASSERT_EQ(r.tokens, reference::Assemble(n, o.n_init, 0, picks)) << "n = " << n;
    EXPECT_EQ(static_cast<int64_t>(r.tokens.size()), o.n_init + o.k + o.n_local);
  }
}

}  // namespace
}  // namespace tokenselect::engine
