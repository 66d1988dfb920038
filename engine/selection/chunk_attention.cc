#include "engine/selection/chunk_attention.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "kernels/ops.h"

namespace tokenselect::engine {

absl::Status ValidateChunkObservation(const ChunkObservation& chunk) {
  if (chunk.q == nullptr || chunk.k_cache == nullptr || chunk.slots == nullptr ||
      chunk.positions == nullptr || chunk.inv_freq == nullptr) {
    return absl::InvalidArgumentError("chunk observation: a pointer is null");
  }
  if (chunk.num_new < 1 || chunk.num_heads < 1 || chunk.num_kv_heads < 1 || chunk.head_dim < 2 ||
      chunk.head_dim % 2 != 0 || chunk.num_slots < 1 || chunk.num_heads % chunk.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk observation: bad shape (num_new ", chunk.num_new, ", heads ",
                     chunk.num_heads, "/", chunk.num_kv_heads, ", head_dim ", chunk.head_dim, ")"));
  }
  if (!std::isfinite(chunk.scale) || chunk.scale <= 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk observation: scale must be finite and > 0, got ", chunk.scale));
  }
  for (int64_t i = 0; i < chunk.num_new; ++i) {
    if (chunk.slots[i] < 0 || chunk.slots[i] >= chunk.num_slots) {
      return absl::InvalidArgumentError(absl::StrCat("chunk observation: slots[", i,
                                                     "] = ", chunk.slots[i], " outside the pool"));
    }
  }
  return absl::OkStatus();
}

void ChunkAttentionMap(const ChunkObservation& chunk, std::vector<float>* a) {
  const int64_t c = chunk.num_new;
  const int64_t h_q = chunk.num_heads;
  const int64_t h_kv = chunk.num_kv_heads;
  const int64_t d = chunk.head_dim;
  const int64_t group = h_q / h_kv;
  // Rotated copies: q [c, H, d], k [c, H_kv, d].
  std::vector<float> q(chunk.q, chunk.q + c * h_q * d);
  std::vector<float> k(static_cast<size_t>(c * h_kv * d));
  for (int64_t j = 0; j < c; ++j) {
    const float* src = chunk.k_cache + static_cast<int64_t>(chunk.slots[j]) * h_kv * d;
    std::copy(src, src + h_kv * d, k.begin() + j * h_kv * d);
  }
  kernels::cpu::ApplyRope(q.data(), chunk.positions, c, h_q, d, chunk.inv_freq);
  kernels::cpu::ApplyRope(k.data(), chunk.positions, c, h_kv, d, chunk.inv_freq);

  a->assign(static_cast<size_t>(c * c), 0.0f);
  // Rows are independent (each writes its own row of `a`, heads summed in order h = 0, 1, ...),
  // so they are split over threads without changing the result.
#pragma omp parallel for schedule(dynamic, 8) if (c * c * h_q * d > (1 << 20))
  for (int64_t i = 0; i < c; ++i) {
    std::vector<double> row(static_cast<size_t>(i + 1));
    float* out = a->data() + i * c;
    for (int64_t h = 0; h < h_q; ++h) {
      const int64_t kv = h / group;
      const float* qi = &q[(i * h_q + h) * d];
      double max = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        const float* kj = &k[(j * h_kv + kv) * d];
        double dot = 0.0;
        for (int64_t e = 0; e < d; ++e) dot += static_cast<double>(qi[e]) * kj[e];
        row[j] = chunk.scale * dot;
        max = std::max(max, row[j]);
      }
      double z = 0.0;
      for (int64_t j = 0; j <= i; ++j) {
        row[j] = std::exp(row[j] - max);
        z += row[j];
      }
      for (int64_t j = 0; j <= i; ++j) out[j] += static_cast<float>(row[j] / z);
    }
  }
}

void ReceivedAttention(const std::vector<float>& a, int64_t c, std::vector<float>* received) {
  TS_CHECK(static_cast<int64_t>(a.size()) == c * c, "map of {} entries for c = {}", a.size(), c);
  received->assign(static_cast<size_t>(c), 0.0f);
  std::vector<double> sum(static_cast<size_t>(c), 0.0);
  for (int64_t i = 0; i < c; ++i) {
    for (int64_t j = 0; j <= i; ++j) sum[j] += a[i * c + j];
  }
  for (int64_t j = 0; j < c; ++j) (*received)[j] = static_cast<float>(sum[j]);
}

}  // namespace tokenselect::engine
