// Brute-force references for the selection tests, written independently of the library: plain
// loops in double, full sorts, no shared helpers. Test-only.
#ifndef TOKENSELECT_TESTS_UNIT_ENGINE_SELECTION_SELECTION_REFERENCE_H_
#define TOKENSELECT_TESTS_UNIT_ENGINE_SELECTION_SELECTION_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace tokenselect::engine::reference {

// A request's keys in a scattered cache plus one selection query.
struct Problem {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t num_tokens = 0;
  int64_t num_slots = 0;
  std::vector<float> query;    // [num_heads, head_dim]
  std::vector<float> k_cache;  // [num_slots, num_kv_heads, head_dim]
  std::vector<int32_t> slots;  // [num_tokens], distinct, shuffled
};

// Random problem. integer_values: entries in {-2, ..., 2}, so every dot product and every sum of
// them is exact in float (exact ties, exact comparisons); otherwise standard normal.
inline Problem MakeProblem(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                           int64_t num_tokens, uint32_t seed, bool integer_values) {
  Problem p;
  p.num_heads = num_heads;
  p.num_kv_heads = num_kv_heads;
  p.head_dim = head_dim;
  p.num_tokens = num_tokens;
  p.num_slots = num_tokens + 13;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(-2, 2);
  auto draw = [&]() { return integer_values ? static_cast<float>(small(rng)) : normal(rng); };
  p.query.resize(num_heads * head_dim);
  for (float& x : p.query) x = draw();
  p.k_cache.resize(p.num_slots * num_kv_heads * head_dim);
  for (float& x : p.k_cache) x = draw();
  std::vector<int32_t> all(p.num_slots);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  p.slots.assign(all.begin(), all.begin() + num_tokens);
  return p;
}

// s[h][j - begin] = scale * q_h . K[slot(j), h / (H / H_kv)] in double, tokens j in [begin, end).
inline std::vector<std::vector<double>> Logits(const Problem& p, double scale, int64_t begin,
                                               int64_t end) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  std::vector<std::vector<double>> s(p.num_heads, std::vector<double>(end - begin));
  for (int64_t h = 0; h < p.num_heads; ++h) {
    const int64_t kv = h / group;
    for (int64_t j = begin; j < end; ++j) {
      const float* key = &p.k_cache[(p.slots[j] * p.num_kv_heads + kv) * p.head_dim];
      double dot = 0.0;
      for (int64_t e = 0; e < p.head_dim; ++e) {
        dot += static_cast<double>(p.query[h * p.head_dim + e]) * key[e];
      }
      s[h][j - begin] = scale * dot;
    }
  }
  return s;
}

inline std::vector<double> SoftVotes(const std::vector<std::vector<double>>& s) {
  const size_t n = s[0].size();
  std::vector<double> votes(n, 0.0);
  for (const std::vector<double>& row : s) {
    double max = row[0];
    for (double x : row) max = std::max(max, x);
    double z = 0.0;
    for (double x : row) z += std::exp(x - max);
    for (size_t j = 0; j < n; ++j) votes[j] += std::exp(row[j] - max) / z;
  }
  return votes;
}

inline std::vector<double> SummedLogits(const std::vector<std::vector<double>>& s) {
  std::vector<double> votes(s[0].size(), 0.0);
  for (const std::vector<double>& row : s) {
    for (size_t j = 0; j < row.size(); ++j) votes[j] += row[j];
  }
  return votes;
}

// Indices of the k best by (score desc, index asc), in rank order (best first).
inline std::vector<int32_t> RankedTopK(const std::vector<double>& score, int64_t k) {
  std::vector<int32_t> order(score.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return score[a] != score[b] ? score[a] > score[b] : a < b;
  });
  order.resize(std::min<size_t>(order.size(), static_cast<size_t>(k)));
  return order;
}

inline std::vector<int32_t> Ascending(std::vector<int32_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Hard head vote: each head's top-k (score desc, index asc) votes once; rank by (count desc,
// summed logits desc, index asc). Returns candidate offsets, ascending.
inline std::vector<int32_t> HeadVotePicks(const std::vector<std::vector<double>>& s, int64_t k) {
  const size_t n = s[0].size();
  std::vector<int> count(n, 0);
  for (const std::vector<double>& row : s) {
    for (int32_t j : RankedTopK(row, k)) ++count[j];
  }
  const std::vector<double> summed = SummedLogits(s);
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    if (count[a] != count[b]) return count[a] > count[b];
    if (summed[a] != summed[b]) return summed[a] > summed[b];
    return a < b;
  });
  order.resize(std::min<size_t>(n, static_cast<size_t>(k)));
  return Ascending(order);
}

// Tokens j of [0, N) with j < n_init, j >= N - n_local, or j in picks (token indices).
inline std::vector<int32_t> Assemble(int64_t num_tokens, int64_t n_init, int64_t n_local,
                                     const std::vector<int32_t>& picks) {
  std::vector<bool> picked(num_tokens, false);
  for (int32_t p : picks) picked[p] = true;
  std::vector<int32_t> out;
  for (int64_t j = 0; j < num_tokens; ++j) {
    if (j < n_init || j >= num_tokens - n_local || picked[j])
      out.push_back(static_cast<int32_t>(j));
  }
  return out;
}

}  // namespace tokenselect::engine::reference

#endif  // TOKENSELECT_TESTS_UNIT_ENGINE_SELECTION_SELECTION_REFERENCE_H_
