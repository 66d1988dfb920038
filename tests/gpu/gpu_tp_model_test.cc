// Tensor parallelism (engine/parallel/tp_cuda_model.h, docs/parallel.md): the model sharded over
// 2 or 4 GPUs against the same model on one GPU, on the generated test presets with
// transformers' own init (N(0, 0.02), DummyInit::kHuggingFace, seed 11: the weights of the
// checkpoints gpu_cuda_generation_test writes), plus two variants that the presets lack:
// "llama3-rope-kv4" (llama3-rope with 4 KV heads, so that 4 ranks can split them while head_dim
// 64 keeps the GPU scoring kernels) and "llama-gqa-bias" (q/k/v, o_proj and MLP biases: the
// row-parallel biases that only rank 0 adds).
//
// What is checked, per (model, TP size) and policy (dense, streaming; tokenselect, quest and -
// without TP-invariant numerics - infllm and tokenselect_span where head_dim is 64 or 128):
//   - chunked-prefill and teacher-forced decode logits within relative L2 2e-2 of one GPU's
//     (bf16 tolerance; the measured worst is printed; infllm's and tokenselect_span's decode
//     within the near-tie bound, see LogitsMatchOneGpu) and bit-identical on every rank;
//   - free-running 32-token greedy continuations identical to one GPU's (20 prompts, or the
//     trained checkpoint's golden ones; the bound is below; the count is printed);
//   - every attention list every rank's provider produced (every layer of every step: the
//     selected slots) identical across ranks, and the selection-cache counters equal;
//   - DecodeBatch against one GPU's DecodeBatch; CUDA graphs (NCCL all-reduce captured) against
//     eager launches, bit for bit; TpCudaModel with one rank against a plain CudaModel, bit for
//     bit (the one-GPU path is unchanged).
// Every case runs twice: with the default numerics (the bounds above) and with TP-invariant
// numerics (`_invariant`: both models with invariant_shards = the TP size, docs/parallel.md),
// where the logits must equal one GPU's bit for bit at every compared step and all
// continuations must be identical.
// "llama-topics" is the trained checkpoint of tests/data/golden_trained (make_trained.py there:
// a model with margins between its top candidates, as trained models have); its greedy case runs
// the golden prompts (the language it was trained on) that fit kMaxTokens with their 32 tokens.
// Tests skip when fewer GPUs than the TP size are present. The non-dividing sizes are refused
// with InvalidArgument without any GPU.
//
// Measured (H200, docs/parallel.md "Status"): default numerics give logits within rel L2
// 0.002-0.012 of one GPU and 14-19 of 20 identical continuations on the llama-gqa, llama3-rope
// and llama3-rope-kv4 presets (near-ties of random weights, nearly flat next-token
// distributions); TP-invariant numerics give 0 and 20 of 20 on every case, TP=2 and TP=4. So the
// 95% bound on continuations is asserted where it means something: on the trained checkpoint,
// and (all of them) with TP-invariant numerics. On the random-weight presets with default
// numerics the assertion is a regression floor under those measurements (70%; 50% for
// TokenSelect and Quest, where a flipped vote also changes the attended tokens), and every run
// that parts from one GPU's must part at a near-tie of one GPU's logits (its pick at most 0.02
// above TP's pick there; 0.1 for TokenSelect and Quest).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status.h"
#include "engine/generation/cuda_backend.h"
#include "engine/model/cuda_model.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/model_presets.h"
#include "engine/parallel/tp_cuda_model.h"
#include "engine/selection/cuda_selection.h"
#include "tests/gpu/gpu_engine_test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/trained_checkpoint.h"

namespace tokenselect::engine {
namespace {

// Tensor parallelism in one process needs eager kernel loading (TpCudaModel::Create checks),
// asked for before the first CUDA call, so before main.
const bool kEagerLoading = [] {
  TpCudaModel::RequestEagerLoading(/*tp_size=*/2);
  return true;
}();

using gpu_test::kTrainedModel;

// The random-weight cases' configs (the trained checkpoint brings its own).
absl::StatusOr<ModelConfig> TestConfig(const std::string& name) {
  PresetOptions preset;
  preset.vocab_size = 2048;
  if (name == "llama3-rope-kv4") {
    ASSIGN_OR_RETURN(ModelConfig c, PresetConfig("llama3-rope", preset));
    c.num_kv_heads = 4;
    return c;
  }
  if (name == "llama-gqa-bias") {
    ASSIGN_OR_RETURN(ModelConfig c, PresetConfig("llama-gqa", preset));
    c.qkv_bias = c.o_bias = c.mlp_bias = true;
    return c;
  }
  return PresetConfig(name, preset);
}

using gpu_test::DeviceCount;
using gpu_test::Prompt;
using gpu_test::SmallBudget;

constexpr int64_t kMaxTokens = 1024;
constexpr int64_t kChunk = 64;

// Wraps a provider and keeps, for every Select call, the attention list's slots (copied back
// after each call: slow, test only).
class ListRecorder : public CudaAttentionProvider {
 public:
  explicit ListRecorder(std::unique_ptr<CudaSelectionAttention> inner) : inner_(std::move(inner)) {}
  absl::Status Select(const CudaAttentionQuery& query, CudaAttentionList* list) override {
    RETURN_IF_ERROR(inner_->Select(query, list));
    int32_t indptr[2] = {0, 0};
    TS_CUDA_CHECK(cudaMemcpyAsync(indptr, list->kv_indptr, sizeof(indptr), cudaMemcpyDeviceToHost,
                                  query.stream));
    TS_CUDA_CHECK(cudaStreamSynchronize(query.stream));
    std::vector<int32_t> slots(static_cast<size_t>(indptr[1] - indptr[0]));
    if (!slots.empty()) {
      TS_CUDA_CHECK(cudaMemcpyAsync(slots.data(), list->kv_indices + indptr[0], slots.size() * 4,
                                    cudaMemcpyDeviceToHost, query.stream));
      TS_CUDA_CHECK(cudaStreamSynchronize(query.stream));
    }
    lists_.push_back(std::move(slots));
    return absl::OkStatus();
  }
  CudaSelectionAttention* inner() const { return inner_.get(); }
  const std::vector<std::vector<int32_t>>& lists() const { return lists_; }

