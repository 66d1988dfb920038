#include "tokenizer/chat_template.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tokenselect::tokenizer {
namespace {

absl::Status BadRole(size_t index, absl::string_view role, absl::string_view family) {
  return absl::InvalidArgumentError(absl::StrCat("messages[", index, "].role '", role,
                                                 "' is not supported by the ", family,
                                                 " chat template"));
}

absl::StatusOr<std::string> RenderLlama3(const ChatTemplateOptions& options,
                                         absl::Span<const ChatMessage> messages,
                                         bool add_generation_prompt) {
  std::string out = options.bos_token;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool" &&
        m.role != "ipython") {
      return BadRole(i, m.role, "llama3");
    }
    if (m.role == "system" && i != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "]: a system message must come first"));
    }
    absl::StrAppend(&out, "<|start_header_id|>", m.role, "<|end_header_id|>\n\n",
                    absl::StripAsciiWhitespace(m.content), "<|eot_id|>");
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

absl::StatusOr<std::string> RenderChatMl(const ChatTemplateOptions& options,
                                         absl::Span<const ChatMessage> messages,
                                         bool add_generation_prompt) {
  std::string out;
  if (messages[0].role != "system" && !options.default_system_prompt.empty()) {
    absl::StrAppend(&out, "<|im_start|>system\n", options.default_system_prompt, "<|im_end|>\n");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
      return BadRole(i, m.role, "chatml");
    }
    if (m.role == "system" && i != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "]: a system message must come first"));
    }
    absl::StrAppend(&out, "<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// Mistral and Llama-2: an optional leading system message, then user/assistant alternating.
absl::StatusOr<std::string> RenderInst(ChatTemplateFamily family,
                                       const ChatTemplateOptions& options,
                                       absl::Span<const ChatMessage> messages) {
  absl::string_view name = ChatTemplateFamilyName(family);
  std::string system;
  size_t first = 0;
  if (messages[0].role == "system") {
    system = messages[0].content;
    first = 1;
  }
  std::string out;
  if (family == ChatTemplateFamily::kMistral) out = options.bos_token;
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "user" && m.role != "assistant") return BadRole(i, m.role, name);
    bool expect_user = (i - first) % 2 == 0;
    if ((m.role == "user") != expect_user) {
      return absl::InvalidArgumentError(absl::StrCat(
          "messages[", i, "].role '", m.role, "': the ", name,
          " chat template needs user and assistant messages to alternate, starting with user"));
    }
    if (family == ChatTemplateFamily::kMistral) {
      if (m.role == "user") {
        std::string content = m.content;
        if (i == first && !system.empty()) content = absl::StrCat(system, "\n\n", m.content);
        absl::StrAppend(&out, "[INST] ", content, " [/INST]");
      } else {
        absl::StrAppend(&out, m.content, options.eos_token);
      }
    } else {  // kLlama2
      absl::string_view content = absl::StripAsciiWhitespace(m.content);
      if (m.role == "user") {
        out += options.bos_token;
        out += "[INST] ";
        if (i == first && !system.empty()) {
          absl::StrAppend(&out, "<<SYS>>\n", absl::StripAsciiWhitespace(system), "\n<</SYS>>\n\n");
        }
        absl::StrAppend(&out, content, " [/INST]");
      } else {
        absl::StrAppend(&out, " ", content, " ", options.eos_token);
      }
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<ChatTemplateFamily> ParseChatTemplateFamily(absl::string_view name) {
  std::string lower = absl::AsciiStrToLower(name);
  if (lower == "llama3" || lower == "llama-3") return ChatTemplateFamily::kLlama3;
  if (lower == "chatml" || lower == "qwen2" || lower == "qwen") return ChatTemplateFamily::kChatMl;
  if (lower == "mistral") return ChatTemplateFamily::kMistral;
  if (lower == "llama2" || lower == "llama-2") return ChatTemplateFamily::kLlama2;
  return absl::InvalidArgumentError(absl::StrCat(
      "chat template family '", name, "' is unknown (use llama3, chatml, mistral or llama2)"));
}

absl::string_view ChatTemplateFamilyName(ChatTemplateFamily family) {
  switch (family) {
    case ChatTemplateFamily::kNone:
      return "none";
    case ChatTemplateFamily::kLlama3:
      return "llama3";
    case ChatTemplateFamily::kChatMl:
      return "chatml";
    case ChatTemplateFamily::kMistral:
      return "mistral";
    case ChatTemplateFamily::kLlama2:
      return "llama2";
  }
  return "none";
}

ChatTemplateFamily DetectChatTemplateFamily(
    absl::string_view template_text, const std::function<bool(absl::string_view)>& has_token) {
  if (absl::StrContains(template_text, "<|start_header_id|>")) return ChatTemplateFamily::kLlama3;
  if (absl::StrContains(template_text, "<|im_start|>")) return ChatTemplateFamily::kChatMl;
  if (absl::StrContains(template_text, "<<SYS>>")) return ChatTemplateFamily::kLlama2;
  if (absl::StrContains(template_text, "[INST]")) return ChatTemplateFamily::kMistral;
  if (!template_text.empty()) return ChatTemplateFamily::kNone;
  if (has_token("<|start_header_id|>")) return ChatTemplateFamily::kLlama3;
  if (has_token("<|im_start|>")) return ChatTemplateFamily::kChatMl;
  if (has_token("[INST]")) return ChatTemplateFamily::kMistral;
  return ChatTemplateFamily::kNone;
}

std::string DetectDefaultSystemPrompt(absl::string_view template_text) {
  // Qwen2 templates write it as a literal after "<|im_start|>system\n" (escaped in Jinja).
  for (absl::string_view marker : {"<|im_start|>system\\n", "<|im_start|>system\n"}) {
    size_t at = template_text.find(marker);
    while (at != absl::string_view::npos) {
      size_t begin = at + marker.size();
      size_t end = template_text.find("<|im_end|>", begin);
      if (end == absl::string_view::npos) break;
      absl::string_view prompt = template_text.substr(begin, end - begin);
      // Skip the branch that prints the user's own system message.
      if (!absl::StrContains(prompt, "{") && !absl::StrContains(prompt, "'") &&
          !absl::StrContains(prompt, "\"")) {
        return std::string(prompt);
      }
      at = template_text.find(marker, end);
    }
  }
  return "";
}

absl::StatusOr<std::string> RenderChat(ChatTemplateFamily family,
                                       const ChatTemplateOptions& options,
                                       absl::Span<const ChatMessage> messages,
                                       bool add_generation_prompt) {
  if (family == ChatTemplateFamily::kNone) {
    return absl::FailedPreconditionError(
        "no chat template family: the tokenizer has no recognisable chat template; name one");
  }
  if (messages.empty()) return absl::InvalidArgumentError("messages must not be empty");
  switch (family) {
    case ChatTemplateFamily::kLlama3:
      return RenderLlama3(options, messages, add_generation_prompt);
    case ChatTemplateFamily::kChatMl:
      return RenderChatMl(options, messages, add_generation_prompt);
    case ChatTemplateFamily::kMistral:
    case ChatTemplateFamily::kLlama2:
      return RenderInst(family, options, messages);
    case ChatTemplateFamily::kNone:
      break;
  }
  return absl::FailedPreconditionError("no chat template family");
}

}  // namespace tokenselect::tokenizer
