#include "engine/model/model_config.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace tokenselect::engine {
namespace {

using Json = nlohmann::json;

absl::Status FieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", field, " ", what));
}

// A JSON value that is absent or null counts as "not given" everywhere (HF writes nulls).
const Json* Find(const Json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::optional<int64_t>> OptionalInt(const Json& object, const char* key) {
  const Json* value = Find(object, key);
  if (value == nullptr) return std::optional<int64_t>();
  if (value->is_number_unsigned()) {
    const uint64_t u = value->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return FieldError(key, absl::StrCat("(", u, ") is too large"));
    }
    return std::optional<int64_t>(static_cast<int64_t>(u));
  }
  if (value->is_number_integer()) return std::optional<int64_t>(value->get<int64_t>());
  return FieldError(key, absl::StrCat("must be an integer, got ", value->dump()));
}

absl::StatusOr<int64_t> RequiredInt(const Json& object, const char* key) {
  ASSIGN_OR_RETURN(std::optional<int64_t> value, OptionalInt(object, key));
  if (!value.has_value()) return FieldError(key, "is missing");
  return *value;
}

absl::StatusOr<double> Double(const Json& object, const char* key, double default_value,
                              absl::string_view prefix = "") {
  const Json* value = Find(object, key);
  if (value == nullptr) return default_value;
  if (!value->is_number()) {
    return FieldError(absl::StrCat(prefix, key),
                      absl::StrCat("must be a number, got ", value->dump()));
  }
  const double d = value->get<double>();
  if (!std::isfinite(d)) return FieldError(absl::StrCat(prefix, key), "must be finite");
  return d;
}

absl::StatusOr<bool> Bool(const Json& object, const char* key, bool default_value) {
  const Json* value = Find(object, key);
  if (value == nullptr) return default_value;
  if (!value->is_boolean()) {
    return FieldError(key, absl::StrCat("must be true or false, got ", value->dump()));
  }
  return value->get<bool>();
}

// An int or a list of ints (eos_token_id may be either).
absl::StatusOr<std::vector<int64_t>> TokenIds(const Json& object, const char* key) {
  const Json* value = Find(object, key);
  std::vector<int64_t> ids;
  if (value == nullptr) return ids;
  const Json list = value->is_array() ? *value : Json::array({*value});
  for (const Json& item : list) {
    if (!item.is_number_integer() || item.get<int64_t>() < 0) {
      return FieldError(key,
                        absl::StrCat("must be a token id or a list of them, got ", value->dump()));
    }
    ids.push_back(item.get<int64_t>());
  }
  return ids;
}

absl::StatusOr<Architecture> ParseArchitecture(const Json& root) {
  std::string name;
  if (const Json* archs = Find(root, "architectures")) {
    if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
      return FieldError("architectures",
                        absl::StrCat("must be a non-empty list of names, got ", archs->dump()));
    }
    name = (*archs)[0].get<std::string>();
  } else if (const Json* type = Find(root, "model_type"); type && type->is_string()) {
    // Some configs (e.g. written by other tools) carry only model_type.
    const std::string model_type = type->get<std::string>();
    for (Architecture arch : {Architecture::kLlama, Architecture::kQwen2, Architecture::kMistral}) {
      if (model_type == ModelTypeName(arch)) return arch;
    }
    return absl::UnimplementedError(absl::StrCat("config.json: model_type '", model_type,
                                                 "' is not supported (supported: llama, qwen2, "
                                                 "mistral)"));
  } else {
    return FieldError("architectures", "is missing (and so is model_type)");
  }
  for (Architecture arch : {Architecture::kLlama, Architecture::kQwen2, Architecture::kMistral}) {
    if (name == ArchitectureName(arch)) return arch;
  }
  return absl::UnimplementedError(absl::StrCat(
      "config.json: architecture ", name,
      " is not supported (supported: LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM)"));
}

