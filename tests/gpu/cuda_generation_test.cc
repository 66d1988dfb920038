// The GPU backend end to end against the CPU backend: chunked prefill (dense, TokenSelect and
// InfLLM) and free-running greedy generation through Generator, on the generated presets with
// transformers' own init (weights N(0, 0.02), DummyInit::kHuggingFace). The CPU oracle runs
// with ModelOptions::emulate_bf16 (bf16 exactly where the GPU stores bf16, fp32 elsewhere), so
// what remains is summation order, the GPU attention kernels' bf16 probabilities and fast
// sin/cos: logits within relative L2 2e-2 after every prefill (measured <= 0.009).
//
// Greedy continuations: the issue asks for identical 32-token continuations on >= 95% of prompts.
// These N(0, 0.02) models have nearly flat next-token distributions, so the top-2 logit gap is
// often below the remaining kernel rounding (bf16 probabilities in the attention kernels): on an
// H200 dense and streaming agree on 15-20 of 20 prompts per preset and TokenSelect on 10 of 20
// (a flipped near-tie in a vote changes a pick, and a pick changes the attention set), with the
// failing prompts changing from run to run (noise, not a fixed fault). The assertions below are
// regression floors under those measurements, not the 95% target, which these random models miss,
// and that every continuation parts at a near-tie of the CPU's own logits (its pick at most 0.02
// above the GPU's pick there for dense and streaming, 0.1 where a vote picks the attended set).
// TokenSelect, Quest and InfLLM run only on the presets whose head_dim the GPU scoring kernels
// take (64/128); the others must refuse them with Unimplemented. InfLLM's per-layer state
// (received attention) is carried to a second runner as a decode worker receives it.
//
// TrainedCheckpointGreedyMatchesTheCpu runs the same comparison on a model with margins between
// its top candidates (tests/data/golden_trained: trained on a synthetic language whose next token
// depends on the context; make_trained.py) over its 40 golden prompts of 1 to 1024 tokens, and
// holds every policy to the 95%.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/generation/backend.h"
#include "engine/generation/cuda_backend.h"
#include "engine/generation/demo_checkpoint.h"
#include "engine/generation/generator.h"
#include "engine/kvcache/page_pool.h"
#include "engine/kvcache/token_table.h"
#include "engine/model/cuda_model.h"
#include "engine/model/model.h"
#include "engine/model/model_presets.h"
#include "engine/selection/cuda_selection.h"
#include "engine/selection/layer_state.h"
#include "engine/selection/selection_attention.h"
#include "engine/transfer/kv_format.h"
#include "engine/transfer/kv_receiver.h"
#include "tests/gpu/gpu_engine_test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/trained_checkpoint.h"
#include "tokenizer/tokenizer.h"

namespace tokenselect::engine {
namespace {

using gpu_test::Prompt;
using gpu_test::SmallBudget;

class CudaGenerationTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string dir = ::testing::TempDir() + "/cuda_generation_" + GetParam();
    DemoCheckpointOptions demo;
    demo.preset = GetParam();
    ASSERT_TRUE(WriteDemoCheckpoint(dir, demo).ok());
    auto tok = tokenizer::Tokenizer::LoadFromDirectory(dir);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok);
    PresetOptions preset;
    preset.vocab_size = demo.vocab_size;
    auto config = PresetConfig(GetParam(), preset);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    auto weights = gpu_test::QuietWeights(config_);
    ASSERT_TRUE(weights.ok()) << weights.status();
    CudaModelOptions options;
    options.max_tokens = 1024;
    options.max_chunk = 64;
    auto gpu = CudaModel::Create(config_, *weights, options);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(*gpu);
    ModelOptions bf16;
    bf16.emulate_bf16 = true;
    auto cpu = Model::Create(config_, *std::move(weights), bf16);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = std::move(*cpu);
    auto pool = PagePool::Create(cpu_->KvCacheOptions(64, 16));
    ASSERT_TRUE(pool.ok());
    pool_ = std::move(*pool);
  }

  // A second GPU model with the same weights (a decode worker's), to carry K/V into; null (and a
  // failure recorded) when it cannot be made.
  // StatefulPolicyStateCarriedThroughTheHostDecodesLikeTheOriginal for one policy.
  void CarryStateAndDecode(SelectionPolicyKind policy);

  std::unique_ptr<CudaModel> SecondModel() const {
    CudaModelOptions options;
    options.max_tokens = 2048;
    options.max_chunk = 64;
    auto weights = gpu_test::QuietWeights(config_);
    EXPECT_TRUE(weights.ok());
    if (!weights.ok()) return nullptr;
    auto other = CudaModel::Create(config_, *weights, options);
    EXPECT_TRUE(other.ok()) << other.status();
    return other.ok() ? std::move(*other) : nullptr;
  }

  ModelConfig config_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<CudaModel> gpu_;
  std::unique_ptr<Model> cpu_;
  std::unique_ptr<PagePool> pool_;
};

