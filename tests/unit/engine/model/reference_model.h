// An independent, deliberately naive Llama-family forward pass in double precision, written
// from the Hugging Face modeling code's definitions (plain loops, no kernels/), used as the
// oracle for engine::Model. It runs one token at a time against its own double-precision KV
// cache; the attended set of each token is given explicitly, so the same oracle checks dense
// attention and any AttentionListProvider.
#ifndef TOKENSELECT_TESTS_UNIT_ENGINE_MODEL_REFERENCE_MODEL_H_
#define TOKENSELECT_TESTS_UNIT_ENGINE_MODEL_REFERENCE_MODEL_H_

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/weights.h"

namespace tokenselect::engine::testing {

// inv_freq in double from the transformers rope-init formulas (default, linear, llama3).
inline std::vector<double> ReferenceInvFreq(const ModelConfig& c) {
  const int64_t d = c.head_dim;
  std::vector<double> inv(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) {
    inv[i] = 1.0 / std::pow(c.rope.theta, static_cast<double>(2 * i) / static_cast<double>(d));
  }
  if (c.rope.scaling == kernels::RopeScaling::kLinear) {
    for (double& f : inv) f /= c.rope.factor;
  } else if (c.rope.scaling == kernels::RopeScaling::kLlama3) {
    const double old_len = static_cast<double>(c.rope.original_max_position);
    const double low_wavelen = old_len / c.rope.low_freq_factor;
    const double high_wavelen = old_len / c.rope.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2 * M_PI / f;
      if (wavelen < high_wavelen) continue;  // high frequency: unchanged
      if (wavelen > low_wavelen) {
        f /= c.rope.factor;  // low frequency: scaled
        continue;
      }
      const double smooth = (old_len / wavelen - c.rope.low_freq_factor) /
                            (c.rope.high_freq_factor - c.rope.low_freq_factor);
      f = (1 - smooth) * f / c.rope.factor + smooth * f;
    }
  }
  return inv;
}

class ReferenceModel {
 public:
  // One attended token: its index in the sequence and the RoPE position it gets.
  struct Attended {
    int64_t token;
    int64_t position;
  };

  ReferenceModel(const ModelConfig& config, const ModelWeights& weights)
      : c_(config),
        w_(weights),
        inv_freq_(ReferenceInvFreq(config)),
        k_(config.num_layers),
        v_(config.num_layers) {}

