#include "router/served_model.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace tokenselect::router {
namespace {

absl::StatusOr<int64_t> IntField(const nlohmann::json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || !it->is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: '", name, "' is missing or not an integer"));
  }
  return it->get<int64_t>();
}

}  // namespace

absl::StatusOr<ModelShape> ParseModelShape(absl::string_view config_json) {
  nlohmann::json j = nlohmann::json::parse(config_json.begin(), config_json.end(), nullptr,
                                           /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("config.json: not a JSON object");
  }
  ModelShape shape;
  auto arch = j.find("architectures");
  if (arch != j.end() && arch->is_array() && !arch->empty() && (*arch)[0].is_string()) {
    shape.architecture = (*arch)[0].get<std::string>();
  }
  ASSIGN_OR_RETURN(shape.vocab_size, IntField(j, "vocab_size"));
  ASSIGN_OR_RETURN(shape.num_layers, IntField(j, "num_hidden_layers"));
  ASSIGN_OR_RETURN(shape.num_heads, IntField(j, "num_attention_heads"));
  shape.num_kv_heads = shape.num_heads;
  if (j.contains("num_key_value_heads")) {
    ASSIGN_OR_RETURN(shape.num_kv_heads, IntField(j, "num_key_value_heads"));
  }
  if (j.contains("head_dim") && j["head_dim"].is_number_integer()) {
    shape.head_dim = j["head_dim"].get<int64_t>();
  } else {
    ASSIGN_OR_RETURN(int64_t hidden, IntField(j, "hidden_size"));
    if (shape.num_heads <= 0) {
      return absl::InvalidArgumentError("config.json: 'num_attention_heads' must be > 0");
    }
    shape.head_dim = hidden / shape.num_heads;
  }
  if (j.contains("max_position_embeddings")) {
    ASSIGN_OR_RETURN(shape.max_position_embeddings, IntField(j, "max_position_embeddings"));
  }
  auto eos = j.find("eos_token_id");
  if (eos != j.end()) {
    if (eos->is_number_integer()) {
      shape.eos_token_ids.push_back(eos->get<int32_t>());
    } else if (eos->is_array()) {
      for (const auto& e : *eos) {
        if (e.is_number_integer()) shape.eos_token_ids.push_back(e.get<int32_t>());
      }
    }
  }
  return shape;
}

int64_t ServedModel::vocab_size() const {
  return std::max<int64_t>(shape.vocab_size, tokenizer ? tokenizer->vocab_size() : 0);
}

std::vector<int32_t> ServedModel::EosIds() const {
  std::vector<int32_t> ids = shape.eos_token_ids;
  if (tokenizer) {
    for (int32_t id : tokenizer->eos_ids()) {
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
  }
  return ids;
}

absl::StatusOr<ServedModel> LoadServedModel(const std::string& dir, int64_t max_prompt_tokens,
                                            const std::string& name) {
  const std::string config_path = dir + "/config.json";
  std::ifstream in(config_path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", config_path));
  std::ostringstream text;
  text << in.rdbuf();
  ServedModel model;
  ASSIGN_OR_RETURN(model.shape, ParseModelShape(text.str()));
  ASSIGN_OR_RETURN(model.tokenizer, tokenizer::Tokenizer::LoadFromDirectory(dir));
  model.max_prompt_tokens =
      max_prompt_tokens > 0 ? max_prompt_tokens : model.shape.max_position_embeddings;
  if (model.max_prompt_tokens <= 0) {
    return absl::InvalidArgumentError(
        "config.json has no max_position_embeddings: give --max_prompt_tokens");
  }
  model.name = name;
  if (model.name.empty()) {
    std::string trimmed = dir;
    while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
    const size_t slash = trimmed.find_last_of('/');
    model.name = slash == std::string::npos ? trimmed : trimmed.substr(slash + 1);
  }
  return model;
}

}  // namespace tokenselect::router