// Prefill in chunks of 64 (the GPU's prefill attention kernel, and for TokenSelect the GPU
// selection of every chunk) lands within 2e-2 of the CPU's logits. The cascade within 5e-2: its
// cache keeps, at every boundary, the token of the higher EMA attention score, and on these
// random models attention is nearly uniform, so the two backends' rounding decides some of those
// comparisons differently and the caches hold different tokens from then on (llama3-rope,
// H100, thirty-eighth session: 0.022 at 517 tokens; gpu_cuda_selection_test shows that for
// equal inputs the GPU's cache is the CPU's, bit for bit).
bool GpuScores(const ModelConfig& c) { return c.head_dim == 64 || c.head_dim == 128; }

TEST_P(CudaGenerationTest, ChunkedPrefillLogitsMatchTheCpu) {
  for (SelectionPolicyKind policy :
       {SelectionPolicyKind::kDense, SelectionPolicyKind::kTokenSelect,
        SelectionPolicyKind::kInfLlm, SelectionPolicyKind::kTokenSelectSpan,
        SelectionPolicyKind::kCascade}) {
    const SelectionOptions sel = SmallBudget(policy);
    if (policy != SelectionPolicyKind::kDense && !GpuScores(config_)) {
      auto refused = CudaSelectionAttention::Create(sel, config_, 1024, 64);
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented);
      continue;
    }
    double worst = 0;
    for (int64_t n : {1, 63, 64, 65, 200, 517}) {
      const std::vector<int32_t> prompt = Prompt(n, n, config_.vocab_size);
      auto gpu_sel = CudaSelectionAttention::Create(sel, config_, gpu_->options().max_tokens, 64);
      ASSERT_TRUE(gpu_sel.ok()) << gpu_sel.status();
      auto cpu_sel = SelectionAttention::Create(sel, config_.num_layers);
      ASSERT_TRUE(cpu_sel.ok());
      gpu_->Reset();
      std::vector<float> gpu_logits, cpu_logits;
      TokenTable table(pool_.get(), "prefill");
      ASSERT_TRUE(table.Reserve(n).ok());
      ForwardWorkspace ws;
      for (int64_t begin = 0; begin < n; begin += sel.chunk_size) {
        const int64_t len = std::min<int64_t>(sel.chunk_size, n - begin);
        const bool last = begin + len == n;
        ASSERT_TRUE(gpu_->Forward(absl::MakeConstSpan(prompt).subspan(begin, len), gpu_sel->get(),
                                  last ? &gpu_logits : nullptr)
                        .ok());
        ForwardRequest request;
        request.tokens = absl::MakeConstSpan(prompt).subspan(begin, len);
        request.table = &table;
        request.attention = cpu_sel->get();
        request.logits = last ? LogitsRows::kLast : LogitsRows::kNone;
        ASSERT_TRUE(cpu_->Forward(request, &ws, &cpu_logits).ok());
      }
      const double rel =
          gpu_test::RelativeL2(gpu_logits.data(), cpu_logits.data(), cpu_logits.size());
      EXPECT_LE(rel, policy == SelectionPolicyKind::kCascade ? 5e-2 : 2e-2)
          << PolicyName(policy) << " n=" << n;
      worst = std::max(worst, rel);
    }
    std::printf("%s %s: chunked-prefill logits rel L2 vs CPU worst %.3g\n", GetParam().c_str(),
                std::string(PolicyName(policy)).c_str(), worst);
  }
}

