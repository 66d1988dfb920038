// SelectionLayerState's binary layout (layer_state.h): a round trip preserves every policy's
// next choice, and corrupted input is DataLoss.
#include "engine/selection/layer_state.h"

#include <string>
#include <vector>

#include "engine/selection/selection_policy.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/selection/selection_reference.h"

namespace tokenselect::engine {
namespace {

SelectionInput Input(const reference::Problem& p, int64_t n, SelectionLayerState* state) {
  SelectionInput in;
  in.query = p.query.data();
  in.num_heads = p.num_heads;
  in.keys.k_cache = p.k_cache.data();
  in.keys.slots = p.slots.data();
  in.keys.num_tokens = n;
  in.keys.num_slots = p.num_slots;
  in.keys.num_kv_heads = p.num_kv_heads;
  in.keys.head_dim = p.head_dim;
  in.state = state;
  return in;
}

// A state with every part filled: received attention, a span index, a running cascade.
SelectionLayerState FilledState(const reference::Problem& p, const SelectionPolicy& cascade) {
  SelectionLayerState state;
  for (int i = 0; i < 300; ++i) state.received.push_back(0.25f * (i % 7));
  DetectedSpan a;
  a.x = 0, a.y = 99, a.score = 3.5, a.index_tokens = {4, 50};
  DetectedSpan b;
  b.x = 100, b.y = 299, b.score = -1, b.gap = true, b.index_tokens = {120};
  state.spans.AppendChunk(0, 300, {a, b});
  SelectionResult r;
  for (int64_t n : {200, 260, 261, 262, 300}) {
    EXPECT_TRUE(cascade.Select(Input(p, n, &state), &r).ok());
  }
  return state;
}

TEST(LayerStateTest, RoundTripPreservesTheNextSelection) {
  const reference::Problem p = reference::MakeProblem(4, 2, 8, 400, 3, false);
  SelectionOptions o;
  o.n_init = 4, o.k = 40, o.n_local = 8;
  o.policy = SelectionPolicyKind::kCascade;
  auto cascade = CreateSelectionPolicy(o);
  ASSERT_TRUE(cascade.ok());
  SelectionLayerState state = FilledState(p, **cascade);
  ASSERT_GT(state.cascade.size(), 0);
  const std::string bytes = SerializeLayerState(state);
  auto back = DeserializeLayerState(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->received, state.received);
  EXPECT_TRUE(back->spans == state.spans);
  EXPECT_EQ(SerializeLayerState(*back), bytes);
  for (SelectionPolicyKind kind : {SelectionPolicyKind::kCascade, SelectionPolicyKind::kInfLlm,
                                   SelectionPolicyKind::kTokenSelectSpan}) {
    o.policy = kind;
    o.baselines.infllm_block_size = 16;
    auto policy = CreateSelectionPolicy(o);
    ASSERT_TRUE(policy.ok());
    SelectionLayerState original = state;
    SelectionLayerState restored = *DeserializeLayerState(bytes);
    SelectionResult want, got;
    ASSERT_TRUE((*policy)->Select(Input(p, 330, &original), &want).ok());
    ASSERT_TRUE((*policy)->Select(Input(p, 330, &restored), &got).ok());
    EXPECT_EQ(got.tokens, want.tokens) << PolicyName(kind);
  }
}

TEST(LayerStateTest, CorruptedInputIsDataLoss) {
  const reference::Problem p = reference::MakeProblem(4, 2, 8, 400, 3, false);
  SelectionOptions o;
  o.n_init = 4, o.k = 40, o.n_local = 8;
  o.policy = SelectionPolicyKind::kCascade;
  auto cascade = CreateSelectionPolicy(o);
  ASSERT_TRUE(cascade.ok());
  const std::string bytes = SerializeLayerState(FilledState(p, **cascade));
  for (size_t i = 0; i < bytes.size(); i += 3) {
    std::string bad = bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x04);
    EXPECT_EQ(DeserializeLayerState(bad).status().code(), absl::StatusCode::kDataLoss) << i;
  }
  for (size_t n = 0; n < bytes.size(); n += 5) {
    EXPECT_FALSE(DeserializeLayerState(bytes.substr(0, n)).ok()) << n;
  }
  auto empty = DeserializeLayerState(SerializeLayerState(SelectionLayerState()));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->received.empty());
}

}  // namespace
}  // namespace tokenselect::engine
