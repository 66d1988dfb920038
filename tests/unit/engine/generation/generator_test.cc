// Generator end to end on a generated checkpoint: streaming, stopping, errors, page
// accounting, greedy picks left to the backend (SequenceRunner::ForwardGreedy), and TokenSelect
// in the forward pass (full coverage equals dense exactly; the
// selection cache's theta extremes; the attended-token counts a budget implies).
#include "engine/generation/generator.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/generation/backend.h"
#include "engine/generation/demo_checkpoint.h"
#include "engine/generation/model_loader.h"
#include "engine/kvcache/page_pool.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/generation/demo_model_fixture.h"

namespace tokenselect::engine {
namespace {

class GeneratorTest : public DemoModelTest {
 protected:
  Generator MakeGenerator() {
    return Generator(loaded_->model.get(), loaded_->tokenizer.get(), pool_.get());
  }
};

// A backend that picks greedy tokens itself (as the GPU's does on the device), here from the
// CPU backend's logits on the host; `poison` makes it hand back logits holding a NaN instead.
class PickingBackend : public GenerationBackend {
 public:
  PickingBackend(const Model* model, PagePool* pool) : cpu_(model, pool) {}
  const ModelConfig& config() const override { return cpu_.config(); }
  absl::StatusOr<std::unique_ptr<SequenceRunner>> Start(
      int64_t max_tokens, const SelectionOptions& selection) override {
    ASSIGN_OR_RETURN(std::unique_ptr<SequenceRunner> inner, cpu_.Start(max_tokens, selection));
    return std::unique_ptr<SequenceRunner>(new Runner(std::move(inner), this));
  }
  KvLayout kv_layout() const override { return cpu_.kv_layout(); }
  KvCapacity kv_capacity() const override { return cpu_.kv_capacity(); }
  int64_t max_chunk() const override { return cpu_.max_chunk(); }

  int picks = 0;
  bool poison = false;

 private:
  class Runner : public SequenceRunner {
   public:
    Runner(std::unique_ptr<SequenceRunner> inner, PickingBackend* backend)
        : inner_(std::move(inner)), backend_(backend) {}
    absl::Status Forward(absl::Span<const int32_t> tokens, std::vector<float>* logits) override {
      return inner_->Forward(tokens, logits);
    }
    absl::Status ForwardGreedy(absl::Span<const int32_t> tokens, int32_t* token,
                               std::vector<float>* logits) override {
      RETURN_IF_ERROR(inner_->Forward(tokens, logits));
      if (backend_->poison) {
        (*logits)[3] = std::numeric_limits<float>::quiet_NaN();
        *token = -1;
        return absl::OkStatus();
      }
      ++backend_->picks;
      *token = static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) -
                                    logits->begin());
      logits->clear();  // the caller must not need them
      return absl::OkStatus();
    }
    SelectionStats selection_stats() const override { return inner_->selection_stats(); }
    absl::StatusOr<SelectionCacheCounters> cache_counters() const override {
      return inner_->cache_counters();
    }
    absl::StatusOr<std::vector<SelectionCacheCounters>> layer_cache_counters() const override {
      return inner_->layer_cache_counters();
    }
    int64_t length() const override { return inner_->length(); }
    KvStore* kv() override { return inner_->kv(); }
    std::vector<std::string> CollectSelectionStates() const override {
      return inner_->CollectSelectionStates();
    }
    absl::Status RestoreSelectionStates(std::vector<SelectionLayerState> states) override {
      return inner_->RestoreSelectionStates(std::move(states));
    }

   private:
    std::unique_ptr<SequenceRunner> inner_;
    PickingBackend* backend_;
  };

  CpuBackend cpu_;
};

