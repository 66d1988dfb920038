// cpu::GatherAttention (kernels/ops.h): picks a schedule (gather_attention.h) and holds the pieces
// both schedules share: validation, query rotation, the online-softmax step, the two sgemm
// shapes and the final normalisation.
//
// Precision: everything is fp32. RoPE angles are fp32 products float(position) * inv_freq[i]
// (as Hugging Face computes them) with near-correctly-rounded cos/sin (vec_math.h); scores are
// scale * (q . k) from sgemm (alpha = scale, the HF order: dot product first, then scale); the
// softmax is streamed over tiles with a running max m, sum l and unnormalised output acc per
// query row (exp within 2 ulp, vec_math.h); out = acc / l. A query with no visible key
// (visible[i] == 0, or kv_len == 0) gets zeros.
#include "kernels/cpu/gather_attention.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/logging.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec_math.h"

namespace tokenselect::kernels::cpu {
namespace internal {

void ValidateGatherAttentionParams(const GatherAttentionParams& p) {
  TS_CHECK(p.num_queries >= 0 && p.kv_len >= 0, "GatherAttention: num_queries {} kv_len {}",
           p.num_queries, p.kv_len);
  TS_CHECK(p.num_heads > 0 && p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0,
           "GatherAttention: num_heads {} must be a positive multiple of num_kv_heads {}",
           p.num_heads, p.num_kv_heads);
  TS_CHECK(p.head_dim > 0 && p.head_dim % 2 == 0 && p.head_dim <= 4096,
           "GatherAttention: head_dim {} must be even and at most 4096", p.head_dim);
  TS_CHECK(p.kv_len <= INT_MAX, "GatherAttention: kv_len {} exceeds int32", p.kv_len);
  if (p.num_queries == 0) return;
  TS_CHECK(p.out != nullptr && p.q != nullptr && p.q_positions != nullptr && p.inv_freq != nullptr,
           "GatherAttention: out, q, q_positions and inv_freq are required");
  if (p.kv_len > 0) {
    TS_CHECK(p.k_cache != nullptr && p.v_cache != nullptr && p.kv_slots != nullptr &&
                 p.kv_positions != nullptr,
             "GatherAttention: k_cache, v_cache, kv_slots and kv_positions are required");
  }
}

std::vector<int64_t> VisibleCounts(const GatherAttentionParams& p) {
  std::vector<int64_t> counts(static_cast<size_t>(p.num_queries), p.kv_len);
  if (p.visible != nullptr) {
    for (int64_t i = 0; i < p.num_queries; ++i) {
      counts[static_cast<size_t>(i)] =
          std::clamp<int64_t>(static_cast<int64_t>(p.visible[i]), 0, p.kv_len);
    }
  }
  return counts;
}

bool PrepareGather(const GatherAttentionParams& p, GatherGeometry* g) {
  ValidateGatherAttentionParams(p);
  if (p.num_queries == 0) return false;
  g->group = p.num_heads / p.num_kv_heads;
  g->rows = p.num_queries * g->group;
  g->visible = VisibleCounts(p);
  g->visible_end = *std::max_element(g->visible.begin(), g->visible.end());
  if (g->visible_end == 0) {
    std::memset(p.out, 0,
                sizeof(float) * static_cast<size_t>(p.num_queries * p.num_heads * p.head_dim));
    return false;
  }
  return true;
}

void RotateQueries(const GatherAttentionParams& p, float* rotated) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t rows = p.num_queries * group;
  const int64_t d = p.head_dim;
  const int64_t half = d / 2;
#pragma omp parallel if (p.num_queries * p.num_heads * d >= (int64_t{1} << 15))
  {
    float* cos = ThreadScratch(ScratchSlot::kWorkerCos, static_cast<size_t>(half));
    float* sin = ThreadScratch(ScratchSlot::kWorkerSin, static_cast<size_t>(half));
#pragma omp for
    for (int64_t i = 0; i < p.num_queries; ++i) {
      RopeCosSin(p.q_positions[i], p.inv_freq, half, cos, sin);
      for (int64_t h = 0; h < p.num_heads; ++h) {
        const int64_t kv_head = h / group;
        const int64_t row = kv_head * rows + i * group + (h % group);
        RotateHalf(rotated + row * d, p.q + (i * p.num_heads + h) * d, cos, sin, half);
      }
    }
  }
}

void OnlineSoftmaxStep(float* s, int64_t rows, int64_t cols, const int64_t* limit, float* m,
                       float* l, float* acc, int64_t head_dim) {
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * cols;
    const int64_t n = std::min(limit[r], cols);
    if (n <= 0) {
      std::memset(sr, 0, sizeof(float) * static_cast<size_t>(cols));
      continue;
    }
    const float m_new = std::max(m[r], RowMax(sr, n));
    const float alpha = std::exp(m[r] - m_new);  // 0 on a row's first visible block (m = -inf)
    const float sum = ExpShiftedInPlace(sr, n, m_new);
    if (n < cols) std::memset(sr + n, 0, sizeof(float) * static_cast<size_t>(cols - n));
    l[r] = l[r] * alpha + sum;
    if (alpha != 1.0f) {
      float* ar = acc + r * head_dim;
      for (int64_t k = 0; k < head_dim; ++k) ar[k] *= alpha;
    }
    m[r] = m_new;
  }
}

void ScoreGemm(float* s, const float* q, const float* k, int64_t rows, int64_t keys,
               int64_t head_dim, float scale) {
  const int r = static_cast<int>(rows), n = static_cast<int>(keys), d = static_cast<int>(head_dim);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r, n, d, scale, q, d, k, d, 0.0f, s, n);
}

void AccumulateGemm(float* acc, const float* p, const float* v, int64_t rows, int64_t keys,
                    int64_t head_dim) {
  const int r = static_cast<int>(rows), n = static_cast<int>(keys), d = static_cast<int>(head_dim);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, d, n, 1.0f, p, n, v, d, 1.0f, acc, d);
}

void WriteNormalizedOutput(const GatherAttentionParams& p, const float* acc, const float* l) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t rows = p.num_queries * group;
  const int64_t d = p.head_dim;
#pragma omp parallel for if (p.num_queries * p.num_heads * d >= (int64_t{1} << 15))
  for (int64_t i = 0; i < p.num_queries; ++i) {
    for (int64_t h = 0; h < p.num_heads; ++h) {
      const int64_t row = (h / group) * rows + i * group + (h % group);
      float* o = p.out + (i * p.num_heads + h) * d;
      const float total = l[row];
      if (total > 0.0f) {
        const float* a = acc + row * d;
        for (int64_t k = 0; k < d; ++k) o[k] = a[k] / total;
      } else {
        std::memset(o, 0, sizeof(float) * static_cast<size_t>(d));
      }
    }
  }
}

}  // namespace internal

void GatherAttention(const GatherAttentionParams& params) {
  internal::ValidateGatherAttentionParams(params);
  if (params.num_queries == 0) return;
  const int64_t rows = params.num_queries * (params.num_heads / params.num_kv_heads);
  const internal::GatherAttentionOptions defaults;
  if (rows <= internal::kSplitKeysMaxRows) {
    internal::GatherAttentionSplitKeys(params, defaults);
  } else {
    internal::GatherAttentionTiled(params, defaults);
  }
}

}  // namespace tokenselect::kernels::cpu
