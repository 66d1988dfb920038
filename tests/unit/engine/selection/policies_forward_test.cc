// Every selection policy through SelectionAttention in a real forward pass (a generated demo
// checkpoint): it runs, attends to the budget, equals dense exactly when the budget covers the
// cache, and the span index is built during prefill.
#include <memory>
#include <string>
#include <vector>

#include "engine/generation/demo_checkpoint.h"
#include "engine/generation/generator.h"
#include "engine/generation/model_loader.h"
#include "engine/kvcache/page_pool.h"
#include "engine/kvcache/token_table.h"
#include "engine/model/model.h"
#include "engine/selection/selection_attention.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/generation/demo_model_fixture.h"

namespace tokenselect::engine {
namespace {

class PoliciesForwardTest : public DemoModelTest {};

const SelectionPolicyKind kAll[] = {
    SelectionPolicyKind::kTokenSelect, SelectionPolicyKind::kTopK,
    SelectionPolicyKind::kHeadVote,    SelectionPolicyKind::kDense,
    SelectionPolicyKind::kStreaming,   SelectionPolicyKind::kTokenSelectSpan,
    SelectionPolicyKind::kInfLlm,      SelectionPolicyKind::kQuest,
    SelectionPolicyKind::kCascade};

TEST_F(PoliciesForwardTest, EveryPolicyRegisteredByName) {
  for (SelectionPolicyKind kind : kAll) {
    auto parsed = ParsePolicy(PolicyName(kind));
    ASSERT_TRUE(parsed.ok()) << PolicyName(kind);
    EXPECT_EQ(*parsed, kind);
    SelectionOptions o;
    o.policy = kind;
    EXPECT_TRUE(CreateSelectionPolicy(o).ok()) << PolicyName(kind);
  }
}

TEST_F(PoliciesForwardTest, CoveringBudgetEqualsDenseExactlyForEveryPolicy) {
  Generator gen(loaded_->model.get(), loaded_->tokenizer.get(), pool_.get());
  GenerationOptions dense = Greedy(8);
  dense.selection.policy = SelectionPolicyKind::kDense;
  dense.selection.chunk_size = 64;
  auto want = gen.Generate(Prompt(100), dense, nullptr);
  ASSERT_TRUE(want.ok());
  for (SelectionPolicyKind kind : kAll) {
    if (kind == SelectionPolicyKind::kDense) continue;
    GenerationOptions o = dense;
    o.selection.policy = kind;  // default budget 128 + 2048 + 512 covers 108 tokens
    auto got = gen.Generate(Prompt(100), o, nullptr);
    ASSERT_TRUE(got.ok()) << PolicyName(kind) << ": " << got.status();
    EXPECT_EQ(got->token_ids, want->token_ids) << PolicyName(kind);
    EXPECT_EQ(got->stats.selection.full_attention_steps, got->stats.selection.layer_steps)
        << PolicyName(kind);
  }
}

TEST_F(PoliciesForwardTest, SmallBudgetAttendsToTheBudget) {
  Generator gen(loaded_->model.get(), loaded_->tokenizer.get(), pool_.get());
  const int64_t layers = loaded_->model->config().num_layers;
  for (SelectionPolicyKind kind :
       {SelectionPolicyKind::kTokenSelectSpan, SelectionPolicyKind::kInfLlm,
        SelectionPolicyKind::kQuest, SelectionPolicyKind::kCascade}) {
    GenerationOptions o = Greedy(10);
    o.selection.policy = kind;
    o.selection.n_init = 4;
    o.selection.k = 16;
    o.selection.n_local = 8;
    o.selection.chunk_size = 32;
    o.selection.baselines.infllm_block_size = 8;  // 2 blocks of 8 = k
    o.selection.baselines.quest_page_size = 4;    // 4 pages of 4 = k
    auto r = gen.Generate(Prompt(200), o, nullptr);
    ASSERT_TRUE(r.ok()) << PolicyName(kind) << ": " << r.status();
    const SelectionStats& s = r->stats.selection;
    EXPECT_EQ(s.decode_layer_steps, 9 * layers) << PolicyName(kind);
    if (kind == SelectionPolicyKind::kInfLlm) {
      // Blocks start at n_init, so the block at the end of the candidates may be partial.
      EXPECT_LE(s.decode_attended_tokens, 9 * layers * (4 + 16 + 8 + 1));
      EXPECT_GE(s.decode_attended_tokens, 9 * layers * (4 + 8 + 8 + 1));
    } else {
      EXPECT_EQ(s.decode_attended_tokens, 9 * layers * (4 + 16 + 8 + 1)) << PolicyName(kind);
    }
    EXPECT_GT(s.candidates_scored, 0) << PolicyName(kind);
    EXPECT_LT(s.full_attention_steps, s.layer_steps) << PolicyName(kind);
  }
}

TEST_F(PoliciesForwardTest, SpanIndexIsBuiltDuringPrefill) {
  const Model& model = *loaded_->model;
  const int64_t layers = model.config().num_layers;
  SelectionOptions o;
  o.policy = SelectionPolicyKind::kTokenSelectSpan;
  o.n_init = 4, o.k = 16, o.n_local = 8;
  auto attention = SelectionAttention::Create(o, layers);
  ASSERT_TRUE(attention.ok());
  TokenTable table(pool_.get(), "span");
  ForwardWorkspace ws;
  std::vector<float> logits;
  const std::vector<int32_t> prompt = Prompt(96);
  for (int64_t start = 0; start < 96; start += 32) {
    ForwardRequest req;
    req.tokens = absl::MakeConstSpan(prompt).subspan(start, 32);
    req.table = &table;
    req.attention = attention->get();
    req.logits = LogitsRows::kNone;
    ASSERT_TRUE(model.Forward(req, &ws, &logits).ok());
  }
  for (int64_t l = 0; l < layers; ++l) {
    const SelectionLayerState& state = (*attention)->layer_state(l);
    EXPECT_EQ(state.spans.covered_end(), 96);
    EXPECT_EQ(state.received.size(), 96u);
    std::vector<int> cover(96, 0);
    for (const IndexedSpan& s : state.spans.spans()) {
      EXPECT_GE(s.num_vectors, 1);
      for (int32_t t = s.begin; t < s.end; ++t) ++cover[t];
    }
    for (int t = 0; t < 96; ++t) EXPECT_GE(cover[t], 1) << "layer " << l << " token " << t;
    auto back = SpanIndex::Deserialize(state.spans.Serialize());
    ASSERT_TRUE(back.ok());
    EXPECT_TRUE(*back == state.spans);
  }
  table.Release();
}

}  // namespace
}  // namespace tokenselect::engine
