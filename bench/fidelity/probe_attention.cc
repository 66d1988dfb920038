#include "bench/fidelity/probe_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "common/status.h"
#include "engine/kvcache/page_pool.h"
#include "engine/kvcache/token_table.h"
#include "engine/model/fp8.h"
#include "engine/model/kv_scales.h"
#include "engine/model/model_config.h"
#include "kernels/ops.h"

namespace tokenselect::bench {
namespace {

namespace cpu = kernels::cpu;

float Scale(const engine::ModelConfig& c) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
}

// GatherAttention of the step's queries over `list` into out [num_new, num_heads, head_dim].
void Attend(const engine::AttentionQuery& query, const engine::AttentionList& list,
            std::vector<float>* out) {
  const engine::ModelConfig& c = *query.config;
  out->resize(query.num_new * c.q_dim());
  kernels::GatherAttentionParams p;
  p.out = out->data();
  p.q = query.q;
  p.q_positions = list.q_positions.data();
  p.k_cache = query.k_cache;
  p.v_cache = query.v_cache;
  p.kv_slots = list.kv_slots.data();
  p.kv_positions = list.kv_positions.data();
  p.visible = list.visible.data();
  p.inv_freq = query.inv_freq;
  p.num_queries = query.num_new;
  p.kv_len = static_cast<int64_t>(list.kv_slots.size());
  p.num_heads = c.num_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  p.scale = Scale(c);
  cpu::GatherAttention(p);
}

}  // namespace

LayerFidelity LayerAccumulator::Finish(int64_t layer) const {
  LayerFidelity f;
  f.layer = layer;
  f.samples = samples;
  if (samples == 0) return f;
  const double n = static_cast<double>(samples);
  f.error_mean = error_sum / n;
  f.error_max = error_max;
  f.error_true_mean = error_true_sum / n;
  f.coverage_mean = coverage_sum / n;
  f.coverage_min = coverage_min;
  f.attended_mean = attended_sum / n;
  f.cached_tokens_mean = cached_sum / n;
  return f;
}

absl::StatusOr<std::unique_ptr<ProbeAttention>> ProbeAttention::Create(
    const std::vector<std::string>& policies, const engine::SelectionOptions& selection,
    int64_t num_layers, std::vector<float> kv_scales) {
  std::unique_ptr<ProbeAttention> probe(new ProbeAttention());
  probe->kv_scales_ = std::move(kv_scales);
  if (!probe->kv_scales_.empty()) {
    probe->shadow_k_.resize(num_layers);
    probe->shadow_v_.resize(num_layers);
  }
  for (const std::string& name : policies) {
    PolicyProbe p;
    p.name = name;
    engine::SelectionOptions options = selection;
    ASSIGN_OR_RETURN(options.policy, engine::ParsePolicy(name));
    ASSIGN_OR_RETURN(p.attention, engine::SelectionAttention::Create(options, num_layers));
    p.decode.resize(num_layers);
    p.prefill.resize(num_layers);
    probe->probes_.push_back(std::move(p));
  }
  return probe;
}

engine::AttentionQuery ProbeAttention::Shadow(const engine::AttentionQuery& query) {
  const engine::ModelConfig& c = *query.config;
  const int64_t kv_dim = c.kv_dim(), d = c.head_dim, hkv = c.num_kv_heads;
  const int64_t num_slots = query.table->pool()->num_slots();
  std::vector<float>& k = shadow_k_[query.layer];
  std::vector<float>& v = shadow_v_[query.layer];
  if (static_cast<int64_t>(k.size()) != num_slots * kv_dim) {
    k.assign(num_slots * kv_dim, 0.0f);
    v.assign(num_slots * kv_dim, 0.0f);
  }
  // Every token's K/V is final once written: only the step's new tokens are quantized.
  new_slots_.resize(query.num_new);
  query.table->Slots(query.cache_length, query.cache_length + query.num_new, new_slots_.data());
  for (int32_t slot : new_slots_) {
    for (int64_t j = 0; j < kv_dim; ++j) {
      const int64_t i = slot * kv_dim + j, head = j / d;
      k[i] = engine::QuantizeDequantizeE4m3(
          query.k_cache[i], kv_scales_[engine::KvScaleIndex(query.layer, 0, head, hkv)]);
      v[i] = engine::QuantizeDequantizeE4m3(
          query.v_cache[i], kv_scales_[engine::KvScaleIndex(query.layer, 1, head, hkv)]);
    }
  }
  engine::AttentionQuery shadow = query;
  shadow.k_cache = k.data();
  shadow.v_cache = v.data();
  return shadow;
}

absl::Status ProbeAttention::Select(const engine::AttentionQuery& query,
                                    engine::AttentionList* list) {
  RETURN_IF_ERROR(dense_.Select(query, list));
  // The shadow must hold every token the policies may select, so it follows every step.
  const engine::AttentionQuery policy_query = kv_scales_.empty() ? query : Shadow(query);
  if (phase_ == Phase::kOff) return absl::OkStatus();
  for (PolicyProbe& p : probes_) RETURN_IF_ERROR(p.attention->Select(policy_query, &p.list));
  if (phase_ != Phase::kFeed) Measure(query, policy_query, *list);
  return absl::OkStatus();
}

