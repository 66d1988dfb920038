// Naive double-precision references for the CPU kernel tests: plain loops, written from the
// formulas (not from the kernels), so a shared mistake is unlikely. The one deliberate fp32 step
// is the RoPE angle: Hugging Face forms float(position) * inv_freq[i] in fp32 and takes cos/sin
// of that fp32 value, so the references do the same and only then switch to double.
#ifndef TOKENSELECT_TESTS_UNIT_KERNELS_REFERENCE_H_
#define TOKENSELECT_TESTS_UNIT_KERNELS_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/ops.h"

namespace tokenselect::kernels::testing {

inline std::vector<float> RandomVector(size_t n, std::mt19937& rng, float lo = -1.0f,
                                       float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// The RoPE angle exactly as HF forms it (fp32 product), widened to double.
inline double RopeAngle(int32_t position, float inv_freq) {
  const float angle = static_cast<float>(position) * inv_freq;
  return static_cast<double>(angle);
}

// cos/sin in double of the fp32 angles of one position: [head_dim / 2] each.
inline void ReferenceCosSin(int32_t position, const std::vector<float>& inv_freq,
                            std::vector<double>* cos, std::vector<double>* sin) {
  cos->resize(inv_freq.size());
  sin->resize(inv_freq.size());
  for (size_t f = 0; f < inv_freq.size(); ++f) {
    const double angle = RopeAngle(position, inv_freq[f]);
    (*cos)[f] = std::cos(angle);
    (*sin)[f] = std::sin(angle);
  }
}

// rotate_half in double: x' = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1).
inline std::vector<double> ReferenceRotate(const float* x, int64_t head_dim,
                                           const std::vector<double>& cos,
                                           const std::vector<double>& sin) {
  const int64_t half = head_dim / 2;
  std::vector<double> out(static_cast<size_t>(head_dim));
  for (int64_t i = 0; i < head_dim; ++i) {
    const size_t f = static_cast<size_t>(i % half);
    const double rotated_half =
        i < half ? -static_cast<double>(x[i + half]) : static_cast<double>(x[i - half]);
    out[static_cast<size_t>(i)] = x[i] * cos[f] + rotated_half * sin[f];
  }
  return out;
}

inline std::vector<double> ReferenceRotate(const float* x, int64_t head_dim, int32_t position,
                                           const std::vector<float>& inv_freq) {
  std::vector<double> cos, sin;
  ReferenceCosSin(position, inv_freq, &cos, &sin);
  return ReferenceRotate(x, head_dim, cos, sin);
}

// Attention of every (query, head) over the listed tokens, in double: query head h uses kv head
// h / group, keys rotated at kv_positions, queries at q_positions, query i sees entries
// [0, visible[i]) (all when visible is null), zeros when it sees none. Returns
// [num_queries, num_heads, head_dim]. Streams over keys, so memory stays O(heads * kv_len).
inline std::vector<double> ReferenceGatherAttention(const GatherAttentionParams& p,
                                                    const std::vector<float>& inv_freq) {
  const int64_t nq = p.num_queries, H = p.num_heads, Hkv = p.num_kv_heads, d = p.head_dim;
  const int64_t group = H / Hkv;
  std::vector<std::vector<double>> q_rot(static_cast<size_t>(nq * H));
  for (int64_t i = 0; i < nq; ++i) {
    for (int64_t h = 0; h < H; ++h) {
      q_rot[static_cast<size_t>(i * H + h)] =
          ReferenceRotate(p.q + (i * H + h) * d, d, p.q_positions[i], inv_freq);
    }
  }
  // scores[(i * H + h) * kv_len + j]
  std::vector<double> scores(static_cast<size_t>(nq * H * p.kv_len));
  std::vector<double> cos, sin;
  for (int64_t j = 0; j < p.kv_len; ++j) {
    ReferenceCosSin(p.kv_positions[j], inv_freq, &cos, &sin);
    for (int64_t kh = 0; kh < Hkv; ++kh) {
      const float* k = p.k_cache + (static_cast<int64_t>(p.kv_slots[j]) * Hkv + kh) * d;
      const std::vector<double> k_rot = ReferenceRotate(k, d, cos, sin);
      for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
        for (int64_t i = 0; i < nq; ++i) {
          const std::vector<double>& qr = q_rot[static_cast<size_t>(i * H + h)];
          double dot = 0.0;
          for (int64_t c = 0; c < d; ++c)
            dot += qr[static_cast<size_t>(c)] * k_rot[static_cast<size_t>(c)];
          scores[static_cast<size_t>((i * H + h) * p.kv_len + j)] = dot * p.scale;
        }
      }
    }
  }
  std::vector<double> out(static_cast<size_t>(nq * H * d), 0.0);
  for (int64_t i = 0; i < nq; ++i) {
    int64_t vis = p.visible == nullptr ? p.kv_len : p.visible[i];
    vis = std::clamp<int64_t>(vis, 0, p.kv_len);
    if (vis == 0) continue;
    for (int64_t h = 0; h < H; ++h) {
      const double* s = scores.data() + (i * H + h) * p.kv_len;
      double max_s = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < vis; ++j) max_s = std::max(max_s, s[j]);
      double total = 0.0;
      for (int64_t j = 0; j < vis; ++j) total += std::exp(s[j] - max_s);
      double* o = out.data() + (i * H + h) * d;
      const int64_t kh = h / group;
      for (int64_t j = 0; j < vis; ++j) {
        const double w = std::exp(s[j] - max_s) / total;
        const float* v = p.v_cache + (static_cast<int64_t>(p.kv_slots[j]) * Hkv + kh) * d;
        for (int64_t c = 0; c < d; ++c) o[c] += w * v[c];
      }
    }
  }
  return out;
}

// Largest |a - b| / (atol_scale + |b|) style error: max over i of |a_i - b_i| / (1 + |b_i|).
inline double MaxScaledError(const std::vector<float>& a, const std::vector<double>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::fabs(static_cast<double>(a[i]) - b[i]) / (1.0 + std::fabs(b[i]));
    worst = std::isnan(err) ? std::numeric_limits<double>::infinity() : std::max(worst, err);
  }
  return worst;
}

}  // namespace tokenselect::kernels::testing

#endif  // TOKENSELECT_TESTS_UNIT_KERNELS_REFERENCE_H_