// The policies the greedy comparisons run, each with the small budget.
constexpr SelectionPolicyKind kGreedyPolicies[] = {
    SelectionPolicyKind::kDense,   SelectionPolicyKind::kTokenSelect,
    SelectionPolicyKind::kQuest,   SelectionPolicyKind::kStreaming,
    SelectionPolicyKind::kInfLlm,  SelectionPolicyKind::kTokenSelectSpan,
    SelectionPolicyKind::kCascade, SelectionPolicyKind::kHeadVote};

// 32 greedy tokens past any EOS with `policy`'s small budget.
GenerationOptions GreedyOptions(SelectionPolicyKind policy) {
  GenerationOptions options;
  options.sampling.temperature = 0;
  options.sampling.max_new_tokens = 32;
  options.sampling.ignore_eos = true;
  options.selection = SmallBudget(policy);
  return options;
}

// How the GPU's continuation `got` of `prompt` (prompt number i) compares with the CPU's `want`:
// whether they agree and, where they part, how near a tie the CPU's own distribution had there:
// its logprob of its pick minus its logprob of the GPU's pick (a logit difference), from a rerun
// of the CPU with logprobs (+inf when the GPU's pick is not among the CPU's 20 likeliest, or the
// rerun does not reproduce `want`). Prints where they part.
struct Agreement {
  bool same = true;
  double gap = 0;
};
Agreement CompareContinuations(Generator* cpu_gen, const std::vector<int32_t>& prompt,
                               const GenerationOptions& options, const GenerationResult& got,
                               const GenerationResult& want, int i) {
  Agreement a;
  if (got.token_ids == want.token_ids) return a;
  a.same = false;
  a.gap = INFINITY;
  const size_t d = gpu_test::FirstDifference(got.token_ids, want.token_ids);
  GenerationOptions with_logprobs = options;
  with_logprobs.sampling.logprobs = true;
  with_logprobs.sampling.top_logprobs = 20;
  std::vector<GeneratedToken> steps;
  auto again = cpu_gen->Generate(prompt, with_logprobs,
                                 [&](const GeneratedToken& t) { steps.push_back(t); });
  if (again.ok() && again->token_ids == want.token_ids && d < steps.size() &&
      d < got.token_ids.size() && steps[d].logprob.has_value()) {
    for (const TokenLogprob& alt : steps[d].top_logprobs) {
      if (alt.token_id == got.token_ids[d]) a.gap = double(*steps[d].logprob) - alt.logprob;
    }
  }
  std::printf("  prompt %d (%zu tokens): first difference at generated token %zu, where the "
              "CPU's pick is %.3g above the GPU's in the CPU's logits\n",
              i, prompt.size(), d, a.gap);
  return a;
}