// Greedy decoding without penalties or logprobs lets the backend pick (ForwardGreedy) and gives
// the same tokens as the sampler; sampling, penalties or logprobs keep the sampler; logits the
// sampler refuses (a NaN) still fail as InvalidArgument.
TEST_F(GeneratorTest, BackendPicksGreedyTokensWhenTheSamplerWouldTakeTheArgmax) {
  Generator cpu = MakeGenerator();
  auto want = cpu.Generate(Prompt(30), Greedy(12), nullptr);
  ASSERT_TRUE(want.ok()) << want.status();

  PickingBackend backend(loaded_->model.get(), pool_.get());
  Generator gen(&backend, loaded_->tokenizer.get());
  auto got = gen.Generate(Prompt(30), Greedy(12), nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->token_ids, want->token_ids);
  EXPECT_EQ(backend.picks, 12);  // every token: the prompt's last chunk picks the first

  for (int variant = 0; variant < 3; ++variant) {
    GenerationOptions o = Greedy(6);
    if (variant == 0) o.sampling.temperature = 0.7f;
    if (variant == 1) o.sampling.repetition_penalty = 1.3f;
    if (variant == 2) o.sampling.logprobs = true;
    backend.picks = 0;
    auto r = gen.Generate(Prompt(30), o, nullptr);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(backend.picks, 0) << "variant " << variant;
  }

  backend.poison = true;
  auto refused = gen.Generate(Prompt(30), Greedy(6), nullptr);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("logits[3]"), absl::string_view::npos)
      << refused.status();
  EXPECT_EQ(pool_->num_used_pages(), 0);
}

TEST_F(GeneratorTest, StreamsEveryTokenAndTheTextAddsUp) {
  Generator gen = MakeGenerator();
  std::vector<int32_t> streamed_ids;
  std::string streamed_text;
  auto result = gen.Generate(Prompt(40), Greedy(24), [&](const GeneratedToken& t) {
    streamed_ids.push_back(t.id);
    streamed_text += t.text;
  });
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->finish_reason, FinishReason::kLength);
  EXPECT_EQ(result->token_ids.size(), 24u);
  EXPECT_EQ(streamed_ids, result->token_ids);
  EXPECT_EQ(streamed_text, result->text);
  // At a length limit the streamed text is exactly the decode of every generated id.
  EXPECT_EQ(result->text, loaded_->tokenizer->Decode(result->token_ids, true));
  EXPECT_EQ(result->stats.prompt_tokens, 40);
  EXPECT_EQ(result->stats.generated_tokens, 24);
}

TEST_F(GeneratorTest, StopTokenEndsGenerationAndIsNotStreamedAsText) {
  Generator gen = MakeGenerator();
  auto reference = gen.Generate(Prompt(30), Greedy(12), nullptr);
  ASSERT_TRUE(reference.ok());
  GenerationOptions o = Greedy(12);
  o.sampling.stop_token_ids = {reference->token_ids[5]};
  auto stopped = gen.Generate(Prompt(30), o, nullptr);
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->finish_reason, FinishReason::kStop);
  // Stops at the first occurrence of that id in the greedy sequence.
  size_t first = 0;
  while (reference->token_ids[first] != reference->token_ids[5]) ++first;
  EXPECT_EQ(stopped->token_ids.size(), first + 1);
}

TEST_F(GeneratorTest, SameSeedSameSamplesDifferentSeedDifferent) {
  Generator gen = MakeGenerator();
  GenerationOptions o = Greedy(20);
  o.sampling.temperature = 1.0f;
  o.sampling.seed = 7;
  auto a = gen.Generate(Prompt(20), o, nullptr);
  auto b = gen.Generate(Prompt(20), o, nullptr);
  o.sampling.seed = 8;
  auto c = gen.Generate(Prompt(20), o, nullptr);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->token_ids, b->token_ids);
  EXPECT_NE(a->token_ids, c->token_ids);
}

