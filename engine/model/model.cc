#include "engine/model/model.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "engine/model/fp8.h"
#include "engine/model/kv_scales.h"
#include "kernels/ops.h"

namespace tokenselect::engine {
namespace {

namespace cpu = kernels::cpu;

// Pointer to a bias, or nullptr when the config has none (empty vector).
const float* OrNull(const std::vector<float>& bias) { return bias.empty() ? nullptr : bias.data(); }

// Grows `v` to at least n elements; never shrinks (keeps the capacity for later steps).
template <typename T>
T* Ensure(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

// Round-to-nearest-even to bf16, kept in fp32 storage (NaN stays NaN).
void RoundToBf16(float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &v[i], sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) continue;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    std::memcpy(&v[i], &u, sizeof(u));
  }
}

void RoundToBf16(std::vector<float>* v) { RoundToBf16(v->data(), static_cast<int64_t>(v->size())); }

ModelWeights RoundWeightsLikeTheGpu(ModelWeights w) {
  RoundToBf16(&w.embed_tokens);
  RoundToBf16(&w.norm);
  RoundToBf16(&w.lm_head_weight);
  for (LayerWeights& l : w.layers) {
    for (std::vector<float>* v :
         {&l.input_layernorm, &l.q_proj, &l.q_bias, &l.k_proj, &l.k_bias, &l.v_proj, &l.v_bias,
          &l.o_proj, &l.post_attention_layernorm, &l.gate_proj, &l.gate_bias, &l.up_proj,
          &l.up_bias, &l.down_proj}) {
      RoundToBf16(v);
    }
  }
  return w;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Create(ModelConfig config, ModelWeights weights,
                                                     const ModelOptions& options) {
  RETURN_IF_ERROR(ValidateModelConfig(config));
  RETURN_IF_ERROR(CheckWeightShapes(config, weights));
  if (config.sliding_window > 0) {
    TS_LOG(WARN, "sliding_window {} is not applied; attention follows the selection policy",
           config.sliding_window);
  }
  std::vector<float> kv_scales;
  if (options.kv_dtype == KvCacheDType::kFP8E4M3) {
    ASSIGN_OR_RETURN(kv_scales, ComputeKvScales(config, weights));
  }
  if (options.emulate_bf16) weights = RoundWeightsLikeTheGpu(std::move(weights));
  return std::unique_ptr<Model>(
      new Model(std::move(config), std::move(weights), options, std::move(kv_scales)));
}

Model::Model(ModelConfig config, ModelWeights weights, const ModelOptions& options,
             std::vector<float> kv_scales)
    : config_(std::move(config)),
      options_(options),
      weights_(std::move(weights)),
      inv_freq_(kernels::RopeInverseFrequencies(ToRopeParams(config_))),
      kv_scales_(std::move(kv_scales)) {}

PagePoolOptions Model::KvCacheOptions(int64_t num_pages, int64_t page_size) const {
  PagePoolOptions options;
  options.num_pages = num_pages;
  options.page_size = page_size;
  options.num_layers = config_.num_layers;
  options.num_kv_heads = config_.num_kv_heads;
  options.head_dim = config_.head_dim;
  return options;
}

absl::Status Model::CheckRequest(const ForwardRequest& request) const {
  if (request.table == nullptr) return absl::InvalidArgumentError("forward: no token table");
  if (request.tokens.empty()) return absl::InvalidArgumentError("forward: no tokens");
  const PagePoolOptions& pool = request.table->pool()->options();
  if (pool.num_layers != config_.num_layers || pool.num_kv_heads != config_.num_kv_heads ||
      pool.head_dim != config_.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward: KV pool geometry (", pool.num_layers, " layers, ", pool.num_kv_heads,
                     " KV heads, head_dim ", pool.head_dim, ") does not fit the model (",
                     config_.num_layers, ", ", config_.num_kv_heads, ", ", config_.head_dim, ")"));
  }
  for (size_t i = 0; i < request.tokens.size(); ++i) {
    const int32_t id = request.tokens[i];
    if (id < 0 || id >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("forward: token id ", id, " at index ", i,
                                                     " is outside the vocabulary [0, ",
                                                     config_.vocab_size, ")"));
    }
  }
  const int64_t end = request.table->length() + static_cast<int64_t>(request.tokens.size());
  if (end > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError("forward: position exceeds the int32 range");
  }
  return absl::OkStatus();
}