// Free-running greedy generation through Generator on both backends.
TEST_P(CudaGenerationTest, GreedyContinuationsMatchTheCpu) {
  CpuBackend cpu_backend(cpu_.get(), pool_.get());
  CudaBackend gpu_backend(gpu_.get());
  Generator cpu_gen(&cpu_backend, tokenizer_.get());
  Generator gpu_gen(&gpu_backend, tokenizer_.get());
  for (SelectionPolicyKind policy : kGreedyPolicies) {
    const GenerationOptions options = GreedyOptions(policy);
    const bool scores = gpu_test::ScoresKeys(policy);
    if (scores && !GpuScores(config_)) continue;
    int same = 0, total = 0;
    double worst_gap = 0;
    int64_t hits = 0, lookups = 0, cache_decision_diffs = 0;
    for (int i = 0; i < 20; ++i) {
      const std::vector<int32_t> prompt = Prompt(40 + 23 * i, 1000 + i, config_.vocab_size);
      auto want = cpu_gen.Generate(prompt, options, nullptr);
      ASSERT_TRUE(want.ok()) << want.status();
      auto got = gpu_gen.Generate(prompt, options, nullptr);
      ASSERT_TRUE(got.ok()) << got.status();
      ++total;
      const Agreement agreement =
          CompareContinuations(&cpu_gen, prompt, options, *got, *want, i);
      same += agreement.same;
      worst_gap = std::max(worst_gap, agreement.gap);
      EXPECT_EQ(got->stats.generated_tokens, 32);
      hits += got->stats.cache.hits;
      lookups += got->stats.cache.lookups();
      if ((policy == SelectionPolicyKind::kTokenSelect ||
           policy == SelectionPolicyKind::kTokenSelectSpan) &&
          got->token_ids == want->token_ids) {
        // Same cache decisions on both backends while the continuations agree, except where a
        // cosine sits within rounding of theta (counted, and bounded below).
        cache_decision_diffs += std::abs(got->stats.cache.hits - want->stats.cache.hits);
        EXPECT_EQ(got->stats.cache.lookups(), want->stats.cache.lookups()) << "prompt " << i;
      }
    }
    std::printf("%s %s: identical greedy continuations on %d of %d prompts (largest CPU logit "
                "gap where they part %.3g); GPU selection cache %lld hits of %lld lookups (%lld "
                "decisions differ from the CPU's)\n",
                GetParam().c_str(), std::string(PolicyName(policy)).c_str(), same, total,
                worst_gap, static_cast<long long>(hits), static_cast<long long>(lookups),
                static_cast<long long>(cache_decision_diffs));
    // Where they part, the CPU's own top two must be near a tie (gpu_test::NearTieBound; the
    // logits' RMS is ~0.3 with this init: gpu_hf_parity_test prints 0.31-0.32 for golden_hf,
    // the same N(0, 0.02)). H200, twenty-sixth session: dense and streaming part at gaps of at
    // most 0.0032, TokenSelect 0.0044, Quest 0.036.
    EXPECT_LE(worst_gap, gpu_test::NearTieBound(policy)) << PolicyName(policy);
    EXPECT_LE(cache_decision_diffs * 100, std::max<int64_t>(1, lookups)) << "cache decisions";
    // tokenselect_span on llama3-rope (H100): 3 of 20 in the thirty-sixth session, 8 of 20 in the
    // thirty-seventh (both backends now decode through the selection cache; 1088 hits of 2160
    // lookups), every parting at a near-tie (largest gap 0.075): the span index turns a near-tie
    // in the chunk map (the GPU's bf16 q/k against the CPU's emulation) into different spans, and
    // so a different kept set.
    const int floor_percent = policy == SelectionPolicyKind::kTokenSelectSpan ? 10
                              : scores                                        ? 35
                                                                              : 70;
    EXPECT_GE(same * 100, total * floor_percent) << PolicyName(policy);
  }
  EXPECT_TRUE(pool_->CheckNoLeaks().ok());
}

TEST_P(CudaGenerationTest, BackendErrors) {
  CudaBackend backend(gpu_.get());
  Generator gen(&backend, tokenizer_.get());
  GenerationOptions options;
  options.sampling.max_new_tokens = 4;
  options.selection.chunk_size = 64;
  // Every policy runs on the GPU; a scoring one on a head_dim its kernels do not take is refused.
  options.selection.policy = SelectionPolicyKind::kHeadVote;
  if (!GpuScores(config_)) {
    auto unimplemented = gen.Generate({5, 6, 7}, options, nullptr);
    EXPECT_EQ(unimplemented.status().code(), absl::StatusCode::kUnimplemented);
  }
  options.selection.policy = SelectionPolicyKind::kStreaming;
  options.selection.chunk_size = 65;  // the model's max_chunk is 64
  auto chunk = gen.Generate({5, 6, 7}, options, nullptr);
  EXPECT_EQ(chunk.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(chunk.status().message().find("selection.chunk_size"), std::string::npos);
  options.selection.chunk_size = 64;
  options.sampling.max_new_tokens = 2000;  // over max_tokens 1024
  auto too_long = gen.Generate({5, 6, 7}, options, nullptr);
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kResourceExhausted);
  auto bad_id = gen.Generate({5, -1}, options, nullptr);
  EXPECT_EQ(bad_id.status().code(), absl::StatusCode::kInvalidArgument);
  // The backend is free again after every error: a valid request runs.
  options.sampling.max_new_tokens = 4;
  auto ok = gen.Generate({5, 6, 7}, options, nullptr);
  EXPECT_TRUE(ok.ok()) << ok.status();
}

