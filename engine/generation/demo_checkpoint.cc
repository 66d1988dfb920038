#include "engine/generation/demo_checkpoint.h"

#include <fstream>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/model/checkpoint_writer.h"
#include "engine/model/model_presets.h"
#include "nlohmann/json.hpp"
#include "tokenizer/bpe_trainer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/training_corpus.h"

namespace tokenselect::engine {
namespace {

// Llama-3's special tokens; the trainer gives them the last ids in this order.
const std::vector<std::string>& SpecialTokens() {
  static const auto* tokens = new std::vector<std::string>{
      "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
      "<|eot_id|>"};
  return *tokens;
}

// A Llama-3-style Jinja chat template, written for this project (transformers'
// apply_chat_template runs it; our tokenizer detects the family from it and renders the same
// text in C++).
constexpr char kChatTemplate[] =
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + "
    "message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}";

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteDemoCheckpoint(const std::string& dir, const DemoCheckpointOptions& options) {
  tokenizer::BpeTrainerOptions trainer;
  trainer.bos_token = SpecialTokens()[0];
  ASSIGN_OR_RETURN(std::string tokenizer_json,
                   tokenizer::TrainByteLevelBpe(tokenizer::TrainingCorpus(), options.vocab_size,
                                                SpecialTokens(), trainer));
  const nlohmann::json config = {{"bos_token", SpecialTokens()[0]},
                                 {"eos_token", SpecialTokens()[4]},
                                 {"model_max_length", 131072},
                                 {"clean_up_tokenization_spaces", false},
                                 {"tokenizer_class", "PreTrainedTokenizerFast"},
                                 {"chat_template", kChatTemplate}};
  const std::string config_json = config.dump(2) + "\n";
  // The special tokens' ids come from loading exactly what is written.
  ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok,
                   tokenizer::Tokenizer::LoadFromStrings(tokenizer_json, config_json));

  PresetOptions preset;
  preset.vocab_size = tok->vocab_size();
  preset.bos_token_id = *tok->TokenToId(SpecialTokens()[0]);
  preset.eos_token_id = *tok->TokenToId(SpecialTokens()[4]);
  preset.seed = options.weight_seed;
  preset.init = options.init;
  CheckpointOptions checkpoint;
  checkpoint.dtype = options.dtype;
  RETURN_IF_ERROR(WritePresetCheckpoint(dir, options.preset, preset, checkpoint));
  RETURN_IF_ERROR(WriteFile(dir + "/tokenizer.json", tokenizer_json));
  return WriteFile(dir + "/tokenizer_config.json", config_json);
}

}  // namespace tokenselect::engine
