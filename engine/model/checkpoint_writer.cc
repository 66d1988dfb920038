#include "engine/model/checkpoint_writer.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "engine/model/safetensors.h"
#include "nlohmann/json.hpp"

namespace tokenselect::engine {
namespace {

using Json = nlohmann::ordered_json;

const char* TorchDtypeName(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    default:
      return "float32";
  }
}

// A single id as an int, several as a list, none as null (the config.json conventions).
Json TokenIdsJson(const std::vector<int64_t>& ids) {
  if (ids.empty()) return nullptr;
  if (ids.size() == 1) return ids[0];
  return ids;
}

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

// Writes `tensors` to dir as one file or as shards with an index, then the JSON files.
absl::Status WriteAll(const std::string& dir, const ModelConfig& config,
                      std::vector<TensorToWrite> tensors, const CheckpointOptions& options) {
  if (!IsFloat32Convertible(options.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint dtype must be F32, F16 or BF16, not ", DTypeName(options.dtype)));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));

  int64_t total_bytes = 0;
  std::vector<int64_t> bytes;
  for (TensorToWrite& t : tensors) {
    t.dtype = options.dtype;
    int64_t n = DTypeSize(options.dtype);
    for (int64_t d : t.shape) n *= d;
    bytes.push_back(n);
    total_bytes += n;
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (options.max_shard_bytes <= 0 || total_bytes <= options.max_shard_bytes) {
    RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", tensors, metadata));
    std::filesystem::remove(dir + "/model.safetensors.index.json", ec);
  } else {
    // Greedy shards in checkpoint order.
    std::vector<std::vector<TensorToWrite>> shards(1);
    int64_t shard_bytes = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!shards.back().empty() && shard_bytes + bytes[i] > options.max_shard_bytes) {
        shards.emplace_back();
        shard_bytes = 0;
      }
      shards.back().push_back(std::move(tensors[i]));
      shard_bytes += bytes[i];
    }
    Json weight_map = Json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      const std::string name =
          absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards.size());
      RETURN_IF_ERROR(WriteSafetensors(dir + "/" + name, shards[s], metadata));
      for (const TensorToWrite& t : shards[s]) weight_map[t.name] = name;
    }
    Json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    RETURN_IF_ERROR(WriteTextFile(dir + "/model.safetensors.index.json", index.dump(2) + "\n"));
    // A stale single file would otherwise shadow nothing but confuse readers.
    std::filesystem::remove(dir + "/model.safetensors", ec);
  }
  RETURN_IF_ERROR(
      WriteTextFile(dir + "/config.json", ModelConfigJson(config, options.dtype) + "\n"));
  return WriteTextFile(dir + "/generation_config.json", GenerationConfigJson(config) + "\n");
}

// A valid config whose biases config.json can express for its architecture.
absl::Status CheckWritable(const ModelConfig& c) {
  RETURN_IF_ERROR(ValidateModelConfig(c));
  bool ok = true;
  switch (c.architecture) {
    case Architecture::kLlama:  // attention_bias covers q/k/v and o together
      ok = c.qkv_bias == c.o_bias;
      break;
    case Architecture::kQwen2:
      ok = c.qkv_bias && !c.o_bias && !c.mlp_bias;
      break;
    case Architecture::kMistral:
      ok = !c.qkv_bias && !c.o_bias && !c.mlp_bias;
      break;
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("config.json cannot express these biases for ", ArchitectureName(c.architecture),
                   ": qkv_bias=", c.qkv_bias, " o_bias=", c.o_bias, " mlp_bias=", c.mlp_bias));
}

}  // namespace

std::string ModelConfigJson(const ModelConfig& c, DType dtype) {
  Json j;
  j["architectures"] = {ArchitectureName(c.architecture)};
  j["model_type"] = ModelTypeName(c.architecture);
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope.theta;
  switch (c.rope.scaling) {
    case kernels::RopeScaling::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case kernels::RopeScaling::kLinear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope.factor}};
      break;
    case kernels::RopeScaling::kLlama3:
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", c.rope.factor},
                           {"low_freq_factor", c.rope.low_freq_factor},
                           {"high_freq_factor", c.rope.high_freq_factor},
                           {"original_max_position_embeddings", c.rope.original_max_position}};
      break;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["bos_token_id"] = TokenIdsJson(c.bos_token_ids);
  j["eos_token_id"] = TokenIdsJson(c.eos_token_ids);
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  switch (c.architecture) {
    case Architecture::kLlama:
      j["attention_bias"] = c.qkv_bias;
      j["mlp_bias"] = c.mlp_bias;
      j["pretraining_tp"] = 1;
      break;
    case Architecture::kQwen2:
      j["use_sliding_window"] = c.sliding_window > 0;
      j["sliding_window"] = c.sliding_window > 0 ? Json(c.sliding_window) : Json(nullptr);
      j["max_window_layers"] = c.num_layers;
      break;
    case Architecture::kMistral:
      j["sliding_window"] = c.sliding_window > 0 ? Json(c.sliding_window) : Json(nullptr);
      break;
  }
  j["torch_dtype"] = TorchDtypeName(dtype);
  return j.dump(2);
}

std::string GenerationConfigJson(const ModelConfig& c) {
  Json j = Json::object();
  if (!c.bos_token_ids.empty()) j["bos_token_id"] = TokenIdsJson(c.bos_token_ids);
  if (!c.eos_token_ids.empty()) j["eos_token_id"] = TokenIdsJson(c.eos_token_ids);
  return j.dump(2);
}

absl::Status WriteCheckpoint(const std::string& dir, const ModelConfig& config,
                             const ModelWeights& weights, const CheckpointOptions& options) {
  RETURN_IF_ERROR(CheckWritable(config));
  RETURN_IF_ERROR(CheckWeightShapes(config, weights));
  std::vector<TensorToWrite> tensors;
  for (const ConstWeightEntry& e : ListWeights(config, weights)) {
    tensors.push_back({e.name, options.dtype, e.shape, e.data->data(), nullptr});
  }
  return WriteAll(dir, config, std::move(tensors), options);
}

absl::Status WriteDummyCheckpoint(const std::string& dir, const ModelConfig& config,
                                  const DummyWeightOptions& dummy,
                                  const CheckpointOptions& options) {
  RETURN_IF_ERROR(CheckWritable(config));
  std::vector<TensorToWrite> tensors;
  for (const WeightEntry& e : ListWeights(config, nullptr)) {
    TensorToWrite t{e.name, options.dtype, e.shape, nullptr, nullptr};
    t.fill = [name = e.name, kind = e.kind, fan_in = e.fan_in, dummy](int64_t begin, int64_t count,
                                                                      float* out) {
      FillDummyTensor(name, kind, fan_in, dummy, begin, count, out);
    };
    tensors.push_back(std::move(t));
  }
  return WriteAll(dir, config, std::move(tensors), options);
}

}  // namespace tokenselect::engine