// The host transport's path between two runners: the first `tokens` K/V of `src` in blocks
// through KvStore::Encode -> KvReceiver -> KvStore::Write into `dst`, then the final record with
// src's selection states, restored into dst as a decode worker does.
absl::Status CarryPrompt(const CudaBackend& prefill, SequenceRunner* src, SequenceRunner* dst,
                         int64_t tokens) {
  KvReceiver receiver("r", "v", dst->kv(), tokens);
  int64_t sequence = 0;
  for (const KvBlockRange& range : PlanKvBlocks(prefill.kv_layout(), 0, tokens, 40000)) {
    ASSIGN_OR_RETURN(KvBlock block, src->kv()->Encode(range, sequence++, /*checksum=*/true));
    RETURN_IF_ERROR(receiver.Accept("r", "v", block));
  }
  KvFinal final;
  final.first_token_id = 1;
  final.num_chunks = sequence;
  final.selection_states = src->CollectSelectionStates();
  RETURN_IF_ERROR(receiver.Finish("r", "v", final));
  return dst->RestoreSelectionStates(receiver.TakeSelectionStates());
}

// The worker path on one GPU: a prompt prefilled by one runner, its K/V carried through the host
// wire format (KvStore::Encode -> KvReceiver -> KvStore::Write, as the host transport does) into
// a second runner of another backend, which then decodes. Its logits must equal those of the
// runner that did the prefill, step after step (same K/V bytes and kernels, up to the GEMM's
// summation order at another batch size), and DecodeBatch over several runners must give each
// row the logits of its runner alone.
TEST_P(CudaGenerationTest, KvCarriedThroughTheHostDecodesLikeTheOriginal) {
  std::unique_ptr<CudaModel> other = SecondModel();
  ASSERT_NE(other, nullptr);
  CudaBackend prefill(gpu_.get());
  CudaBackend decode(other.get());
  const SelectionOptions dense = [] {
    SelectionOptions s;
    s.policy = SelectionPolicyKind::kDense;
    s.chunk_size = 64;
    return s;
  }();
  const std::vector<int32_t> prompt = Prompt(150, 3, config_.vocab_size);
  auto src = prefill.Start(200, dense);
  ASSERT_TRUE(src.ok()) << src.status();
  std::vector<float> first;
  for (size_t b = 0; b < prompt.size(); b += 64) {
    const size_t e = std::min(prompt.size(), b + 64);
    ASSERT_TRUE((*src)->Forward(absl::MakeConstSpan(prompt).subspan(b, e - b),
                                e == prompt.size() ? &first : nullptr)
                    .ok());
  }
  auto dst = decode.Start(200, dense);
  ASSERT_TRUE(dst.ok()) << dst.status();
  ASSERT_TRUE((*dst)->kv()->device_slots().has_value());
  EXPECT_EQ((*dst)->kv()->layout().dtype, KvDType::kBF16);
  ASSERT_TRUE(
      CarryPrompt(prefill, src->get(), dst->get(), static_cast<int64_t>(prompt.size())).ok());
  EXPECT_EQ((*dst)->length(), static_cast<int64_t>(prompt.size()));

  // A third runner with another prompt rides in the batch.
  auto side = decode.Start(100, dense);
  ASSERT_TRUE(side.ok());
  const std::vector<int32_t> side_prompt = Prompt(40, 5, config_.vocab_size);
  ASSERT_TRUE((*side)->Forward(side_prompt, nullptr).ok());
  auto alone = prefill.Start(100, dense);
  ASSERT_TRUE(alone.ok());
  ASSERT_TRUE((*alone)->Forward(side_prompt, nullptr).ok());

  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  int32_t token = 7;
  for (int step = 0; step < 6; ++step) {
    std::vector<float> want, want_side, got;
    ASSERT_TRUE((*src)->Forward(absl::MakeConstSpan(&token, 1), &want).ok());
    ASSERT_TRUE((*alone)->Forward(absl::MakeConstSpan(&token, 1), &want_side).ok());
    SequenceRunner* const batch[] = {dst->get(), side->get()};
    const int32_t tokens[] = {token, token};
    ASSERT_TRUE(decode.DecodeBatch(batch, tokens, &got).ok());
    ASSERT_EQ(got.size(), 2 * vocab);
    // A batch of 2 runs its GEMMs with m = 2 (another cuBLASLt algorithm may sum in another
    // order than m = 1): equal up to rounding, not bit for bit.
    EXPECT_LE(gpu_test::RelativeL2(got.data(), want.data(), static_cast<int64_t>(vocab)), 2e-3) << step;
    EXPECT_LE(gpu_test::RelativeL2(got.data() + vocab, want_side.data(), static_cast<int64_t>(vocab)), 2e-3)
        << step;
    token = static_cast<int32_t>(
        std::max_element(want.begin(), want.end()) - want.begin());
  }
  const KvCapacity before = decode.kv_capacity();
  dst->reset();
  side->reset();
  EXPECT_EQ(decode.kv_capacity().free_pages, decode.kv_capacity().total_pages);
  EXPECT_LT(before.free_pages, before.total_pages);
}

