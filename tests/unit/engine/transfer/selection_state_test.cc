// The selection state carried by the KV stream's final record (selection_state.h): what the
// sender collects, what the receiver accepts and rejects, and that a restored provider holds
// exactly the sender's state.
#include "engine/transfer/selection_state.h"

#include <memory>
#include <string>
#include <vector>

#include "engine/selection/selection_attention.h"
#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

constexpr int64_t kLayers = 3;
constexpr int64_t kPrompt = 300;

std::unique_ptr<SelectionAttention> Attention(SelectionPolicyKind policy) {
  SelectionOptions o;
  o.policy = policy;
  auto attention = SelectionAttention::Create(o, kLayers);
  EXPECT_TRUE(attention.ok()) << attention.status();
  return std::move(attention).value();
}

// Fills layer `l` with received attention over `n` tokens, a span index covering them and a
// cascade cache holding a few of them, all different per layer.
void Fill(SelectionLayerState* state, int64_t l, int64_t n) {
  for (int64_t t = 0; t < n; ++t)
    state->received.push_back(0.125f * static_cast<float>((t + l) % 9));
  DetectedSpan a;
  a.x = 0, a.y = 99, a.score = 2.5 + static_cast<double>(l), a.index_tokens = {4, 50};
  DetectedSpan b;
  b.x = 100, b.y = static_cast<int32_t>(n - 1), b.score = -1, b.gap = true, b.index_tokens = {120};
  state->spans.AppendChunk(0, n, {a, b});
  state->cascade.Configure({4, 4});
  for (int32_t t = 0; t < 12; ++t) state->cascade.Push(t * 10 + static_cast<int32_t>(l), 0.5f * t);
  state->cascade.next_token = n;
}

TEST(SelectionStateTest, StatelessPolicyCarriesNothing) {
  for (SelectionPolicyKind kind : {SelectionPolicyKind::kTokenSelect, SelectionPolicyKind::kDense,
                                   SelectionPolicyKind::kQuest}) {
    auto attention = Attention(kind);
    EXPECT_TRUE(CollectSelectionStates(*attention, kLayers).empty()) << PolicyName(kind);
  }
  auto decoded = DecodeSelectionStates({}, kLayers, kPrompt);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(decoded->empty());
  auto attention = Attention(SelectionPolicyKind::kInfLlm);
  ASSERT_TRUE(RestoreSelectionStates({}, kLayers, attention.get()).ok());
  EXPECT_TRUE(attention->layer_state(0).received.empty());
}

TEST(SelectionStateTest, OneEntryPerLayerInLayerOrderAndARoundTrip) {
  auto sender = Attention(SelectionPolicyKind::kTokenSelectSpan);
  // Layer 1 stays empty: it is still sent, so that entry l is always layer l.
  Fill(sender->mutable_layer_state(0), 0, kPrompt);
  Fill(sender->mutable_layer_state(2), 2, kPrompt - 20);
  const std::vector<std::string> states = CollectSelectionStates(*sender, kLayers);
  ASSERT_EQ(states.size(), static_cast<size_t>(kLayers));
  for (int64_t l = 0; l < kLayers; ++l) {
    EXPECT_EQ(states[l], SerializeLayerState(sender->layer_state(l))) << l;
  }
  EXPECT_NE(states[0], states[2]);

  auto decoded = DecodeSelectionStates(states, kLayers, kPrompt);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  auto receiver = Attention(SelectionPolicyKind::kTokenSelectSpan);
  ASSERT_TRUE(RestoreSelectionStates(std::move(decoded).value(), kLayers, receiver.get()).ok());
  for (int64_t l = 0; l < kLayers; ++l) {
    const SelectionLayerState& got = receiver->layer_state(l);
    const SelectionLayerState& want = sender->layer_state(l);
    EXPECT_EQ(got.received, want.received) << l;
    EXPECT_TRUE(got.spans == want.spans) << l;
    std::vector<int32_t> got_tokens, want_tokens;
    got.cascade.Tokens(&got_tokens);
    want.cascade.Tokens(&want_tokens);
    EXPECT_EQ(got_tokens, want_tokens) << l;
    EXPECT_EQ(got.cascade.next_token, want.cascade.next_token) << l;
    EXPECT_EQ(SerializeLayerState(got), states[l]) << l;
  }
}