void ProbeAttention::Measure(const engine::AttentionQuery& query,
                             const engine::AttentionQuery& policy_query,
                             const engine::AttentionList& dense) {
  const int64_t total = query.cache_length + query.num_new;
  const int64_t num_slots = query.table->pool()->num_slots();
  if (static_cast<int64_t>(slot_to_token_.size()) != num_slots)
    slot_to_token_.assign(num_slots, -1);
  // The dense list is every token in order: entry j is token j.
  for (int64_t j = 0; j < total; ++j) slot_to_token_[dense.kv_slots[j]] = static_cast<int32_t>(j);
  for (PolicyProbe& p : probes_) {
    p.in_list.assign(total, 0);
    for (int32_t slot : p.list.kv_slots) {
      const int32_t token = slot_to_token_[slot];
      if (token >= 0) p.in_list[token] = 1;
    }
  }
  DenseCoverage(query, dense);

  Attend(query, dense, &out_dense_);
  double dense_norm = 0;
  for (float x : out_dense_) dense_norm += static_cast<double>(x) * x;
  dense_norm = std::sqrt(dense_norm);
  const int64_t rows = query.num_new * query.config->num_heads;
  for (PolicyProbe& p : probes_) {
    Attend(policy_query, p.list, &out_policy_);
    double diff = 0;
    for (size_t i = 0; i < out_dense_.size(); ++i) {
      const double d = static_cast<double>(out_dense_[i]) - out_policy_[i];
      diff += d * d;
    }
    const double error = dense_norm > 0 ? std::sqrt(diff) / dense_norm : std::sqrt(diff);
    // The same tokens at their true positions: the error of the selection alone.
    true_list_ = p.list;
    for (size_t j = 0; j < true_list_.kv_slots.size(); ++j) {
      true_list_.kv_positions[j] = slot_to_token_[true_list_.kv_slots[j]];
    }
    true_list_.q_positions = dense.q_positions;
    Attend(policy_query, true_list_, &out_policy_);
    double diff_true = 0;
    for (size_t i = 0; i < out_dense_.size(); ++i) {
      const double d = static_cast<double>(out_dense_[i]) - out_policy_[i];
      diff_true += d * d;
    }
    const double error_true =
        dense_norm > 0 ? std::sqrt(diff_true) / dense_norm : std::sqrt(diff_true);
    double coverage = 0;
    for (int64_t r = 0; r < rows; ++r) coverage += p.covered[r];
    coverage /= static_cast<double>(rows);

    LayerAccumulator& acc = (phase_ == Phase::kDecode ? p.decode : p.prefill)[query.layer];
    ++acc.samples;
    acc.error_sum += error;
    acc.error_max = std::max(acc.error_max, error);
    acc.error_true_sum += error_true;
    acc.coverage_sum += coverage;
    acc.coverage_min = std::min(acc.coverage_min, coverage);
    acc.attended_sum += static_cast<double>(p.list.kv_slots.size()) - query.num_new;
    acc.cached_sum += static_cast<double>(query.cache_length);
  }
  for (int64_t j = 0; j < total; ++j) slot_to_token_[dense.kv_slots[j]] = -1;
}

void ProbeAttention::DenseCoverage(const engine::AttentionQuery& query,
                                   const engine::AttentionList& dense) {
  const engine::ModelConfig& c = *query.config;
  const int64_t total = query.cache_length + query.num_new;
  const int64_t d = c.head_dim, hkv = c.num_kv_heads, heads = c.num_heads;
  const int64_t group = c.group_size();
  // Keys of every token rotated at their true positions, queries at theirs.
  k_rot_.resize(total * hkv * d);
  for (int64_t j = 0; j < total; ++j) {
    std::memcpy(k_rot_.data() + j * hkv * d, query.k_cache + dense.kv_slots[j] * hkv * d,
                hkv * d * sizeof(float));
  }
  positions_.resize(total);
  for (int64_t j = 0; j < total; ++j) positions_[j] = dense.kv_positions[j];
  cpu::ApplyRope(k_rot_.data(), positions_.data(), total, hkv, d, query.inv_freq);
  q_rot_.assign(query.q, query.q + query.num_new * heads * d);
  cpu::ApplyRope(q_rot_.data(), dense.q_positions.data(), query.num_new, heads, d, query.inv_freq);

  const float scale = Scale(c);
  const int64_t rows = query.num_new * heads;
  for (PolicyProbe& p : probes_) p.covered.assign(rows, 0.0);
    // Rows are independent; each thread has its own probability buffer.
#pragma omp parallel
  {
    std::vector<double> logits;
#pragma omp for schedule(dynamic, 4)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r / heads, h = r % heads;
      const int64_t visible = dense.visible[i];
      const float* qv = q_rot_.data() + r * d;
      const int64_t kv_head = h / group;
      logits.resize(visible);
      double max_logit = -1e300;
      for (int64_t j = 0; j < visible; ++j) {
        const float* kv = k_rot_.data() + (j * hkv + kv_head) * d;
        float dot = 0;
        for (int64_t e = 0; e < d; ++e) dot += qv[e] * kv[e];
        logits[j] = static_cast<double>(dot) * scale;
        max_logit = std::max(max_logit, logits[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < visible; ++j) {
        logits[j] = std::exp(logits[j] - max_logit);
        sum += logits[j];
      }
      for (PolicyProbe& p : probes_) {
        double covered = 0;
        for (int64_t j = 0; j < visible; ++j) {
          if (p.in_list[j]) covered += logits[j];
        }
        p.covered[r] = covered / sum;
      }
    }
  }
}

std::vector<LayerFidelity> ProbeAttention::Results(size_t policy, Phase phase) const {
  const PolicyProbe& p = probes_.at(policy);
  const std::vector<LayerAccumulator>& accs = phase == Phase::kDecode ? p.decode : p.prefill;
  std::vector<LayerFidelity> out;
  for (size_t layer = 0; layer < accs.size(); ++layer) {
    out.push_back(accs[layer].Finish(static_cast<int64_t>(layer)));
  }
  return out;
}

}  // namespace tokenselect::bench