absl::Status Model::CheckList(const AttentionList& list, int64_t num_new, int64_t num_slots) const {
  const int64_t kv_len = static_cast<int64_t>(list.kv_slots.size());
  if (static_cast<int64_t>(list.kv_positions.size()) != kv_len ||
      static_cast<int64_t>(list.q_positions.size()) != num_new ||
      static_cast<int64_t>(list.visible.size()) != num_new) {
    return absl::InternalError(
        absl::StrCat("attention list sizes: ", kv_len, " slots, ", list.kv_positions.size(),
                     " positions, ", list.q_positions.size(), " query positions and ",
                     list.visible.size(), " visible counts for ", num_new, " new tokens"));
  }
  for (int32_t slot : list.kv_slots) {
    if (slot < 0 || slot >= num_slots) {
      return absl::InternalError(
          absl::StrCat("attention list: slot ", slot, " outside the pool's ", num_slots, " slots"));
    }
  }
  for (int32_t v : list.visible) {
    if (v < 0 || v > kv_len) {
      return absl::InternalError(
          absl::StrCat("attention list: visible count ", v, " outside [0, ", kv_len, "]"));
    }
  }
  return absl::OkStatus();
}

absl::Status Model::RunLayers(const ForwardRequest& request, int64_t cache_length,
                              ForwardWorkspace* ws) const {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(request.tokens.size());
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = c.q_dim();
  const int64_t kv_dim = c.kv_dim();
  const int64_t inter = c.intermediate_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  PagePool* pool = request.table->pool();
  AttentionListProvider* provider = request.attention != nullptr ? request.attention : &ws->dense_;

  float* x = Ensure(ws->x_, n * hidden);
  float* h = Ensure(ws->h_, n * hidden);
  float* q = Ensure(ws->q_, n * q_dim);
  float* k = Ensure(ws->k_, n * kv_dim);
  float* v = Ensure(ws->v_, n * kv_dim);
  float* attn = Ensure(ws->attn_, n * q_dim);
  float* tmp = Ensure(ws->tmp_, n * hidden);
  float* gate = Ensure(ws->gate_, n * inter);
  float* up = Ensure(ws->up_, n * inter);
  int32_t* positions = Ensure(ws->positions_, n);
  int32_t* slots = Ensure(ws->slots_, n);
  for (int64_t i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(cache_length + i);
  request.table->Slots(cache_length, cache_length + n, slots);
  // bf16 storage points of the GPU backend (ModelOptions::emulate_bf16); no-ops otherwise.
  const bool bf16 = options_.emulate_bf16;
  auto round = [bf16](float* v, int64_t count) {
    if (bf16) RoundToBf16(v, count);
  };
  const bool fp8 = options_.kv_dtype == KvCacheDType::kFP8E4M3;

  cpu::Embedding(x, weights_.embed_tokens.data(), request.tokens.data(), n, hidden);
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    const LayerWeights& w = weights_.layers[layer];
    float* k_cache = pool->k(layer);
    float* v_cache = pool->v(layer);

    cpu::RmsNorm(h, x, w.input_layernorm.data(), n, hidden, eps);
    round(h, n * hidden);
    cpu::Linear(q, h, w.q_proj.data(), OrNull(w.q_bias), n, hidden, q_dim);
    cpu::Linear(k, h, w.k_proj.data(), OrNull(w.k_bias), n, hidden, kv_dim);
    cpu::Linear(v, h, w.v_proj.data(), OrNull(w.v_bias), n, hidden, kv_dim);
    round(q, n * q_dim);
    round(k, n * kv_dim);
    round(v, n * kv_dim);
    if (fp8) {  // the FP8 cache's round trip, per KV head's scale (kv_scales.h)
      const int64_t d = c.head_dim, hkv = c.num_kv_heads;
      for (int64_t i = 0; i < n * kv_dim; ++i) {
        const int64_t head = (i % kv_dim) / d;
        k[i] = QuantizeDequantizeE4m3(k[i], kv_scales_[KvScaleIndex(layer, 0, head, hkv)]);
        v[i] = QuantizeDequantizeE4m3(v[i], kv_scales_[KvScaleIndex(layer, 1, head, hkv)]);
      }
    }
    // Keys go into the cache un-rotated; RoPE is applied when they are gathered.
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(k_cache + slots[i] * kv_dim, k + i * kv_dim, kv_dim * sizeof(float));
      std::memcpy(v_cache + slots[i] * kv_dim, v + i * kv_dim, kv_dim * sizeof(float));
    }

    AttentionQuery query;
    query.layer = layer;
    query.cache_length = cache_length;
    query.num_new = n;
    query.new_positions = positions;
    query.q = q;
    query.k_cache = k_cache;
    query.v_cache = v_cache;
    query.table = request.table;
    query.config = &config_;
    query.inv_freq = inv_freq_.data();
    RETURN_IF_ERROR(provider->Select(query, &ws->list_));
    const AttentionList& list = ws->list_;
    RETURN_IF_ERROR(CheckList(list, n, pool->num_slots()));

    kernels::GatherAttentionParams params;
    params.out = attn;
    params.q = q;
    params.q_positions = list.q_positions.data();
    params.k_cache = k_cache;
    params.v_cache = v_cache;
    params.kv_slots = list.kv_slots.data();
    params.kv_positions = list.kv_positions.data();
    params.visible = list.visible.data();
    params.inv_freq = inv_freq_.data();
    params.num_queries = n;
    params.kv_len = static_cast<int64_t>(list.kv_slots.size());
    params.num_heads = c.num_heads;
    params.num_kv_heads = c.num_kv_heads;
    params.head_dim = c.head_dim;
    params.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
    cpu::GatherAttention(params);
    round(attn, n * q_dim);

    cpu::Linear(tmp, attn, w.o_proj.data(), OrNull(w.o_bias), n, q_dim, hidden);
    cpu::AddInPlace(x, tmp, n * hidden);

    cpu::RmsNorm(h, x, w.post_attention_layernorm.data(), n, hidden, eps);
    round(h, n * hidden);
    cpu::Linear(gate, h, w.gate_proj.data(), OrNull(w.gate_bias), n, hidden, inter);
    cpu::Linear(up, h, w.up_proj.data(), OrNull(w.up_bias), n, hidden, inter);
    round(gate, n * inter);
    round(up, n * inter);
    cpu::SwiGlu(gate, gate, up, n * inter);
    round(gate, n * inter);
    cpu::Linear(tmp, gate, w.down_proj.data(), OrNull(w.down_bias), n, inter, hidden);
    cpu::AddInPlace(x, tmp, n * hidden);
  }
  return absl::OkStatus();
}