TEST_F(GeneratorTest, BadInputIsInvalidArgumentNamingTheFieldAndLeaksNothing) {
  Generator gen = MakeGenerator();
  EXPECT_EQ(gen.Generate({}, Greedy(4), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto out_of_vocab = gen.Generate({1, 2, 5000}, Greedy(4), nullptr);
  EXPECT_EQ(out_of_vocab.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out_of_vocab.status().message().find("vocabulary"), absl::string_view::npos);

  GenerationOptions bad_sampling = Greedy(4);
  bad_sampling.sampling.top_p = 1.5f;
  auto s1 = gen.Generate(Prompt(8), bad_sampling, nullptr);
  EXPECT_EQ(s1.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s1.status().message().find("top_p"), absl::string_view::npos);

  for (auto mutate : std::vector<void (*)(SelectionOptions*)>{
           [](SelectionOptions* s) { s->k = -1; },
           [](SelectionOptions* s) { s->theta = -2; },
           [](SelectionOptions* s) { s->chunk_size = 0; },
           [](SelectionOptions* s) { s->n_local = -5; }}) {
    GenerationOptions o = Greedy(4);
    mutate(&o.selection);
    auto r = gen.Generate(Prompt(8), o, nullptr);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("selection."), absl::string_view::npos)
        << r.status();
  }
  EXPECT_EQ(pool_->num_used_pages(), 0);
}

TEST_F(GeneratorTest, MoreTokensThanThePoolHoldsIsResourceExhausted) {
  Generator gen = MakeGenerator();
  auto r = gen.Generate(Prompt(100), Greedy(256 * 16), nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool_->num_used_pages(), 0);
}

TEST_F(GeneratorTest, TokenSelectWithACoveringBudgetEqualsDenseExactly) {
  Generator gen = MakeGenerator();
  GenerationOptions dense = Greedy(24);
  dense.selection.policy = SelectionPolicyKind::kDense;
  dense.selection.chunk_size = 64;
  GenerationOptions ts = dense;
  ts.selection.policy = SelectionPolicyKind::kTokenSelect;  // default budget 128+2048+512
  auto a = gen.Generate(Prompt(300), dense, nullptr);
  auto b = gen.Generate(Prompt(300), ts, nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->token_ids, b->token_ids);
  EXPECT_EQ(b->stats.selection.full_attention_steps, b->stats.selection.layer_steps);
}

TEST_F(GeneratorTest, SmallBudgetAttendsToTheBudgetAndTheCacheCounts) {
  Generator gen = MakeGenerator();
  const int64_t layers = loaded_->model->config().num_layers;
  GenerationOptions o = Greedy(10);
  o.selection.n_init = 4;
  o.selection.k = 16;
  o.selection.n_local = 8;
  o.selection.chunk_size = 32;
  o.selection.theta = 1.01;  // never hits
  auto never = gen.Generate(Prompt(200), o, nullptr);
  ASSERT_TRUE(never.ok()) << never.status();
  // Decode steps attend to n_init + k + n_local cached tokens plus the new one.
  const SelectionStats& s = never->stats.selection;
  EXPECT_EQ(s.decode_layer_steps, 9 * layers);
  EXPECT_EQ(s.decode_attended_tokens, 9 * layers * (4 + 16 + 8 + 1));
  EXPECT_EQ(never->stats.cache.hits, 0);
  EXPECT_EQ(never->stats.cache.misses, 9 * layers);

  o.selection.theta = -1;  // always hits after each layer's first lookup
  auto always = gen.Generate(Prompt(200), o, nullptr);
  ASSERT_TRUE(always.ok());
  EXPECT_EQ(always->stats.cache.misses, layers);
  EXPECT_EQ(always->stats.cache.hits, 8 * layers);

  // A different budget changes what is attended (sparse attention is really used).
  GenerationOptions dense = Greedy(10);
  dense.selection.policy = SelectionPolicyKind::kDense;
  auto d = gen.Generate(Prompt(200), dense, nullptr);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->stats.selection.decode_attended_tokens / d->stats.selection.decode_layer_steps,
            200 + 5);  // mean over steps 200..208 cached tokens, plus the new one
}

}  // namespace
}  // namespace tokenselect::engine
