// Chat templates of the common model families, written in C++ instead of running the Jinja
// template of tokenizer_config.json. Each reproduces its family's official template for
// plain-text messages (no tools):
//   kLlama3: <|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}
//            <|eot_id|>... [+ assistant header when add_generation_prompt]
//   kChatMl (Qwen2): <|im_start|>{role}\n{content}<|im_end|>\n...; a default system message
//            comes first when the template has one and the conversation has none
//   kMistral: <s>[INST] {user} [/INST]{assistant}</s>[INST] ...; a system message is put
//            before the first user message, separated by "\n\n"
//   kLlama2: <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>...
// The output already holds the BOS token: encode it with add_special_tokens = false.
#ifndef TOKENSELECT_TOKENIZER_CHAT_TEMPLATE_H_
#define TOKENSELECT_TOKENIZER_CHAT_TEMPLATE_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tokenselect::tokenizer {

struct ChatMessage {
  std::string role;  // system, user, assistant (Llama-3 and ChatML also take tool / ipython)
  std::string content;
};

enum class ChatTemplateFamily { kNone, kLlama3, kChatMl, kMistral, kLlama2 };

// "llama3", "chatml" (also "qwen2"), "mistral", "llama2"; InvalidArgument otherwise.
absl::StatusOr<ChatTemplateFamily> ParseChatTemplateFamily(absl::string_view name);
// The canonical name ("none" for kNone).
absl::string_view ChatTemplateFamilyName(ChatTemplateFamily family);

// Detects the family from the Jinja text of tokenizer_config.json's chat_template, else from
// which marker tokens exist (`has_token`); kNone when nothing matches.
ChatTemplateFamily DetectChatTemplateFamily(
    absl::string_view template_text, const std::function<bool(absl::string_view)>& has_token);

// The default system prompt a ChatML template injects, read from its Jinja text ("" if none).
std::string DetectDefaultSystemPrompt(absl::string_view template_text);

struct ChatTemplateOptions {
  std::string bos_token;              // "<s>" / "<|begin_of_text|>"
  std::string eos_token;              // "</s>" (Mistral and Llama-2 close assistant turns)
  std::string default_system_prompt;  // ChatML only
};

// Renders `messages`. InvalidArgument for an empty conversation, a role the family does not
// know, a system message that is not first, or (Mistral, Llama-2) roles that do not alternate
// user/assistant; FailedPrecondition for kNone.
absl::StatusOr<std::string> RenderChat(ChatTemplateFamily family,
                                       const ChatTemplateOptions& options,
                                       absl::Span<const ChatMessage> messages,
                                       bool add_generation_prompt);

}  // namespace tokenselect::tokenizer

#endif  // TOKENSELECT_TOKENIZER_CHAT_TEMPLATE_H_