 private:
  std::unique_ptr<CudaSelectionAttention> inner_;
  std::vector<std::vector<int32_t>> lists_;
};

// One recorded provider per rank of `model`, created and destroyed on the ranks' threads.
class RankProviders {
 public:
  RankProviders(TpCudaModel* model, const SelectionOptions& options) : model_(model) {
    recorders_.resize(static_cast<size_t>(model->size()));
    const absl::Status made = model->RunOnRanks([&](int rank, CudaModel* shard) -> absl::Status {
      ASSIGN_OR_RETURN(auto inner, CudaSelectionAttention::Create(
                                       options, shard->config(), kMaxTokens, kChunk, model->size(),
                                       shard->options().invariant_shards));
      recorders_[rank] = std::make_unique<ListRecorder>(std::move(inner));
      return absl::OkStatus();
    });
    EXPECT_TRUE(made.ok()) << made;
    for (auto& r : recorders_) ptrs_.push_back(r.get());
  }
  ~RankProviders() {
    model_
        ->RunOnRanks([&](int rank, CudaModel*) {
          recorders_[rank].reset();
          return absl::OkStatus();
        })
        .IgnoreError();
  }
  absl::Span<CudaAttentionProvider* const> get() const { return ptrs_; }
  ListRecorder* rank(int r) const { return recorders_[r].get(); }

  // Counts the Select calls whose list differs between rank 0 and another rank (0 expected).
  int64_t RankMismatches() const {
    int64_t bad = 0;
    for (size_t r = 1; r < recorders_.size(); ++r) {
      const auto& a = recorders_[0]->lists();
      const auto& b = recorders_[r]->lists();
      EXPECT_EQ(a.size(), b.size()) << "rank " << r;
      for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) bad += a[i] != b[i] ? 1 : 0;
    }
    return bad;
  }
  size_t calls() const { return recorders_[0]->lists().size(); }

  // Selection-cache counters of every rank (each read on its rank's thread).
  std::vector<SelectionCacheCounters> Counters() const {
    std::vector<SelectionCacheCounters> out(recorders_.size());
    const absl::Status read = model_->RunOnRanks([&](int rank, CudaModel* shard) -> absl::Status {
      ASSIGN_OR_RETURN(out[rank], recorders_[rank]->inner()->CacheCounters(shard->stream()));
      return absl::OkStatus();
    });
    EXPECT_TRUE(read.ok()) << read;
    return out;
  }

