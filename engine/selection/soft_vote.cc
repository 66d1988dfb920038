#include "engine/selection/soft_vote.h"

#include <cmath>
#include <vector>

#include "common/logging.h"

namespace tokenselect::engine {
namespace {

constexpr int64_t kParallelWork = int64_t{1} << 20;

}  // namespace

void SoftVote(float* logits, int64_t num_heads, int64_t n, float* votes) {
  TS_CHECK(n >= 1 && num_heads >= 1, "SoftVote(num_heads={}, n={})", num_heads, n);
  const bool parallel = n * num_heads >= kParallelWork;
  // Per head (one thread each): the max, then exp(s - max) in place, summed in double.
  std::vector<float> inv_sum(static_cast<size_t>(num_heads));
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t h = 0; h < num_heads; ++h) {
    float* row = logits + h * n;
    float max = row[0];
    for (int64_t j = 1; j < n; ++j) max = row[j] > max ? row[j] : max;
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      row[j] = std::exp(row[j] - max);
      sum += row[j];
    }
    inv_sum[h] = static_cast<float>(1.0 / sum);
  }
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t j = 0; j < n; ++j) {
    float vote = 0.0f;
    for (int64_t h = 0; h < num_heads; ++h) vote += logits[h * n + j] * inv_sum[h];
    votes[j] = vote;
  }
}

void SumOverHeads(const float* logits, int64_t num_heads, int64_t n, float* votes) {
  const bool parallel = n * num_heads >= kParallelWork;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t j = 0; j < n; ++j) {
    float vote = 0.0f;
    for (int64_t h = 0; h < num_heads; ++h) vote += logits[h * n + j];
    votes[j] = vote;
  }
}

}  // namespace tokenselect::engine
