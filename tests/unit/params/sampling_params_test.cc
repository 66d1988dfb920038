#include "params/sampling_params.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tokenselect::params {
namespace {

constexpr int kVocab = 1000;

TEST(SamplingParamsTest, DefaultsAreValidAndNeutral) {
  SamplingParams params;
  EXPECT_TRUE(Validate(params, kVocab).ok());
  EXPECT_FALSE(HasPenalties(params));
  params.presence_penalty = 0.5f;
  EXPECT_TRUE(HasPenalties(params));
}

TEST(SamplingParamsTest, AcceptsBoundaryValues) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.top_p = 1.0f;
  params.min_p = 1.0f;
  params.top_k = -1;
  params.frequency_penalty = -2.0f;
  params.presence_penalty = 2.0f;
  params.max_new_tokens = 1;
  params.stop_token_ids = {0, kVocab - 1};
  params.stop = std::vector<std::string>(kMaxStopStrings, "x");
  params.stop[0] = std::string(kMaxStopStringBytes, 'a');
  params.stop[1] = "\xe6\x97\xa5\xf0\x9f\x98\x80";  // U+65E5, U+1F600
  params.logprobs = true;
  params.top_logprobs = kMaxTopLogprobs;
  EXPECT_TRUE(Validate(params, kVocab).ok()) << Validate(params, kVocab);
  params.top_k = 5 * kVocab;  // larger than the vocab: keeps everything, not an error
  EXPECT_TRUE(Validate(params, kVocab).ok());
}

struct BadCase {
  std::function<void(SamplingParams*)> mutate;
  std::string message;
};

TEST(SamplingParamsTest, EveryErrorNamesItsFieldAndValue) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<BadCase> cases = {
      {[](SamplingParams* p) { p->temperature = -0.5f; },
       "sampling.temperature must be a finite number >= 0, got -0.5"},
      {[&](SamplingParams* p) { p->temperature = nan; },
       "sampling.temperature must be a finite number >= 0, got nan"},
      {[&](SamplingParams* p) { p->temperature = inf; },
       "sampling.temperature must be a finite number >= 0, got inf"},
      {[](SamplingParams* p) { p->top_p = 1.5f; }, "sampling.top_p must be in (0, 1], got 1.5"},
      {[](SamplingParams* p) { p->top_p = 0.0f; }, "sampling.top_p must be in (0, 1], got 0"},
      {[&](SamplingParams* p) { p->top_p = nan; }, "sampling.top_p must be in (0, 1], got nan"},
      {[](SamplingParams* p) { p->min_p = -0.1f; }, "sampling.min_p must be in [0, 1], got -0.1"},
      {[](SamplingParams* p) { p->min_p = 1.25f; }, "sampling.min_p must be in [0, 1], got 1.25"},
      {[](SamplingParams* p) { p->top_k = -2; },
       "sampling.top_k must be >= -1 (0 or -1 disable it), got -2"},
      {[](SamplingParams* p) { p->repetition_penalty = 0.0f; },
       "sampling.repetition_penalty must be a finite number > 0, got 0"},
      {[](SamplingParams* p) { p->repetition_penalty = -1.0f; },
       "sampling.repetition_penalty must be a finite number > 0, got -1"},
      {[](SamplingParams* p) { p->frequency_penalty = 2.5f; },
       "sampling.frequency_penalty must be in [-2, 2], got 2.5"},
      {[](SamplingParams* p) { p->presence_penalty = -3.0f; },
       "sampling.presence_penalty must be in [-2, 2], got -3"},
      {[](SamplingParams* p) { p->max_new_tokens = 0; },
       "sampling.max_new_tokens must be >= 1, got 0"},
      {[](SamplingParams* p) {
         p->stop_token_ids = {5, kVocab};
       },
       "sampling.stop_token_ids[1] must be a token id in [0, 1000), got 1000"},
      {[](SamplingParams* p) { p->stop_token_ids = {-1}; },
       "sampling.stop_token_ids[0] must be a token id in [0, 1000), got -1"},
      {[](SamplingParams* p) {
         p->stop = {"a", ""};
       },
       "sampling.stop[1] must not be empty, got \"\""},
      {[](SamplingParams* p) { p->stop = std::vector<std::string>(kMaxStopStrings + 1, "x"); },
       "sampling.stop must hold at most 16 strings, got 17 strings"},
      {[](SamplingParams* p) { p->stop = {std::string(kMaxStopStringBytes + 1, 'a')}; },
       "sampling.stop[0] must be at most 1024 bytes, got 1025 bytes"},
      {[](SamplingParams* p) {
         p->stop = {"ok", "\xc3"};
       },  // truncated 2-byte sequence
       "sampling.stop[1] must be valid UTF-8, got invalid byte sequence"},
      {[](SamplingParams* p) { p->stop = {"\xed\xa0\x80"}; },  // a UTF-16 surrogate
       "sampling.stop[0] must be valid UTF-8, got invalid byte sequence"},
      {[](SamplingParams* p) { p->stop = {"\xc0\xaf"}; },  // overlong '/'
       "sampling.stop[0] must be valid UTF-8, got invalid byte sequence"},
      {[](SamplingParams* p) {
         p->logprobs = true;
         p->top_logprobs = 21;
       },
       "sampling.top_logprobs must be in [0, 20], got 21"},
      {[](SamplingParams* p) {
         p->logprobs = true;
         p->top_logprobs = -1;
       },
       "sampling.top_logprobs must be in [0, 20], got -1"},
      {[](SamplingParams* p) { p->top_logprobs = 3; },
       "sampling.top_logprobs must be 0 unless sampling.logprobs is true, got 3"},
  };
  for (const BadCase& c : cases) {
    SamplingParams params;
    c.mutate(&params);
    absl::Status status = Validate(params, kVocab);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(status.message(), c.message);
  }
}

TEST(SamplingParamsTest, RejectsNonPositiveVocab) {
  absl::Status status = Validate(SamplingParams(), 0);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "vocab_size must be positive, got 0");
}

}  // namespace
}  // namespace tokenselect::params