// RoPE from rope_parameters (transformers 5) or rope_theta + rope_scaling (transformers 4).
absl::Status ParseRope(const Json& root, kernels::RopeParams* rope) {
  const Json* scaling = Find(root, "rope_parameters");
  std::string field = "rope_parameters";
  if (scaling == nullptr) {
    scaling = Find(root, "rope_scaling");
    field = "rope_scaling";
  }
  if (scaling != nullptr && !scaling->is_object()) {
    return FieldError(field, absl::StrCat("must be an object, got ", scaling->dump()));
  }
  ASSIGN_OR_RETURN(rope->theta, Double(root, "rope_theta", 10000.0));
  if (scaling != nullptr && Find(*scaling, "rope_theta") != nullptr) {
    ASSIGN_OR_RETURN(rope->theta, Double(*scaling, "rope_theta", 10000.0, field + "."));
  }
  if (!(rope->theta > 0)) return FieldError("rope_theta", "must be positive");
  if (const Json* partial = Find(root, "partial_rotary_factor");
      partial != nullptr && !(partial->is_number() && partial->get<double>() == 1.0)) {
    return absl::UnimplementedError(absl::StrCat("config.json: partial_rotary_factor ",
                                                 partial->dump(), " is not supported (only 1.0)"));
  }
  rope->scaling = kernels::RopeScaling::kNone;
  if (scaling == nullptr) return absl::OkStatus();

  std::string type = "default";
  const Json* type_value = Find(*scaling, "rope_type");
  if (type_value == nullptr) type_value = Find(*scaling, "type");
  if (type_value != nullptr) {
    if (!type_value->is_string()) {
      return FieldError(field + ".rope_type",
                        absl::StrCat("must be a string, got ", type_value->dump()));
    }
    type = type_value->get<std::string>();
  }
  const std::string prefix = field + ".";
  auto required_positive = [&](const char* key, double* out) -> absl::Status {
    if (Find(*scaling, key) == nullptr) {
      return FieldError(prefix + key, absl::StrCat("is missing (rope type ", type, ")"));
    }
    ASSIGN_OR_RETURN(*out, Double(*scaling, key, 0.0, prefix));
    if (!(*out > 0)) return FieldError(prefix + key, "must be positive");
    return absl::OkStatus();
  };
  if (type == "default") return absl::OkStatus();
  if (type == "linear") {
    rope->scaling = kernels::RopeScaling::kLinear;
    return required_positive("factor", &rope->factor);
  }
  if (type == "llama3") {
    rope->scaling = kernels::RopeScaling::kLlama3;
    RETURN_IF_ERROR(required_positive("factor", &rope->factor));
    RETURN_IF_ERROR(required_positive("low_freq_factor", &rope->low_freq_factor));
    RETURN_IF_ERROR(required_positive("high_freq_factor", &rope->high_freq_factor));
    if (!(rope->high_freq_factor > rope->low_freq_factor)) {
      return FieldError(
          prefix + "high_freq_factor",
          absl::StrCat("(", rope->high_freq_factor, ") must be greater than low_freq_factor (",
                       rope->low_freq_factor, ")"));
    }
    ASSIGN_OR_RETURN(std::optional<int64_t> original,
                     OptionalInt(*scaling, "original_max_position_embeddings"));
    if (!original.has_value() || *original <= 0) {
      return FieldError(prefix + "original_max_position_embeddings",
                        "must be a positive integer (rope type llama3)");
    }
    rope->original_max_position = *original;
    return absl::OkStatus();
  }
  return absl::UnimplementedError(absl::StrCat("config.json: ", field, " type '", type,
                                               "' is not supported (supported: default, "
                                               "linear, llama3)"));
}

absl::StatusOr<ModelConfig> ParseRoot(const Json& root) {
  if (!root.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  ModelConfig c;
  ASSIGN_OR_RETURN(c.architecture, ParseArchitecture(root));
  ASSIGN_OR_RETURN(c.hidden_size, RequiredInt(root, "hidden_size"));
  ASSIGN_OR_RETURN(c.intermediate_size, RequiredInt(root, "intermediate_size"));
  ASSIGN_OR_RETURN(c.num_layers, RequiredInt(root, "num_hidden_layers"));
  ASSIGN_OR_RETURN(c.num_heads, RequiredInt(root, "num_attention_heads"));
  ASSIGN_OR_RETURN(c.vocab_size, RequiredInt(root, "vocab_size"));
  // Check these before deriving anything from them.
  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"hidden_size", c.hidden_size},
                                   {"intermediate_size", c.intermediate_size},
                                   {"num_hidden_layers", c.num_layers},
                                   {"num_attention_heads", c.num_heads},
                                   {"vocab_size", c.vocab_size}}) {
    if (value <= 0) return FieldError(key, absl::StrCat("(", value, ") must be positive"));
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> kv_heads, OptionalInt(root, "num_key_value_heads"));
  c.num_kv_heads = kv_heads.value_or(c.num_heads);
  ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, OptionalInt(root, "head_dim"));
  if (head_dim.has_value()) {
    c.head_dim = *head_dim;
  } else {
    if (c.hidden_size % c.num_heads != 0) {
      return FieldError("hidden_size", absl::StrCat("(", c.hidden_size,
                                                    ") must be divisible by num_attention_heads (",
                                                    c.num_heads, ") when head_dim is not given"));
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  ASSIGN_OR_RETURN(c.rms_norm_eps, Double(root, "rms_norm_eps", 1e-6));
  ASSIGN_OR_RETURN(std::optional<int64_t> max_pos, OptionalInt(root, "max_position_embeddings"));
  c.max_position_embeddings = max_pos.value_or(2048);
  ASSIGN_OR_RETURN(c.tie_word_embeddings, Bool(root, "tie_word_embeddings", false));

  if (const Json* act = Find(root, "hidden_act");
      act != nullptr && !(act->is_string() && (*act == "silu" || *act == "swish"))) {
    return absl::UnimplementedError(
        absl::StrCat("config.json: hidden_act ", act->dump(), " is not supported (only silu)"));
  }
  switch (c.architecture) {
    case Architecture::kLlama: {
      ASSIGN_OR_RETURN(const bool attention_bias, Bool(root, "attention_bias", false));
      ASSIGN_OR_RETURN(c.mlp_bias, Bool(root, "mlp_bias", false));
      c.qkv_bias = c.o_bias = attention_bias;
      break;
    }
    case Architecture::kQwen2: {
      c.qkv_bias = true;
      ASSIGN_OR_RETURN(const bool use_sliding, Bool(root, "use_sliding_window", false));
      if (use_sliding) {
        ASSIGN_OR_RETURN(std::optional<int64_t> window, OptionalInt(root, "sliding_window"));
        c.sliding_window = window.value_or(0);
      }
      break;
    }
    case Architecture::kMistral: {
      ASSIGN_OR_RETURN(std::optional<int64_t> window, OptionalInt(root, "sliding_window"));
      c.sliding_window = window.value_or(0);
      break;
    }
  }
  if (c.sliding_window < 0) return FieldError("sliding_window", "must not be negative");
  RETURN_IF_ERROR(ParseRope(root, &c.rope));
  c.rope.head_dim = c.head_dim;
  ASSIGN_OR_RETURN(c.bos_token_ids, TokenIds(root, "bos_token_id"));
  ASSIGN_OR_RETURN(c.eos_token_ids, TokenIds(root, "eos_token_id"));
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (const Json* dtype = Find(root, key)) {
      if (!dtype->is_string()) {
        return FieldError(key, absl::StrCat("must be a string, got ", dtype->dump()));
      }
      c.torch_dtype = dtype->get<std::string>();
      break;
    }
  }
  RETURN_IF_ERROR(ValidateModelConfig(c));
  return c;
}

}  // namespace

