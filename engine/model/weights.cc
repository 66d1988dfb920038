#include "engine/model/weights.h"

#include <algorithm>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status.h"

namespace tokenselect::engine {
namespace {

// Walks the tensors of `config` in checkpoint order. Weights is ModelWeights or const
// ModelWeights; Vector the matching std::vector<float> constness.
template <typename Vector, typename Weights>
std::vector<BasicWeightEntry<Vector>> List(const ModelConfig& c, Weights* w) {
  std::vector<BasicWeightEntry<Vector>> entries;
  const int64_t hidden = c.hidden_size;
  const int64_t inter = c.intermediate_size;
  auto add = [&](std::string name, std::vector<int64_t> shape, WeightKind kind, int64_t fan_in,
                 Vector* data) {
    entries.push_back({std::move(name), std::move(shape), kind, fan_in, data});
  };
  add("model.embed_tokens.weight", {c.vocab_size, hidden}, WeightKind::kEmbedding, hidden,
      w ? &w->embed_tokens : nullptr);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    auto* l = w == nullptr ? nullptr : &w->layers[i];
    const std::string p = absl::StrCat("model.layers.", i, ".");
    auto linear = [&](const char* name, int64_t out, int64_t in, Vector* weight, bool has_bias,
                      Vector* bias) {
      add(absl::StrCat(p, name, ".weight"), {out, in}, WeightKind::kLinear, in, weight);
      if (has_bias) add(absl::StrCat(p, name, ".bias"), {out}, WeightKind::kBias, in, bias);
    };
    add(p + "input_layernorm.weight", {hidden}, WeightKind::kNorm, hidden,
        l ? &l->input_layernorm : nullptr);
    linear("self_attn.q_proj", c.q_dim(), hidden, l ? &l->q_proj : nullptr, c.qkv_bias,
           l ? &l->q_bias : nullptr);
    linear("self_attn.k_proj", c.kv_dim(), hidden, l ? &l->k_proj : nullptr, c.qkv_bias,
           l ? &l->k_bias : nullptr);
    linear("self_attn.v_proj", c.kv_dim(), hidden, l ? &l->v_proj : nullptr, c.qkv_bias,
           l ? &l->v_bias : nullptr);
    linear("self_attn.o_proj", hidden, c.q_dim(), l ? &l->o_proj : nullptr, c.o_bias,
           l ? &l->o_bias : nullptr);
    add(p + "post_attention_layernorm.weight", {hidden}, WeightKind::kNorm, hidden,
        l ? &l->post_attention_layernorm : nullptr);
    linear("mlp.gate_proj", inter, hidden, l ? &l->gate_proj : nullptr, c.mlp_bias,
           l ? &l->gate_bias : nullptr);
    linear("mlp.up_proj", inter, hidden, l ? &l->up_proj : nullptr, c.mlp_bias,
           l ? &l->up_bias : nullptr);
    linear("mlp.down_proj", hidden, inter, l ? &l->down_proj : nullptr, c.mlp_bias,
           l ? &l->down_bias : nullptr);
  }
  add("model.norm.weight", {hidden}, WeightKind::kNorm, hidden, w ? &w->norm : nullptr);
  if (!c.tie_word_embeddings) {
    add("lm_head.weight", {c.vocab_size, hidden}, WeightKind::kLinear, hidden,
        w ? &w->lm_head_weight : nullptr);
  }
  return entries;
}

}  // namespace

std::vector<WeightEntry> ListWeights(const ModelConfig& config, ModelWeights* weights) {
  if (weights != nullptr) weights->layers.resize(config.num_layers);
  return List<std::vector<float>>(config, weights);
}

std::vector<ConstWeightEntry> ListWeights(const ModelConfig& config, const ModelWeights& weights) {
  TS_CHECK(static_cast<int64_t>(weights.layers.size()) == config.num_layers,
           "weights have {} layers, config {}", weights.layers.size(), config.num_layers);
  return List<const std::vector<float>>(config, &weights);
}

int64_t NumParameters(const ModelConfig& config) {
  int64_t total = 0;
  for (const WeightEntry& e : ListWeights(config, nullptr)) total += e.num_elements();
  return total;
}

absl::StatusOr<ModelWeights> BindWeights(const ModelConfig& config,
                                         const SafetensorsCheckpoint& checkpoint,
                                         WeightLoadStats* stats) {
  ModelWeights weights;
  std::vector<WeightEntry> entries = ListWeights(config, &weights);
  // Check names, shapes and dtypes of everything before reading (and allocating) anything.
  std::vector<std::pair<const TensorInfo*, const SafetensorsFile*>> sources;
  std::set<std::string> used;
  for (const WeightEntry& entry : entries) {
    const SafetensorsFile* file = nullptr;
    const TensorInfo* info = checkpoint.Find(entry.name, &file);
    if (info == nullptr) {
      return absl::NotFoundError(absl::StrCat("checkpoint has no tensor ", entry.name));
    }
    if (info->shape != entry.shape) {
      return absl::InvalidArgumentError(absl::StrCat(entry.name, ": expected shape ",
                                                     ShapeString(entry.shape), ", got ",
                                                     ShapeString(info->shape)));
    }
    if (!IsFloat32Convertible(info->dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(entry.name, ": dtype ", DTypeName(info->dtype),
                                                     " is not supported (F32, F16 or BF16)"));
    }
    sources.emplace_back(info, file);
    used.insert(entry.name);
  }
  WeightLoadStats local;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& [info, file] = sources[i];
    entries[i].data->resize(info->num_elements);
    RETURN_IF_ERROR(file->ReadFloat32(*info, entries[i].data->data()));
    ++local.num_loaded;
    local.bytes_loaded += info->num_elements * static_cast<int64_t>(sizeof(float));
  }
  for (const std::string& name : checkpoint.Names()) {
    if (used.count(name) == 0) local.ignored.push_back(name);
  }
  if (!local.ignored.empty()) {
    const size_t shown = std::min<size_t>(local.ignored.size(), 3);
    TS_LOG(INFO, "ignored {} checkpoint tensors that {} does not use (e.g. {})",
           local.ignored.size(), ArchitectureName(config.architecture),
           absl::StrJoin(local.ignored.begin(), local.ignored.begin() + shown, ", "));
  }
  if (stats != nullptr) *stats = std::move(local);
  return weights;
}

absl::StatusOr<ModelWeights> LoadWeights(const ModelConfig& config, const std::string& dir,
                                         WeightLoadStats* stats) {
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsCheckpoint> checkpoint,
                   SafetensorsCheckpoint::Open(dir));
  ASSIGN_OR_RETURN(ModelWeights weights, BindWeights(config, *checkpoint, stats),
                   _.WithPrefix(absl::StrCat(dir, ": ")));
  return weights;
}

absl::Status CheckWeightShapes(const ModelConfig& config, const ModelWeights& weights) {
  if (static_cast<int64_t>(weights.layers.size()) != config.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("weights have ", weights.layers.size(),
                                                   " layers, the config ", config.num_layers));
  }
  for (const ConstWeightEntry& e : ListWeights(config, weights)) {
    if (static_cast<int64_t>(e.data->size()) != e.num_elements()) {
      return absl::InvalidArgumentError(absl::StrCat(e.name, ": expected ", e.num_elements(),
                                                     " values for shape ", ShapeString(e.shape),
                                                     ", got ", e.data->size()));
    }
  }
  if (config.tie_word_embeddings && !weights.lm_head_weight.empty()) {
    return absl::InvalidArgumentError("lm_head.weight is set but the embeddings are tied");
  }
  return absl::OkStatus();
}

}  // namespace tokenselect::engine
