#include "tokenizer/chat_template.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tokenselect::tokenizer {
namespace {

using ::testing::HasSubstr;

const std::vector<ChatMessage> kConversation = {
    {"system", "Be brief."}, {"user", " Hi there \n"}, {"assistant", "Hello!"}, {"user", "Bye"}};

ChatTemplateOptions Options() {
  ChatTemplateOptions options;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  return options;
}

TEST(ChatTemplateTest, Llama3) {
  ChatTemplateOptions options;
  options.bos_token = "<|begin_of_text|>";
  auto text = RenderChat(ChatTemplateFamily::kLlama3, options, kConversation, true);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  auto no_prompt = RenderChat(ChatTemplateFamily::kLlama3, options, {{"user", "x"}}, false);
  EXPECT_EQ(*no_prompt, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>");
}

TEST(ChatTemplateTest, ChatMlWithAndWithoutDefaultSystemPrompt) {
  ChatTemplateOptions options;
  auto text = RenderChat(ChatTemplateFamily::kChatMl, options, kConversation, true);
  EXPECT_EQ(*text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi there \n<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\n");
  options.default_system_prompt = "You are a helpful assistant.";
  auto with_default = RenderChat(ChatTemplateFamily::kChatMl, options, {{"user", "Hi"}}, false);
  EXPECT_EQ(*with_default,
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplateTest, MistralPutsTheSystemPromptInTheFirstTurn) {
  auto text = RenderChat(ChatTemplateFamily::kMistral, Options(), kConversation, true);
  EXPECT_EQ(*text, "<s>[INST] Be brief.\n\n Hi there \n [/INST]Hello!</s>[INST] Bye [/INST]");
}

TEST(ChatTemplateTest, Llama2) {
  auto text = RenderChat(ChatTemplateFamily::kLlama2, Options(), kConversation, true);
  EXPECT_EQ(*text,
            "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi there [/INST] Hello! </s>"
            "<s>[INST] Bye [/INST]");
}

TEST(ChatTemplateTest, RejectsBadConversations) {
  auto bad_role = RenderChat(ChatTemplateFamily::kLlama3, Options(), {{"robot", "x"}}, true);
  EXPECT_EQ(bad_role.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_role.status().message(),
            "messages[0].role 'robot' is not supported by the llama3 chat template");
  auto late_system =
      RenderChat(ChatTemplateFamily::kChatMl, Options(), {{"user", "x"}, {"system", "y"}}, true);
  EXPECT_THAT(late_system.status().message(), HasSubstr("a system message must come first"));
  auto not_alternating =
      RenderChat(ChatTemplateFamily::kMistral, Options(), {{"user", "x"}, {"user", "y"}}, true);
  EXPECT_THAT(not_alternating.status().message(), HasSubstr("to alternate"));
  auto tool_in_mistral = RenderChat(ChatTemplateFamily::kMistral, Options(), {{"tool", "x"}}, true);
  EXPECT_THAT(tool_in_mistral.status().message(), HasSubstr("'tool' is not supported"));
  auto empty = RenderChat(ChatTemplateFamily::kChatMl, Options(), {}, true);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  auto none = RenderChat(ChatTemplateFamily::kNone, Options(), {{"user", "x"}}, true);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ChatTemplateTest, DetectionAndNames) {
  auto no_tokens = [](absl::string_view) { return false; };
  EXPECT_EQ(DetectChatTemplateFamily(
                "{% for m in messages %}<|start_header_id|>{{ m.role }}{% endfor %}", no_tokens),
            ChatTemplateFamily::kLlama3);
  EXPECT_EQ(DetectChatTemplateFamily("{{'<|im_start|>' + m.role}}", no_tokens),
            ChatTemplateFamily::kChatMl);
  EXPECT_EQ(DetectChatTemplateFamily("{{ '[INST] ' + content + ' [/INST]' }}", no_tokens),
            ChatTemplateFamily::kMistral);
  EXPECT_EQ(DetectChatTemplateFamily("[INST] <<SYS>>\\n", no_tokens), ChatTemplateFamily::kLlama2);
  EXPECT_EQ(DetectChatTemplateFamily("{{ something else }}", no_tokens), ChatTemplateFamily::kNone);
  EXPECT_EQ(DetectChatTemplateFamily("", [](absl::string_view t) { return t == "<|im_start|>"; }),
            ChatTemplateFamily::kChatMl);
  EXPECT_EQ(DetectDefaultSystemPrompt(
                "{% if messages[0]['role'] == 'system' %}{{ '<|im_start|>system\\n' + "
                "messages[0]['content'] + '<|im_end|>\\n' }}{% else %}"
                "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"),
            "You are a helpful assistant.");
  EXPECT_EQ(DetectDefaultSystemPrompt("<|im_start|>{{ role }}"), "");
  for (auto family : {ChatTemplateFamily::kLlama3, ChatTemplateFamily::kChatMl,
                      ChatTemplateFamily::kMistral, ChatTemplateFamily::kLlama2}) {
    EXPECT_EQ(*ParseChatTemplateFamily(ChatTemplateFamilyName(family)), family);
  }
  EXPECT_EQ(*ParseChatTemplateFamily("Qwen2"), ChatTemplateFamily::kChatMl);
  EXPECT_THAT(ParseChatTemplateFamily("jinja").status().message(), HasSubstr("'jinja' is unknown"));
}

}  // namespace
}  // namespace tokenselect::tokenizer
