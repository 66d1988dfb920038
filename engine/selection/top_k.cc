#include "engine/selection/top_k.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "common/logging.h"

namespace tokenselect::engine {
namespace {

// The k-th largest of values[0, n) (1 <= k <= n); reorders `values`.
float KthLargest(std::vector<float>& values, int64_t k) {
  auto nth = values.begin() + (k - 1);
  std::nth_element(values.begin(), nth, values.end(), std::greater<float>());
  return *nth;
}

}  // namespace

void TopKByScore(const float* scores, int64_t n, int64_t k, std::vector<int32_t>* out,
                 std::vector<float>* scratch) {
  TS_CHECK(n >= 0 && k >= 0, "TopKByScore(n={}, k={})", n, k);
  out->clear();
  k = std::min(k, n);
  if (k == 0) return;
  out->reserve(static_cast<size_t>(k));
  std::vector<float> local;
  std::vector<float>& values = scratch != nullptr ? *scratch : local;
  values.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isnan(scores[i])) values.push_back(scores[i]);
  }
  const int64_t numbers = static_cast<int64_t>(values.size());
  if (k >= numbers) {
    // Every number wins; the remaining places go to the first NaNs.
    int64_t nans_left = k - numbers;
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isnan(scores[i]) || nans_left-- > 0) out->push_back(static_cast<int32_t>(i));
    }
    return;
  }
  const float threshold = KthLargest(values, k);
  // Everything above the threshold wins (fewer than k of them); the remaining places go to the
  // threshold's ties in index order. One scan keeps the output ascending. NaN fails both tests.
  int64_t above = 0;
  for (int64_t i = 0; i < n; ++i) above += scores[i] > threshold ? 1 : 0;
  int64_t ties_left = k - above;
  for (int64_t i = 0; i < n; ++i) {
    const float v = scores[i];
    if (v > threshold || (v == threshold && ties_left-- > 0)) {
      out->push_back(static_cast<int32_t>(i));
    }
  }
}

void TopKByTwoScores(const std::vector<int32_t>& indices, const float* primary,
                     const float* secondary, int64_t k, std::vector<int32_t>* out,
                     std::vector<float>* scratch) {
  TS_CHECK(k >= 0, "TopKByTwoScores(k={})", k);
  out->clear();
  const int64_t n = static_cast<int64_t>(indices.size());
  k = std::min(k, n);
  if (k == 0) return;
  if (k == n) {
    *out = indices;
    return;
  }
  std::vector<float> local;
  std::vector<float>& values = scratch != nullptr ? *scratch : local;
  values.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    values[i] = primary[indices[i]];
    TS_CHECK(!std::isnan(values[i]), "TopKByTwoScores: primary[{}] is NaN", indices[i]);
  }
  const float threshold = KthLargest(values, k);
  // Winners by the primary score alone, then the threshold's ties ranked by the secondary.
  std::vector<int32_t> tied;
  std::vector<float> tied_secondary;
  int64_t above = 0;
  for (int32_t index : indices) {
    const float v = primary[index];
    if (v > threshold) {
      ++above;
    } else if (v == threshold) {
      tied.push_back(index);
      tied_secondary.push_back(secondary[index]);
    }
  }
  std::vector<int32_t> tied_winners;  // positions in `tied`, ascending
  TopKByScore(tied_secondary.data(), static_cast<int64_t>(tied.size()), k - above, &tied_winners,
              &values);
  out->reserve(static_cast<size_t>(k));
  size_t next_tied = 0;
  for (int32_t index : indices) {
    const float v = primary[index];
    if (v > threshold) {
      out->push_back(index);
    } else if (next_tied < tied_winners.size() && tied[tied_winners[next_tied]] == index) {
      out->push_back(index);
      ++next_tied;
    }
  }
}

}  // namespace tokenselect::engine