absl::Status Model::Forward(const ForwardRequest& request, ForwardWorkspace* ws,
                            std::vector<float>* logits) const {
  TS_CHECK(ws != nullptr && logits != nullptr, "Forward needs a workspace and a logits vector");
  RETURN_IF_ERROR(CheckRequest(request));
  const int64_t n = static_cast<int64_t>(request.tokens.size());
  ASSIGN_OR_RETURN(const int64_t cache_length, request.table->Append(n));
  if (absl::Status status = RunLayers(request, cache_length, ws); !status.ok()) {
    request.table->Truncate(cache_length);  // the cache slots stay reserved but unused
    return status;
  }
  if (request.logits == LogitsRows::kNone) {
    logits->clear();
    return absl::OkStatus();
  }
  const int64_t hidden = config_.hidden_size;
  const int64_t rows = request.logits == LogitsRows::kAll ? n : 1;
  const float* x = ws->x_.data() + (n - rows) * hidden;
  float* h = ws->h_.data();
  cpu::RmsNorm(h, x, weights_.norm.data(), rows, hidden, static_cast<float>(config_.rms_norm_eps));
  if (options_.emulate_bf16) RoundToBf16(h, rows * hidden);
  logits->resize(rows * config_.vocab_size);
  cpu::Linear(logits->data(), h, weights_.lm_head(), nullptr, rows, hidden, config_.vocab_size);
  return absl::OkStatus();
}

}  // namespace tokenselect::engine