  // Processes the next token (index = number processed so far), which attends to `attended`
  // (it must include itself, whose K/V are cached before attention, as engine::Model does)
  // with its query at `q_position`. Returns its logits.
  std::vector<double> Step(int32_t token, const std::vector<Attended>& attended,
                           int64_t q_position) {
    const int64_t hidden = c_.hidden_size, d = c_.head_dim;
    std::vector<double> x(hidden);
    for (int64_t i = 0; i < hidden; ++i) x[i] = w_.embed_tokens[token * hidden + i];
    for (int64_t l = 0; l < c_.num_layers; ++l) {
      const LayerWeights& w = w_.layers[l];
      std::vector<double> h = RmsNorm(x, w.input_layernorm);
      std::vector<double> q = Linear(h, w.q_proj, w.q_bias, c_.q_dim());
      k_[l].push_back(Linear(h, w.k_proj, w.k_bias, c_.kv_dim()));  // un-rotated
      v_[l].push_back(Linear(h, w.v_proj, w.v_bias, c_.kv_dim()));
      std::vector<double> attn(c_.q_dim(), 0.0);
      const int64_t group = c_.num_heads / c_.num_kv_heads;
      for (int64_t head = 0; head < c_.num_heads; ++head) {
        const int64_t kvh = head / group;
        std::vector<double> qh = Rotate(&q[head * d], q_position);
        std::vector<double> scores;
        for (const Attended& a : attended) {
          std::vector<double> kh = Rotate(&k_[l][a.token][kvh * d], a.position);
          double s = 0;
          for (int64_t i = 0; i < d; ++i) s += qh[i] * kh[i];
          scores.push_back(s / std::sqrt(static_cast<double>(d)));
        }
        double max = -1e300, sum = 0;
        for (double s : scores) max = std::max(max, s);
        for (double& s : scores) sum += (s = std::exp(s - max));
        for (size_t j = 0; j < attended.size(); ++j) {
          const double* vj = &v_[l][attended[j].token][kvh * d];
          for (int64_t i = 0; i < d; ++i) attn[head * d + i] += scores[j] / sum * vj[i];
        }
      }
      std::vector<double> o = Linear(attn, w.o_proj, w.o_bias, hidden);
      for (int64_t i = 0; i < hidden; ++i) x[i] += o[i];
      h = RmsNorm(x, w.post_attention_layernorm);
      std::vector<double> gate = Linear(h, w.gate_proj, w.gate_bias, c_.intermediate_size);
      std::vector<double> up = Linear(h, w.up_proj, w.up_bias, c_.intermediate_size);
      for (size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
      std::vector<double> down = Linear(gate, w.down_proj, w.down_bias, hidden);
      for (int64_t i = 0; i < hidden; ++i) x[i] += down[i];
    }
    std::vector<double> h = RmsNorm(x, w_.norm);
    std::vector<double> logits(c_.vocab_size, 0.0);
    const float* head = w_.lm_head();
    for (int64_t t = 0; t < c_.vocab_size; ++t) {
      for (int64_t i = 0; i < hidden; ++i) logits[t] += h[i] * head[t * hidden + i];
    }
    return logits;
  }

  // Dense causal step: the next token attends to every token so far (itself included) at its
  // true position.
  std::vector<double> DenseStep(int32_t token) {
    const int64_t t = static_cast<int64_t>(k_.empty() ? 0 : k_[0].size());
    std::vector<Attended> attended;
    for (int64_t j = 0; j <= t; ++j) attended.push_back({j, j});
    return Step(token, attended, t);
  }

  // The cached un-rotated key of token t in `layer`: [num_kv_heads * head_dim].
  const std::vector<double>& Key(int64_t layer, int64_t t) const { return k_[layer][t]; }

 private:
  std::vector<double> RmsNorm(const std::vector<double>& x, const std::vector<float>& w) const {
    double ms = 0;
    for (double v : x) ms += v * v;
    const double r = 1.0 / std::sqrt(ms / static_cast<double>(x.size()) + c_.rms_norm_eps);
    std::vector<double> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * r * w[i];
    return out;
  }

  // y = W x + b, W: [out, in].
  static std::vector<double> Linear(const std::vector<double>& x, const std::vector<float>& w,
                                    const std::vector<float>& b, int64_t out) {
    const int64_t in = static_cast<int64_t>(x.size());
    std::vector<double> y(out);
    for (int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (int64_t i = 0; i < in; ++i) s += static_cast<double>(w[o * in + i]) * x[i];
      y[o] = s;
    }
    return y;
  }

  // rotate_half RoPE of one head vector at `position`.
  std::vector<double> Rotate(const double* x, int64_t position) const {
    const int64_t half = c_.head_dim / 2;
    std::vector<double> out(c_.head_dim);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(position) * inv_freq_[i];
      const double cs = std::cos(angle), sn = std::sin(angle);
      out[i] = x[i] * cs - x[i + half] * sn;
      out[i + half] = x[i + half] * cs + x[i] * sn;
    }
    return out;
  }

  const ModelConfig& c_;
  const ModelWeights& w_;
  std::vector<double> inv_freq_;
  std::vector<std::vector<std::vector<double>>> k_, v_;  // [layer][token][kv_dim]
};

}  // namespace tokenselect::engine::testing

#endif  // TOKENSELECT_TESTS_UNIT_ENGINE_MODEL_REFERENCE_MODEL_H_
