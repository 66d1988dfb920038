// What the router knows of the served model: its tokenizer (tokenizer.json +
// tokenizer_config.json) and the shape fields of config.json. The router reads nothing else from
// the checkpoint directory (no weights), so it stays small and never links the engine.
#ifndef TOKENSELECT_ROUTER_SERVED_MODEL_H_
#define TOKENSELECT_ROUTER_SERVED_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tokenizer/tokenizer.h"

namespace tokenselect::router {

struct ModelShape {
  std::string architecture;  // config.json architectures[0]
  int64_t vocab_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  std::vector<int32_t> eos_token_ids;  // config.json eos_token_id (int or list)
};

// Parses config.json text. InvalidArgument naming the field when a required one
// (vocab_size, num_hidden_layers, num_attention_heads, hidden_size unless head_dim) is missing.
absl::StatusOr<ModelShape> ParseModelShape(absl::string_view config_json);

struct ServedModel {
  std::string name;  // the directory name unless configured
  ModelShape shape;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  // The longest accepted prompt: --max_prompt_tokens when > 0, else max_position_embeddings.
  int64_t max_prompt_tokens = 0;
  // The vocabulary the prompt ids must fall in: max(config vocab, tokenizer vocab).
  int64_t vocab_size() const;
  // The end-of-sequence ids of config.json and the tokenizer, without duplicates.
  std::vector<int32_t> EosIds() const;
};

// Loads config.json, tokenizer.json and tokenizer_config.json from `dir`. Errors name the file.
absl::StatusOr<ServedModel> LoadServedModel(const std::string& dir, int64_t max_prompt_tokens,
                                            const std::string& name = "");

}  // namespace tokenselect::router

#endif  // TOKENSELECT_ROUTER_SERVED_MODEL_H_
