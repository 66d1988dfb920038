#include "engine/sampling/penalties.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

using ::testing::ElementsAre;

SamplingParams Penalised(float repetition, float frequency, float presence) {
  SamplingParams params;
  params.repetition_penalty = repetition;
  params.frequency_penalty = frequency;
  params.presence_penalty = presence;
  return params;
}

std::vector<float> Penalise(const SamplingParams& params, std::vector<float> logits,
                            const std::vector<int32_t>& prompt,
                            const std::vector<int32_t>& generated) {
  PenaltyState state(params, static_cast<int>(logits.size()));
  EXPECT_TRUE(state.Sync(prompt, generated).ok());
  state.Apply(absl::MakeSpan(logits));
  return logits;
}

TEST(PenaltiesTest, NeutralParamsAreInactive) {
  PenaltyState state(SamplingParams(), 4);
  EXPECT_FALSE(state.active());
  std::vector<float> logits = {1, 2, 3, 4};
  EXPECT_TRUE(state.Sync({0, 1}, {2, 99}).ok());  // ids are not even read
  state.Apply(absl::MakeSpan(logits));
  EXPECT_THAT(logits, ElementsAre(1, 2, 3, 4));
}

TEST(PenaltiesTest, AllThreeMatchHandComputedLogits) {
  // prompt {0, 1}; generated {3, 3, 4}; repetition 2, frequency 0.5, presence 0.25:
  //   id 0 (prompt, positive):  2 / 2                      =  1
  //   id 1 (prompt, negative): -1 * 2                      = -2
  //   id 2 (unseen):                                          0.5
  //   id 3 (generated twice):   3 / 2 - 0.5 * 2 - 0.25     =  0.25
  //   id 4 (generated once):   -2 * 2 - 0.5 * 1 - 0.25     = -4.75
  //   id 5 (unseen):                                          1
  EXPECT_THAT(Penalise(Penalised(2.0f, 0.5f, 0.25f), {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 1.0f}, {0, 1},
                       {3, 3, 4}),
              ElementsAre(1.0f, -2.0f, 0.5f, 0.25f, -4.75f, 1.0f));
}

TEST(PenaltiesTest, RepetitionCoversPromptAndGeneratedOnce) {
  // An id repeated in prompt and output is penalised once, not per occurrence; 0 stays 0.
  EXPECT_THAT(Penalise(Penalised(4.0f, 0, 0), {8.0f, -1.0f, 0.0f, 8.0f}, {0, 0, 2}, {0, 1, 1}),
              ElementsAre(2.0f, -4.0f, 0.0f, 8.0f));
  // A penalty below 1 encourages repetition.
  EXPECT_THAT(Penalise(Penalised(0.5f, 0, 0), {8.0f, -1.0f}, {0, 1}, {}),
              ElementsAre(16.0f, -0.5f));
}

TEST(PenaltiesTest, FrequencyAndPresenceIgnoreThePrompt) {
  EXPECT_THAT(Penalise(Penalised(1.0f, 1.0f, 0.5f), {1, 1, 1}, {0, 0, 0}, {1, 1, 1}),
              ElementsAre(1.0f, 1.0f - 3.0f - 0.5f, 1.0f));
  // Negative penalties encourage.
  EXPECT_THAT(Penalise(Penalised(1.0f, -1.0f, -2.0f), {0, 0}, {}, {1}), ElementsAre(0.0f, 3.0f));
}

TEST(PenaltiesTest, MaskedTokensStayMaskedAndOverflowIsClamped) {
  const float inf = std::numeric_limits<float>::infinity();
  const float max = std::numeric_limits<float>::max();
  const std::vector<float> out =
      Penalise(Penalised(1e-30f, 1.0f, 0.0f), {-inf, max, -1.0f}, {0, 1, 2}, {0});
  EXPECT_EQ(out[0], -inf);  // repetition and frequency both apply; still masked
  EXPECT_EQ(out[1], max);   // max / 1e-30 overflows: clamped, not +inf
  EXPECT_FLOAT_EQ(out[2], -1e-30f);
}

TEST(PenaltiesTest, IncrementalSyncEqualsRebuild) {
  const SamplingParams params = Penalised(1.3f, 0.4f, 0.2f);
  const std::vector<int32_t> prompt = {5, 1, 5, 7};
  const std::vector<int32_t> generated = {2, 7, 2, 9, 2, 0};
  const std::vector<float> logits = {0.5f, -0.5f, 1.5f, 2.5f, -3.0f, 4.0f, 0.0f, 1.0f, -1.0f, 3.0f};

  PenaltyState incremental(params, 10);
  for (size_t n = 0; n <= generated.size(); ++n) {
    absl::Span<const int32_t> so_far(generated.data(), n);
    ASSERT_TRUE(incremental.Sync(prompt, so_far).ok());
    std::vector<float> a = logits;
    incremental.Apply(absl::MakeSpan(a));
    std::vector<float> b =
        Penalise(params, logits, prompt, {generated.begin(), generated.begin() + n});
    EXPECT_EQ(a, b) << "after " << n << " generated ids";
  }
  // Shrinking the generated ids (a rollback) rebuilds from scratch.
  ASSERT_TRUE(incremental.Sync(prompt, absl::Span<const int32_t>(generated.data(), 2)).ok());
  std::vector<float> a = logits;
  incremental.Apply(absl::MakeSpan(a));
  EXPECT_EQ(a, Penalise(params, logits, prompt, {2, 7}));
}

TEST(PenaltiesTest, RejectsIdsOutsideTheVocabAndRecovers) {
  PenaltyState state(Penalised(1.5f, 0, 0), 4);
  absl::Status status = state.Sync({0, 4}, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "prompt_ids[1] = 4 is not a token id in [0, 4)");
  status = state.Sync({0}, {1, -3});
  EXPECT_EQ(status.message(), "generated_ids[1] = -3 is not a token id in [0, 4)");
  ASSERT_TRUE(state.Sync({0}, {1}).ok());
  std::vector<float> logits = {3, 3, 3, 3};
  state.Apply(absl::MakeSpan(logits));
  EXPECT_THAT(logits, ElementsAre(2, 2, 3, 3));
}

}  // namespace
}  // namespace tokenselect::engine