// The stateful policies' state (InfLLM: every layer's received attention; tokenselect_span: that
// and the span index; cascade: the cascading cache) travels with the K/V: a decode runner that
// restores it holds the same state and decodes like the runner that did the prefill; the
// received attention equals the CPU backend's within the two models' rounding. (The cascade's
// held tokens are printed against the CPU's, not asserted: on these near-uniform attention
// models its boundary comparisons are near-ties that the models' rounding decides.)
TEST_P(CudaGenerationTest, StatefulPolicyStateCarriedThroughTheHostDecodesLikeTheOriginal) {
  if (!GpuScores(config_)) GTEST_SKIP() << "infllm on the GPU needs head_dim 64 or 128";
  for (SelectionPolicyKind policy :
       {SelectionPolicyKind::kInfLlm, SelectionPolicyKind::kTokenSelectSpan,
        SelectionPolicyKind::kCascade}) {
    SCOPED_TRACE(PolicyName(policy));
    CarryStateAndDecode(policy);
  }
}

void CudaGenerationTest::CarryStateAndDecode(SelectionPolicyKind policy) {
  std::unique_ptr<CudaModel> other = SecondModel();
  ASSERT_NE(other, nullptr);
  CudaBackend prefill(gpu_.get());
  CudaBackend decode(other.get());
  CpuBackend cpu(cpu_.get(), pool_.get());
  const SelectionOptions sel = SmallBudget(policy);
  const std::vector<int32_t> prompt = Prompt(300, 11, config_.vocab_size);
  const int64_t n = static_cast<int64_t>(prompt.size());
  auto src = prefill.Start(400, sel);
  auto on_cpu = cpu.Start(400, sel);
  ASSERT_TRUE(src.ok() && on_cpu.ok());
  for (int64_t b = 0; b < n; b += sel.chunk_size) {
    const auto chunk = absl::MakeConstSpan(prompt).subspan(b, std::min(sel.chunk_size, n - b));
    ASSERT_TRUE((*src)->Forward(chunk, nullptr).ok());
    ASSERT_TRUE((*on_cpu)->Forward(chunk, nullptr).ok());
  }
  const std::vector<std::string> states = (*src)->CollectSelectionStates();
  ASSERT_EQ(states.size(), static_cast<size_t>(config_.num_layers));
  // Against the CPU backend's received attention.
  const std::vector<std::string> cpu_states = (*on_cpu)->CollectSelectionStates();
  ASSERT_EQ(cpu_states.size(), states.size());
  double worst = 0;
  int same_indexes = 0, same_caches = 0;
  const bool cascade = policy == SelectionPolicyKind::kCascade;
  for (size_t l = 0; l < states.size(); ++l) {
    auto got = DeserializeLayerState(states[l]);
    auto want = DeserializeLayerState(cpu_states[l]);
    ASSERT_TRUE(got.ok() && want.ok());
    if (cascade) {
      std::vector<int32_t> got_tokens, want_tokens;
      got->cascade.Tokens(&got_tokens);
      want->cascade.Tokens(&want_tokens);
      // The last chunk selected over the tokens before it.
      const int64_t last_chunk = (n - 1) / sel.chunk_size * sel.chunk_size;
      EXPECT_EQ(got->cascade.next_token, last_chunk);
      EXPECT_EQ(want->cascade.next_token, last_chunk);
      EXPECT_EQ(got_tokens.size(), want_tokens.size());
      same_caches += got_tokens == want_tokens;
      continue;
    }
    ASSERT_EQ(got->received.size(), static_cast<size_t>(n));
    ASSERT_EQ(want->received.size(), static_cast<size_t>(n));
    worst = std::max(worst, gpu_test::RelativeL2(got->received.data(), want->received.data(), n));
    same_indexes += got->spans == want->spans;
    EXPECT_EQ(got->spans.covered_end(),
              policy == SelectionPolicyKind::kTokenSelectSpan ? n : int64_t{0});
  }
  std::printf(
      "%s %s: received attention after prefill, rel L2 vs CPU worst layer %.3g; span "
      "indexes equal to the CPU's in %d of %zu layers; cascading caches holding the CPU's "
      "tokens in %d\n",
      GetParam().c_str(), std::string(PolicyName(policy)).c_str(), worst, same_indexes,
      states.size(), same_caches);
  EXPECT_LE(worst, 2e-2);

  auto dst = decode.Start(400, sel);
  ASSERT_TRUE(dst.ok()) << dst.status();
  ASSERT_TRUE(CarryPrompt(prefill, src->get(), dst->get(), n).ok());
  EXPECT_EQ((*dst)->CollectSelectionStates(), states);
  int32_t token = 7;
  for (int step = 0; step < 6; ++step) {
    std::vector<float> want, got;
    ASSERT_TRUE((*src)->Forward(absl::MakeConstSpan(&token, 1), &want).ok());
    ASSERT_TRUE((*dst)->Forward(absl::MakeConstSpan(&token, 1), &got).ok());
    EXPECT_LE(gpu_test::RelativeL2(got.data(), want.data(), static_cast<int64_t>(want.size())),
              2e-3)
        << step;
    token = static_cast<int32_t>(std::max_element(want.begin(), want.end()) - want.begin());
  }
  EXPECT_EQ((*dst)->CollectSelectionStates(), (*src)->CollectSelectionStates());
}