const char* ArchitectureName(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "LlamaForCausalLM";
    case Architecture::kQwen2:
      return "Qwen2ForCausalLM";
    case Architecture::kMistral:
      return "MistralForCausalLM";
  }
  return "?";
}

const char* ModelTypeName(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "llama";
    case Architecture::kQwen2:
      return "qwen2";
    case Architecture::kMistral:
      return "mistral";
  }
  return "?";
}

absl::Status ValidateModelConfig(const ModelConfig& c) {
  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"hidden_size", c.hidden_size},
                                   {"intermediate_size", c.intermediate_size},
                                   {"num_hidden_layers", c.num_layers},
                                   {"num_attention_heads", c.num_heads},
                                   {"num_key_value_heads", c.num_kv_heads},
                                   {"head_dim", c.head_dim},
                                   {"vocab_size", c.vocab_size},
                                   {"max_position_embeddings", c.max_position_embeddings}}) {
    if (value <= 0) return FieldError(key, absl::StrCat("(", value, ") must be positive"));
  }
  // Keep every tensor's element count (and int32 token ids) comfortably in range.
  constexpr int64_t kMaxDim = int64_t{1} << 24;
  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"hidden_size", c.hidden_size},
                                   {"intermediate_size", c.intermediate_size},
                                   {"head_dim", c.head_dim},
                                   {"vocab_size", c.vocab_size}}) {
    if (value > kMaxDim) {
      return FieldError(key, absl::StrCat("(", value, ") is larger than ", kMaxDim));
    }
  }
  if (c.num_heads > 4096 || c.num_layers > 4096) {
    return FieldError(c.num_heads > 4096 ? "num_attention_heads" : "num_hidden_layers",
                      "is larger than 4096");
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return FieldError(
        "num_key_value_heads",
        absl::StrCat("(", c.num_kv_heads, ") must divide num_attention_heads (", c.num_heads, ")"));
  }
  if (c.head_dim % 2 != 0) {
    return FieldError("head_dim", absl::StrCat("(", c.head_dim, ") must be even for RoPE"));
  }
  if (!(c.rms_norm_eps > 0)) {
    return FieldError("rms_norm_eps", absl::StrCat("(", c.rms_norm_eps, ") must be positive"));
  }
  if (c.rope.head_dim != c.head_dim) {
    return FieldError("head_dim", "does not match the RoPE head_dim");
  }
  for (const auto& [key, ids] :
       {std::pair<const char*, const std::vector<int64_t>*>{"bos_token_id", &c.bos_token_ids},
        {"eos_token_id", &c.eos_token_ids}}) {
    for (int64_t id : *ids) {
      if (id >= c.vocab_size) {
        return FieldError(key,
                          absl::StrCat("(", id, ") must be below vocab_size (", c.vocab_size, ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text) {
  Json root = Json::parse(json_text.begin(), json_text.end(), /*cb=*/nullptr,
                          /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    // Parse again with exceptions to get the position of the error; nothing escapes this file.
    try {
      const Json reparsed = Json::parse(json_text.begin(), json_text.end());
      (void)reparsed;
    } catch (const Json::parse_error& e) {
      return absl::InvalidArgumentError(absl::StrCat("config.json: invalid JSON: ", e.what()));
    }
    return absl::InvalidArgumentError("config.json: invalid JSON");
  }
  return ParseRoot(root);
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(buffer.str()),
                   _.WithPrefix(absl::StrCat(dir, ": ")));
  return config;
}

kernels::RopeParams ToRopeParams(const ModelConfig& config) {
  kernels::RopeParams params = config.rope;
  params.head_dim = config.head_dim;
  return params;
}

}  // namespace tokenselect::engine