 private:
  TpCudaModel* model_;
  std::vector<std::unique_ptr<ListRecorder>> recorders_;
  std::vector<CudaAttentionProvider*> ptrs_;
};

// invariant: both models with TP-invariant numerics for S = tp (CudaModelOptions::
// invariant_shards), where TP must give one GPU's logits bit for bit.
struct TpCase {
  std::string model;
  int tp;
  bool invariant = false;
  bool fp8 = false;  // both models with an FP8 (e4m3) KV cache
};

std::string CaseName(const ::testing::TestParamInfo<TpCase>& info) {
  std::string name = info.param.model + "_tp" + std::to_string(info.param.tp) +
                     (info.param.invariant ? "_invariant" : "") + (info.param.fp8 ? "_fp8" : "");
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

class TpModelTest : public ::testing::TestWithParam<TpCase> {
 protected:
  void SetUp() override {
    const int devices = DeviceCount();
    if (devices < GetParam().tp) {
      GTEST_SKIP() << "needs " << GetParam().tp << " GPUs, " << devices << " present";
    }
    if (Trained()) {
      auto trained = gpu_test::LoadTrainedCheckpoint();
      ASSERT_TRUE(trained.ok()) << trained.status();
      config_ = trained->config;
      weights_ = std::make_unique<ModelWeights>(std::move(trained->weights));
    } else {
      auto config = TestConfig(GetParam().model);
      ASSERT_TRUE(config.ok()) << config.status();
      config_ = *config;
      auto weights = gpu_test::QuietWeights(config_);
      ASSERT_TRUE(weights.ok()) << weights.status();
      weights_ = std::make_unique<ModelWeights>(*std::move(weights));
    }
    one_ = MakeModel(1, true);
    ASSERT_NE(one_, nullptr);
    tp_ = MakeModel(GetParam().tp, true);
    ASSERT_NE(tp_, nullptr);
  }

  std::unique_ptr<TpCudaModel> MakeModel(int tp, bool graphs) {
    TpCudaModelOptions options;
    options.tp_size = tp;
    options.model.max_tokens = kMaxTokens;
    options.model.max_chunk = kChunk;
    options.model.max_batch = 8;
    options.model.use_graphs = graphs;
    options.model.invariant_shards = Shards();
    options.model.kv_dtype = KvDtype();
    auto model = TpCudaModel::Create(config_, *weights_, options);
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? std::move(*model) : nullptr;
  }

  bool Trained() const { return GetParam().model == kTrainedModel; }

  // The greedy case's prompts: 20 random ones, or the trained checkpoint's golden prompts that
  // fit kMaxTokens with 32 new tokens.
  std::vector<std::vector<int32_t>> GreedyPrompts() const {
    std::vector<std::vector<int32_t>> out;
    if (!Trained()) {
      for (int i = 0; i < 20; ++i) out.push_back(Prompt(40 + 23 * i, 1000 + i, config_.vocab_size));
      return out;
    }
    auto golden = gpu_test::TrainedPrompts();
    EXPECT_TRUE(golden.ok()) << golden.status();
    if (!golden.ok()) return out;
    for (gpu_test::TrainedPrompt& p : *golden) {
      if (static_cast<int64_t>(p.ids.size()) + 32 <= kMaxTokens) out.push_back(std::move(p.ids));
    }
    return out;
  }

  int Shards() const { return GetParam().invariant ? GetParam().tp : 0; }
  KvCacheDType KvDtype() const {
    return GetParam().fp8 ? KvCacheDType::kFP8E4M3 : KvCacheDType::kBF16;
  }

  // With TP-invariant numerics TP's logits are one GPU's, bit for bit.
  void ExpectInvariance(const std::vector<float>& tp, const std::vector<float>& one,
                        const char* what) {
    if (!GetParam().invariant) return;
    EXPECT_TRUE(tp == one) << what << ": TP-invariant logits differ from one GPU's";
  }

  // The policy the batch and graph tests run: TokenSelect (votes all-reduced, the selection
  // cache's gathered cosine) where the scoring kernels run, streaming otherwise.
  SelectionPolicyKind MainPolicy() const {
    return config_.head_dim == 64 || config_.head_dim == 128 ? SelectionPolicyKind::kTokenSelect
                                                             : SelectionPolicyKind::kStreaming;
  }

  std::vector<SelectionPolicyKind> Policies() const {
    std::vector<SelectionPolicyKind> out = {SelectionPolicyKind::kDense,
                                            SelectionPolicyKind::kStreaming};
    if (config_.head_dim == 64 || config_.head_dim == 128) {
      out.push_back(SelectionPolicyKind::kTokenSelect);
      out.push_back(SelectionPolicyKind::kQuest);
      // The cascade's votes take tokenselect's path, the head vote's summed logits topk's and
      // its vote counts are exact (TP-invariant numerics included).
      out.push_back(SelectionPolicyKind::kCascade);
      out.push_back(SelectionPolicyKind::kHeadVote);
      // InfLLM and tokenselect_span have no TP-invariant numerics (CudaSelectionAttention::
      // Create refuses them).
      if (!GetParam().invariant) {
        out.push_back(SelectionPolicyKind::kInfLlm);
        out.push_back(SelectionPolicyKind::kTokenSelectSpan);
      }
    }
    return out;
  }

  // Every rank's logits of the last step equal rank 0's, bit for bit.
  void ExpectRanksAgree(const TpCudaModel& model, const std::vector<float>& rank0) {
    for (int r = 1; r < model.size(); ++r) {
      ASSERT_EQ(model.rank_logits(r).size(), rank0.size());
      EXPECT_TRUE(std::equal(rank0.begin(), rank0.end(), model.rank_logits(r).begin()))
          << "rank " << r << " logits differ from rank 0's";
    }
  }

  ModelConfig config_;
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<TpCudaModel> one_, tp_;
};

// Chunked prefill of several lengths, then 8 teacher-forced decode steps: logits against one
// GPU's, and equal on all ranks.
TEST_P(TpModelTest, LogitsMatchOneGpu) {
  for (SelectionPolicyKind policy : Policies()) {
    const SelectionOptions sel = SmallBudget(policy);
    double worst_prefill = 0, worst_decode = 0;
    for (int64_t n : {1, 63, 64, 65, 200, 517}) {
      const std::vector<int32_t> prompt = Prompt(n, n, config_.vocab_size);
      RankProviders p1(one_.get(), sel), pn(tp_.get(), sel);
      auto s1 = one_->NewSequence(kMaxTokens);
      auto sn = tp_->NewSequence(kMaxTokens);
      ASSERT_TRUE(s1.ok() && sn.ok());
      std::vector<float> l1, ln;
      for (int64_t begin = 0; begin < n; begin += kChunk) {
        const int64_t len = std::min<int64_t>(kChunk, n - begin);
        const bool last = begin + len == n;
        const auto chunk = absl::MakeConstSpan(prompt).subspan(begin, len);
        ASSERT_TRUE(one_->Forward(s1->get(), chunk, p1.get(), last ? &l1 : nullptr).ok());
        const absl::Status st = tp_->Forward(sn->get(), chunk, pn.get(), last ? &ln : nullptr);
        ASSERT_TRUE(st.ok()) << st;
      }
      worst_prefill =
          std::max(worst_prefill, gpu_test::RelativeL2(ln.data(), l1.data(), l1.size()));
      ExpectRanksAgree(*tp_, ln);
      ExpectInvariance(ln, l1, "prefill");
      for (int step = 0; step < 8; ++step) {
        auto next = one_->GreedyToken();
        ASSERT_TRUE(next.ok());
        const int32_t token = *next;
        ASSERT_TRUE(one_->Forward(s1->get(), absl::MakeConstSpan(&token, 1), p1.get(), &l1).ok());
        ASSERT_TRUE(tp_->Forward(sn->get(), absl::MakeConstSpan(&token, 1), pn.get(), &ln).ok());
        worst_decode =
            std::max(worst_decode, gpu_test::RelativeL2(ln.data(), l1.data(), l1.size()));
        ExpectRanksAgree(*tp_, ln);
        ExpectInvariance(ln, l1, "decode");
      }
      EXPECT_EQ(pn.RankMismatches(), 0) << PolicyName(policy) << " n=" << n;
    }
    EXPECT_LE(worst_prefill, 2e-2) << PolicyName(policy);
    // InfLLM's representatives are a block's tokens with the most received attention. On these
    // random models attention is nearly uniform, so neighbours' received attention differs by
    // about its rounding, and TP's other summation order can swap a representative and with it
    // a chosen block: decode steps after such a swap part further (0.069 on llama3-rope, two
    // H200s, thirty-fifth session; 0.0024-0.0033 on the other models). Bounded as a near-tie
    // (gpu_test::NearTieBound), and the greedy test below bounds where continuations part.
    // tokenselect_span likewise: its spans come from thresholding the chunk map, whose head sum
    // TP takes in another order, so a near-tie there moves a span and the kept tokens with it.
    // The cascade too: its boundary comparisons of EMA attention scores are near-ties on these
    // models, which the votes' other summation order can decide the other way.
    const double decode_bound = policy == SelectionPolicyKind::kInfLlm ||
                                        policy == SelectionPolicyKind::kTokenSelectSpan ||
                                        policy == SelectionPolicyKind::kCascade
                                    ? gpu_test::NearTieBound(policy)
                                    : 2e-2;
    EXPECT_LE(worst_decode, decode_bound) << PolicyName(policy);
    std::printf("%s TP=%d %s: logits rel L2 vs 1 GPU, worst prefill %.3g, worst decode %.3g\n",
                GetParam().model.c_str(), GetParam().tp, std::string(PolicyName(policy)).c_str(),
                worst_prefill, worst_decode);
  }
}

// Free-running greedy generation: chunked prefill, then 32 tokens, on one GPU and on TP ranks.
// Greedy 32-token continuations of 20 prompts (the trained checkpoint: its golden prompts), TP
// against one GPU. Where a continuation differs, the line printed says how close the two tokens
// were at the first difference: the 1-GPU logit gap between its token and TP's, next to the
// step's largest logit difference between the two models and the median top-1/top-2 gap of the
// 1-GPU steps (how far apart the best two tokens usually are). On the random-weight models the
// differences come at near-ties.
TEST_P(TpModelTest, GreedyContinuationsMatchOneGpuAndRanksSelectAlike) {
  struct Run {
    std::vector<int32_t> tokens;
    std::vector<std::vector<float>> logits;  // [step]: the logits the step's token came from
  };
  auto generate = [&](TpCudaModel* model, RankProviders* providers,
                      const std::vector<int32_t>& prompt) -> Run {
    Run run;
    auto seq = model->NewSequence(kMaxTokens);
    EXPECT_TRUE(seq.ok());
    if (!seq.ok()) return run;
    std::vector<float> logits;
    for (size_t begin = 0; begin < prompt.size(); begin += kChunk) {
      const size_t len = std::min<size_t>(kChunk, prompt.size() - begin);
      const bool last = begin + len == prompt.size();
      const absl::Status st =
          model->Forward(seq->get(), absl::MakeConstSpan(prompt).subspan(begin, len),
                         providers->get(), last ? &logits : nullptr);
      EXPECT_TRUE(st.ok()) << st;
      if (!st.ok()) return run;
    }
    std::vector<int32_t>& out = run.tokens;
    for (int i = 0; i < 32; ++i) {
      auto next = model->GreedyToken();
      EXPECT_TRUE(next.ok());
      if (!next.ok()) return run;
      out.push_back(*next);
      run.logits.push_back(logits);
      if (i == 31) break;
      const absl::Status st = model->Forward(seq->get(), absl::MakeConstSpan(&out.back(), 1),
                                             providers->get(), &logits);
      EXPECT_TRUE(st.ok()) << st;
      if (!st.ok()) return run;
    }
    ExpectRanksAgree(*model, logits);
    return run;
  };
  auto top_gap = [](const std::vector<float>& l) {
    float a = -INFINITY, b = -INFINITY;
    for (float v : l) {
      if (v > a) {
        b = a;
        a = v;
      } else if (v > b) {
        b = v;
      }
    }
    return a - b;
  };
  for (SelectionPolicyKind policy : Policies()) {
    const SelectionOptions sel = SmallBudget(policy);
    int same = 0, total = 0;
    int64_t mismatched_lists = 0, lists = 0, hits = 0, lookups = 0;
    std::vector<float> gaps;  // the 1-GPU top-1/top-2 gap of every step
    std::vector<std::string> differences;
    float worst_flip = 0;  // the largest 1-GPU gap between the two tokens where runs part
    const std::vector<std::vector<int32_t>> prompts = GreedyPrompts();
    for (int i = 0; i < static_cast<int>(prompts.size()); ++i) {
      const std::vector<int32_t>& prompt = prompts[i];
      RankProviders p1(one_.get(), sel), pn(tp_.get(), sel);
      const Run want = generate(one_.get(), &p1, prompt);
      const Run got = generate(tp_.get(), &pn, prompt);
      for (const auto& l : want.logits) gaps.push_back(top_gap(l));
      ++total;
      if (GetParam().invariant) {
        EXPECT_TRUE(got.logits == want.logits)
            << PolicyName(policy) << ", prompt " << i << ": TP-invariant logits differ";
      }
      if (got.tokens == want.tokens) {
        ++same;
      } else {
        const size_t first = gpu_test::FirstDifference(got.tokens, want.tokens);
        std::string line = absl::StrFormat("prompt %d (%zu tokens): first difference at token %zu",
                                           i, prompt.size(), first);
        if (first < got.logits.size() && first < want.logits.size()) {
          const std::vector<float>& a = want.logits[first];
          const std::vector<float>& b = got.logits[first];
          float worst = 0;
          for (size_t v = 0; v < a.size() && v < b.size(); ++v) {
            worst = std::max(worst, std::fabs(a[v] - b[v]));
          }
          const float flip = a[want.tokens[first]] - a[got.tokens[first]];
          worst_flip = std::max(worst_flip, flip);
          line += absl::StrFormat(
              ", 1-GPU gap between the two tokens %.4f, largest logit difference of the step %.4f",
              flip, worst);
        } else {
          worst_flip = INFINITY;
        }
        differences.push_back(line);
      }
      mismatched_lists += pn.RankMismatches();
      lists += static_cast<int64_t>(pn.calls());
      const std::vector<SelectionCacheCounters> counters = pn.Counters();
      for (size_t r = 1; r < counters.size(); ++r) {
        EXPECT_EQ(counters[r].hits, counters[0].hits) << "rank " << r << ", prompt " << i;
        EXPECT_EQ(counters[r].misses, counters[0].misses) << "rank " << r << ", prompt " << i;
      }
      hits += counters[0].hits;
      lookups += counters[0].lookups();
    }
    std::sort(gaps.begin(), gaps.end());
    for (const std::string& line : differences) {
      std::printf("  %s %s (median top-1/top-2 gap of the 1-GPU steps %.4f)\n",
                  std::string(PolicyName(policy)).c_str(), line.c_str(),
                  gaps.empty() ? 0.0f : gaps[gaps.size() / 2]);
    }
    EXPECT_EQ(mismatched_lists, 0) << PolicyName(policy);
    // The bound (the file comment): all with TP-invariant numerics, 95% on the trained
    // checkpoint, regression floors on the random-weight presets (70% for dense and streaming,
    // 50% where a flipped vote also changes the selection).
    const bool scores = gpu_test::ScoresKeys(policy);
    const int percent = GetParam().invariant ? 100 : Trained() ? 95 : scores ? 50 : 70;
    EXPECT_GE(total, Trained() ? 30 : 20);
    EXPECT_GE(same * 100, total * percent)
        << PolicyName(policy) << ": identical on " << same << " of " << total;
    // Every run that parts from one GPU's must part at a near-tie of one GPU's logits
    // (gpu_test::NearTieBound, as gpu_cuda_generation_test against the CPU): twenty-sixth
    // session, default numerics, at most 0.0010 for dense, 0.0017 streaming, 0.0047 TokenSelect
    // and 0.041 Quest at TP=2 (2 x H200), 0.0004 / 0.011 / 0.041 for streaming / TokenSelect /
    // Quest at TP=4 (4 x H200).
    EXPECT_LE(worst_flip, gpu_test::NearTieBound(policy)) << PolicyName(policy);
    std::printf(
        "%s TP=%d %s: identical greedy continuations on %d of %d prompts; attention "
        "lists differing between ranks: %lld of %lld; selection cache %lld hits of %lld "
        "lookups (rank 0)\n",
        GetParam().model.c_str(), GetParam().tp, std::string(PolicyName(policy)).c_str(), same,
        total, static_cast<long long>(mismatched_lists), static_cast<long long>(lists),
        static_cast<long long>(hits), static_cast<long long>(lookups));
  }
}

// Several sequences in one DecodeBatch step: TP against one GPU, rank 0 against the others.
TEST_P(TpModelTest, DecodeBatchMatchesOneGpu) {
  const SelectionOptions sel = SmallBudget(MainPolicy());
  constexpr int kBatch = 3;
  std::vector<std::unique_ptr<RankProviders>> p1, pn;
  std::vector<std::unique_ptr<TpSequence>> s1, sn;
  std::vector<int32_t> next;
  for (int b = 0; b < kBatch; ++b) {
    p1.push_back(std::make_unique<RankProviders>(one_.get(), sel));
    pn.push_back(std::make_unique<RankProviders>(tp_.get(), sel));
    auto a = one_->NewSequence(320);  // 3 x 20 pages of the 64
    auto c = tp_->NewSequence(320);
    ASSERT_TRUE(a.ok() && c.ok());
    const std::vector<int32_t> prompt = Prompt(150 + 50 * b, 7 + b, config_.vocab_size);
    std::vector<float> logits;
    for (size_t begin = 0; begin < prompt.size(); begin += kChunk) {
      const size_t len = std::min<size_t>(kChunk, prompt.size() - begin);
      const auto chunk = absl::MakeConstSpan(prompt).subspan(begin, len);
      const bool last = begin + len == prompt.size();
      ASSERT_TRUE(one_->Forward(a->get(), chunk, p1.back()->get(), last ? &logits : nullptr).ok());
      ASSERT_TRUE(tp_->Forward(c->get(), chunk, pn.back()->get(), nullptr).ok());
    }
    next.push_back(*one_->GreedyToken());
    s1.push_back(std::move(*a));
    sn.push_back(std::move(*c));
  }
  auto rows = [&](const std::vector<std::unique_ptr<TpSequence>>& s) {
    std::vector<TpSequence*> out;
    for (const auto& q : s) out.push_back(q.get());
    return out;
  };
  auto providers = [&](const std::vector<std::unique_ptr<RankProviders>>& p, int ranks) {
    std::vector<std::vector<CudaAttentionProvider*>> out(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
      for (const auto& q : p) out[r].push_back(q->get()[r]);
    }
    return out;
  };
  double worst = 0;
  for (int step = 0; step < 8; ++step) {
    std::vector<float> l1, ln;
    ASSERT_TRUE(one_->DecodeBatch(rows(s1), next, providers(p1, 1), &l1).ok());
    const absl::Status st = tp_->DecodeBatch(rows(sn), next, providers(pn, tp_->size()), &ln);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(l1.size(), ln.size());
    worst = std::max(worst, gpu_test::RelativeL2(ln.data(), l1.data(), l1.size()));
    ExpectRanksAgree(*tp_, ln);
    ExpectInvariance(ln, l1, "DecodeBatch");
    auto ids = one_->GreedyTokens();
    ASSERT_TRUE(ids.ok());
    next = *ids;
  }
  for (const auto& p : pn) EXPECT_EQ(p->RankMismatches(), 0);
  EXPECT_LE(worst, 2e-2);
  std::printf("%s TP=%d DecodeBatch of %d (%s): logits rel L2 vs 1 GPU worst %.3g\n",
              GetParam().model.c_str(), GetParam().tp, kBatch,
              std::string(PolicyName(sel.policy)).c_str(), worst);
}

// Decode steps replayed from CUDA graphs (with the all-reduces captured) give the same logits as
// eager launches, bit for bit; and TpCudaModel with one rank is the plain CudaModel.
TEST_P(TpModelTest, GraphsMatchEagerAndOneRankIsThePlainModel) {
  std::unique_ptr<TpCudaModel> eager = MakeModel(GetParam().tp, false);
  ASSERT_NE(eager, nullptr);
  const SelectionOptions sel = SmallBudget(MainPolicy());
  RankProviders pg(tp_.get(), sel), pe(eager.get(), sel);
  auto sg = tp_->NewSequence(kMaxTokens);
  auto se = eager->NewSequence(kMaxTokens);
  ASSERT_TRUE(sg.ok() && se.ok());
  const std::vector<int32_t> prompt = Prompt(300, 5, config_.vocab_size);
  std::vector<float> lg, le;
  for (size_t begin = 0; begin < prompt.size(); begin += kChunk) {
    const size_t len = std::min<size_t>(kChunk, prompt.size() - begin);
    const auto chunk = absl::MakeConstSpan(prompt).subspan(begin, len);
    ASSERT_TRUE(tp_->Forward(sg->get(), chunk, pg.get(), &lg).ok());
    ASSERT_TRUE(eager->Forward(se->get(), chunk, pe.get(), &le).ok());
  }
  // Bit for bit with 2 ranks (a + b is exact whatever NCCL's algorithm); with more, NCCL may
  // sum in another order inside a graph, so there the bound is rounding.
  int identical = 0;
  double worst = 0;
  for (int step = 0; step < 12; ++step) {
    auto next = tp_->GreedyToken();
    ASSERT_TRUE(next.ok());
    const int32_t token = *next;
    ASSERT_TRUE(tp_->Forward(sg->get(), absl::MakeConstSpan(&token, 1), pg.get(), &lg).ok());
    ASSERT_TRUE(eager->Forward(se->get(), absl::MakeConstSpan(&token, 1), pe.get(), &le).ok());
    identical += lg == le ? 1 : 0;
    worst = std::max(worst, gpu_test::RelativeL2(lg.data(), le.data(), le.size()));
  }
  if (GetParam().tp == 2) {
    EXPECT_EQ(identical, 12);
  }
  EXPECT_LE(worst, 1e-4);
  std::printf("%s TP=%d graphs vs eager: %d of 12 decode steps bit-identical, worst rel L2 %.3g\n",
              GetParam().model.c_str(), GetParam().tp, identical, worst);

  // One rank: the same logits as CudaModel itself on device 0.
  CudaModelOptions plain_options;
  plain_options.max_tokens = kMaxTokens;
  plain_options.max_chunk = kChunk;
  plain_options.max_batch = 8;
  plain_options.invariant_shards = Shards();
  plain_options.kv_dtype = KvDtype();
  TS_CUDA_CHECK(cudaSetDevice(0));
  auto plain = CudaModel::Create(config_, *weights_, plain_options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto sp = (*plain)->NewSequence(kMaxTokens);
  auto s1 = one_->NewSequence(kMaxTokens);
  ASSERT_TRUE(sp.ok() && s1.ok());
  std::vector<float> lp, l1;
  for (size_t begin = 0; begin < prompt.size(); begin += kChunk) {
    const size_t len = std::min<size_t>(kChunk, prompt.size() - begin);
    const auto chunk = absl::MakeConstSpan(prompt).subspan(begin, len);
    ASSERT_TRUE((*plain)->Forward(sp->get(), chunk, nullptr, &lp).ok());
    ASSERT_TRUE(one_->Forward(s1->get(), chunk, {}, &l1).ok());
  }
  EXPECT_EQ(lp, l1);
  EXPECT_EQ(one_->shard(0)->config().num_heads, config_.num_heads);
}

// The serving backend over the sharded model (what `--tp` runs): K/V read from a runner of one
// tensor-parallel size and written into a runner of another goes through the host format of
// the whole model (every KV head), byte for byte both ways, and decoding continues from it:
// prefill on TP=N then decode on one GPU, and the reverse, against TP=N doing both.
TEST_P(TpModelTest, KvMovesBetweenTpSizesThroughTheBackend) {
  CudaBackend one(one_.get());
  CudaBackend tp(tp_.get());
  EXPECT_EQ(tp.tp_size(), GetParam().tp);
  EXPECT_FALSE(tp.device_cache().has_value());  // device links are one GPU's
  EXPECT_EQ(tp.kv_layout().num_kv_heads, config_.num_kv_heads);
  SelectionOptions selection = SmallBudget(MainPolicy());
  selection.chunk_size = kChunk;
  constexpr int64_t kNew = 12;
  // Greedy continuation of `runner` after its prefill produced `logits`.
  auto continue_greedy = [&](SequenceRunner* runner, std::vector<float> logits) {
    std::vector<int32_t> out;
    for (int64_t i = 0; i < kNew; ++i) {
      const int32_t next = static_cast<int32_t>(
          std::max_element(logits.begin(), logits.end()) - logits.begin());
      out.push_back(next);
      const absl::Status st = runner->Forward(std::vector<int32_t>{next}, &logits);
      EXPECT_TRUE(st.ok()) << st;
      if (!st.ok()) break;
    }
    return out;
  };
  auto prefill = [&](GenerationBackend* backend, const std::vector<int32_t>& prompt,
                     std::vector<float>* logits) {
    auto runner = backend->Start(static_cast<int64_t>(prompt.size()) + kNew + 1, selection);
    EXPECT_TRUE(runner.ok()) << runner.status();
    for (size_t b = 0; runner.ok() && b < prompt.size(); b += kChunk) {
      const size_t n = std::min<size_t>(kChunk, prompt.size() - b);
      const absl::Status st = (*runner)->Forward(
          absl::MakeConstSpan(prompt).subspan(b, n), b + n == prompt.size() ? logits : nullptr);
      EXPECT_TRUE(st.ok()) << st;
    }
    return runner.ok() ? std::move(*runner) : nullptr;
  };
  // Moves every layer of positions [0, len) from `from` into a new runner of `to`.
  auto move = [&](SequenceRunner* from, GenerationBackend* to, int64_t len, KvBlock* sent) {
    KvBlockRange range{0, static_cast<int32_t>(config_.num_layers), 0, len};
    auto block = from->kv()->Encode(range, 1, /*checksum=*/true);
    EXPECT_TRUE(block.ok()) << block.status();
    auto runner = to->Start(len + kNew + 1, selection);
    EXPECT_TRUE(runner.ok()) << runner.status();
    if (!block.ok() || !runner.ok()) return std::unique_ptr<SequenceRunner>();
    EXPECT_TRUE((*runner)->kv()->Write(*block).ok());
    EXPECT_TRUE((*runner)->kv()->Commit(len).ok());
    auto back = (*runner)->kv()->Encode(range, 1, true);
    EXPECT_TRUE(back.ok()) << back.status();
    if (back.ok()) {
      EXPECT_TRUE(back->data == block->data) << "K/V changed on the way through the host format";
    }
    *sent = *std::move(block);
    return std::move(*runner);
  };
  int same_tp_to_one = 0, same_one_to_tp = 0;
  const int kPrompts = 4;
  for (int p = 0; p < kPrompts; ++p) {
    const std::vector<int32_t> prompt = Prompt(97 + 131 * p, 7 + p, config_.vocab_size);
    const int64_t len = static_cast<int64_t>(prompt.size());
    std::vector<float> tp_logits, one_logits;
    auto on_tp = prefill(&tp, prompt, &tp_logits);
    auto on_one = prefill(&one, prompt, &one_logits);
    ASSERT_TRUE(on_tp && on_one);
    KvBlock from_tp, from_one;
    auto tp_to_one = move(on_tp.get(), &one, len, &from_tp);
    auto one_to_tp = move(on_one.get(), &tp, len, &from_one);
    ASSERT_TRUE(tp_to_one && one_to_tp);
    // Same shape and nearly the same values (bf16 roundings of two summation orders).
    ASSERT_EQ(from_tp.data.size(), from_one.data.size());
    const std::vector<int32_t> reference = continue_greedy(on_tp.get(), tp_logits);
    const std::vector<int32_t> a = continue_greedy(tp_to_one.get(), tp_logits);
    const std::vector<int32_t> b = continue_greedy(one_to_tp.get(), one_logits);
    same_tp_to_one += a == reference ? 1 : 0;
    same_one_to_tp += b == reference ? 1 : 0;
  }
  printf("%s TP=%d backend: K/V TP=%d -> 1 GPU: %d/%d continuations as TP=%d; 1 GPU -> TP=%d: "
         "%d/%d\n",
         GetParam().model.c_str(), GetParam().tp, GetParam().tp, same_tp_to_one, kPrompts,
         GetParam().tp, GetParam().tp, same_one_to_tp, kPrompts);
  EXPECT_GE(same_tp_to_one, kPrompts - 1);
  EXPECT_GE(same_one_to_tp, kPrompts - 1);
}

std::vector<TpCase> Cases() {
  std::vector<TpCase> out = {{"llama-gqa", 2},      {"llama-gqa-bias", 2},  {"qwen2-bias", 2},
                             {"llama3-rope", 2},    {"llama3-rope-kv4", 2}, {"qwen2-bias", 4},
                             {"llama3-rope-kv4", 4}, {kTrainedModel, 2}};
  const size_t plain = out.size();
  for (size_t i = 0; i < plain; ++i) out.push_back({out[i].model, out[i].tp, true});
  out.push_back({"llama3-rope", 2, true, true});  // TP-invariant with an FP8 KV cache
  return out;
}

INSTANTIATE_TEST_SUITE_P(Models, TpModelTest, ::testing::ValuesIn(Cases()), CaseName);

// Sizes that do not divide the heads or the MLP are refused, naming the field, before any GPU
// is touched.
TEST(TpShapesTest, NonDividingSizesAreInvalidArguments) {
  PresetOptions preset;
  auto gqa = PresetConfig("llama-gqa", preset);  // 8 heads, 2 KV heads, intermediate 512
  ASSERT_TRUE(gqa.ok());
  auto expect_field = [](const absl::Status& st, const char* field) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(field), std::string::npos) << st;
  };
  expect_field(CudaModel::ShardConfig(*gqa, 3).status(), "num_attention_heads");
  expect_field(CudaModel::ShardConfig(*gqa, 4).status(), "num_key_value_heads");
  ModelConfig odd_mlp = *gqa;
  odd_mlp.intermediate_size = 510;
  expect_field(CudaModel::ShardConfig(odd_mlp, 4).status(), "num_key_value_heads");
  odd_mlp.num_kv_heads = 4;
  expect_field(CudaModel::ShardConfig(odd_mlp, 4).status(), "intermediate_size");
  EXPECT_EQ(CudaModel::ShardConfig(*gqa, 0).status().code(), absl::StatusCode::kInvalidArgument);
  auto shard = CudaModel::ShardConfig(*gqa, 2);
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ(shard->num_heads, 4);
  EXPECT_EQ(shard->num_kv_heads, 1);
  EXPECT_EQ(shard->intermediate_size, 256);
  EXPECT_EQ(shard->hidden_size, gqa->hidden_size);

  TpCudaModelOptions options;
  options.tp_size = 4;
  auto refused = TpCudaModel::CreateDummy(*gqa, DummyWeightOptions{}, options);
  ASSERT_FALSE(refused.ok());
  expect_field(refused.status(), "num_key_value_heads");
  options.tp_size = 2;
  options.devices = {0};
  EXPECT_EQ(TpCudaModel::CreateDummy(*gqa, DummyWeightOptions{}, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaSelectionAttention::Create(SmallBudget(SelectionPolicyKind::kDense), *gqa, 64, 8,
                                           /*tp_size=*/0)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // TP-invariant numerics: S must be 1, 2 or 4, a multiple of the TP size, and divide the KV
  // heads into the rank's groups.
  for (auto [tp, shards] : {std::pair{1, 3}, std::pair{2, 1}, std::pair{1, 8}, std::pair{1, 4}}) {
    expect_field(CudaSelectionAttention::Create(SmallBudget(SelectionPolicyKind::kQuest), *gqa,
                                                64, 8, tp, shards)
                     .status(),
                 "invariant_shards");
  }
}

// A rank that fails in the middle of a call, while the other waits for it (in the launch
// barrier before an all-reduce), does not hang the process: after the grace period the group is
// aborted, the call returns the failed rank's error and the model refuses later calls. Errors
// every rank hits alike (bad arguments) leave the model usable. This test's model is made with
// CreateDummy and runs no one-GPU model first, so its first step is each GPU's first use of
// its GEMM kernels: without the launch barrier it hung there (one GPU spinning in an all-reduce,
// the other rank's thread blocked in a CUDA call that waits for that GPU).
TEST(TpFailureTest, OneRankFailingMidStepAbortsTheGroupInsteadOfHanging) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs";
  PresetOptions preset;
  auto config = PresetConfig("llama-gqa", preset);
  ASSERT_TRUE(config.ok());
  TpCudaModelOptions options;
  options.tp_size = 2;
  options.model.max_tokens = 256;
  options.abort_grace_ms = 2000;
  auto made = TpCudaModel::CreateDummy(*config, DummyWeightOptions{}, options);
  ASSERT_TRUE(made.ok()) << made.status();
  TpCudaModel& model = **made;
  auto seq = model.NewSequence(64);
  ASSERT_TRUE(seq.ok()) << seq.status();
  std::vector<float> logits;
  // The same bad argument on every rank: an error, and the group stays usable.
  const std::vector<int32_t> bad = {1, static_cast<int32_t>(config->vocab_size + 5)};
  EXPECT_EQ(model.Forward(seq->get(), bad, {}, &logits).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(model.Forward(seq->get(), std::vector<int32_t>{1, 2, 3}, {}, &logits).ok());

  const auto start = std::chrono::steady_clock::now();
  const absl::Status failed = model.RunOnRanks([](int rank, CudaModel* shard) -> absl::Status {
    if (rank == 1) return absl::InternalError("injected failure");
    float* value = nullptr;
    if (cudaMalloc(reinterpret_cast<void**>(&value), sizeof(float)) != cudaSuccess) {
      return absl::InternalError("cudaMalloc");
    }
    absl::Status st = shard->options().tp->AllReduceSum(value, 1, shard->stream());
    if (st.ok() && cudaStreamSynchronize(shard->stream()) != cudaSuccess) {
      st = absl::InternalError("sync");
    }
    cudaFree(value);
    return st;
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  EXPECT_NE(failed.message().find("rank 1"), std::string::npos) << failed;
  EXPECT_NE(failed.message().find("injected failure"), std::string::npos) << failed;
  EXPECT_LT(seconds, 30.0);
  printf("one rank failing: the group aborted after %.2f s (grace 2 s)\n", seconds);
  const absl::Status after = model.Forward(seq->get(), std::vector<int32_t>{4}, {}, &logits);
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition) << after;
  EXPECT_NE(after.message().find("aborted"), std::string::npos) << after;
}

}  // namespace
}  // namespace tokenselect::engine