// Free-running greedy generation on the trained checkpoint, GPU against the bf16-emulating CPU,
// over the golden prompts (in the language the model was trained on), every policy.
TEST(CudaGenerationTrainedTest, TrainedCheckpointGreedyMatchesTheCpu) {
  auto prompts = gpu_test::TrainedPrompts();
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  auto trained = gpu_test::LoadTrainedCheckpoint();
  ASSERT_TRUE(trained.ok()) << trained.status();
  auto tok = tokenizer::Tokenizer::LoadFromDirectory(gpu_test::kTrainedDir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  CudaModelOptions options;
  options.max_tokens = 1024 + 64;
  options.max_chunk = 64;
  auto gpu = CudaModel::Create(trained->config, trained->weights, options);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ModelOptions bf16;
  bf16.emulate_bf16 = true;
  auto cpu = Model::Create(trained->config, std::move(trained->weights), bf16);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto pool = PagePool::Create((*cpu)->KvCacheOptions(72, 16));
  ASSERT_TRUE(pool.ok());
  CpuBackend cpu_backend(cpu->get(), pool->get());
  CudaBackend gpu_backend(gpu->get());
  Generator cpu_gen(&cpu_backend, tok->get());
  Generator gpu_gen(&gpu_backend, tok->get());
  for (SelectionPolicyKind policy : kGreedyPolicies) {
    const GenerationOptions gen = GreedyOptions(policy);
    int same = 0, total = 0;
    for (const gpu_test::TrainedPrompt& entry : *prompts) {
      auto want = cpu_gen.Generate(entry.ids, gen, nullptr);
      ASSERT_TRUE(want.ok()) << want.status();
      auto got = gpu_gen.Generate(entry.ids, gen, nullptr);
      ASSERT_TRUE(got.ok()) << got.status();
      same += CompareContinuations(&cpu_gen, entry.ids, gen, *got, *want, total++).same;
    }
    std::printf("llama-topics (trained) %s: identical greedy continuations on %d of %d prompts\n",
                std::string(PolicyName(policy)).c_str(), same, total);
    EXPECT_EQ(total, 40);
    EXPECT_GE(same * 100, total * 95) << PolicyName(policy);
  }
  EXPECT_TRUE((*pool)->CheckNoLeaks().ok());
}

INSTANTIATE_TEST_SUITE_P(Presets, CudaGenerationTest,
                         ::testing::Values("llama-gqa", "qwen2-bias", "llama3-rope"));

}  // namespace
}  // namespace tokenselect::engine