TEST(SelectionStateTest, WrongCountIsInvalidArgumentNamingTheField) {
  auto sender = Attention(SelectionPolicyKind::kInfLlm);
  for (int64_t l = 0; l < kLayers; ++l) Fill(sender->mutable_layer_state(l), l, kPrompt);
  std::vector<std::string> states = CollectSelectionStates(*sender, kLayers);
  for (size_t count : {size_t{1}, size_t{kLayers - 1}, size_t{kLayers + 1}}) {
    std::vector<std::string> wrong = states;
    wrong.resize(count, states[0]);
    absl::Status s = DecodeSelectionStates(wrong, kLayers, kPrompt).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << count;
    EXPECT_NE(s.message().find("final.selection_states"), std::string::npos) << s;
    EXPECT_NE(s.message().find("0 or one per layer (3)"), std::string::npos) << s;
  }
  std::vector<SelectionLayerState> two(2);
  auto attention = Attention(SelectionPolicyKind::kInfLlm);
  EXPECT_EQ(RestoreSelectionStates(std::move(two), kLayers, attention.get()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SelectionStateTest, CorruptStateIsInvalidArgumentNamingTheLayer) {
  auto sender = Attention(SelectionPolicyKind::kCascade);
  for (int64_t l = 0; l < kLayers; ++l) Fill(sender->mutable_layer_state(l), l, kPrompt);
  const std::vector<std::string> states = CollectSelectionStates(*sender, kLayers);
  ASSERT_EQ(states.size(), static_cast<size_t>(kLayers));
  // Every flipped byte, every truncation and garbage of layer 1.
  for (size_t i = 0; i < states[1].size(); i += 7) {
    std::vector<std::string> bad = states;
    bad[1][i] = static_cast<char>(bad[1][i] ^ 0x10);
    absl::Status s = DecodeSelectionStates(bad, kLayers, kPrompt).status();
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << i;
    EXPECT_NE(s.message().find("final.selection_states[1]"), std::string::npos) << s;
  }
  for (size_t n = 0; n < states[1].size(); n += 11) {
    std::vector<std::string> bad = states;
    bad[1].resize(n);
    absl::Status s = DecodeSelectionStates(bad, kLayers, kPrompt).status();
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << n;
    EXPECT_NE(s.message().find("final.selection_states[1]"), std::string::npos) << s;
  }
  std::vector<std::string> garbage = states;
  garbage[2] = "not a layer state";
  absl::Status s = DecodeSelectionStates(garbage, kLayers, kPrompt).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("final.selection_states[2]"), std::string::npos) << s;
}

TEST(SelectionStateTest, StateBeyondThePromptIsRejected) {
  // Each part on its own: received attention, span coverage, cascade tokens.
  for (int part = 0; part < 3; ++part) {
    auto sender = Attention(SelectionPolicyKind::kTokenSelectSpan);
    SelectionLayerState* state = sender->mutable_layer_state(0);
    if (part == 0) state->received.assign(kPrompt + 1, 1.0f);
    if (part == 1) {
      DetectedSpan a;
      a.x = 0, a.y = kPrompt, a.score = 1, a.index_tokens = {kPrompt};
      state->spans.AppendChunk(0, kPrompt + 1, {a});
    }
    if (part == 2) {
      state->cascade.Configure({4});
      state->cascade.Push(kPrompt, 1.0f);
      state->cascade.next_token = kPrompt + 1;
    }
    const std::vector<std::string> states = CollectSelectionStates(*sender, kLayers);
    ASSERT_EQ(states.size(), static_cast<size_t>(kLayers)) << part;
    ASSERT_TRUE(DecodeSelectionStates(states, kLayers, kPrompt + 1).ok()) << part;
    absl::Status s = DecodeSelectionStates(states, kLayers, kPrompt).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << part;
    EXPECT_NE(s.message().find("final.selection_states[0]"), std::string::npos) << s;
    EXPECT_NE(s.message().find("beyond the prompt"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace tokenselect::engine
