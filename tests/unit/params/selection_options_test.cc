#include "params/selection_options.h"

#include <cmath>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tokenselect::params {
namespace {

using ::testing::HasSubstr;

TEST(SelectionOptionsTest, DefaultsFollowTheDesign) {
  SelectionOptions options;
  EXPECT_EQ(options.policy, SelectionPolicyKind::kTokenSelect);
  EXPECT_EQ(options.n_init, 128);
  EXPECT_EQ(options.k, 2048);
  EXPECT_EQ(options.n_local, 512);
  EXPECT_DOUBLE_EQ(options.theta, 0.9);
  EXPECT_EQ(options.chunk_size, 512);
  EXPECT_FLOAT_EQ(options.scale, 1.0f);
  EXPECT_TRUE(ValidateSelectionOptions(options).ok());
}

TEST(SelectionOptionsTest, PolicyNamesRoundTrip) {
  for (SelectionPolicyKind kind : {SelectionPolicyKind::kTokenSelect, SelectionPolicyKind::kTopK,
                                   SelectionPolicyKind::kHeadVote, SelectionPolicyKind::kDense,
                                   SelectionPolicyKind::kStreaming}) {
    absl::StatusOr<SelectionPolicyKind> parsed = ParsePolicy(PolicyName(kind));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_EQ(PolicyName(SelectionPolicyKind::kTokenSelect), "tokenselect");
  EXPECT_EQ(PolicyName(SelectionPolicyKind::kTopK), "topk");
  EXPECT_EQ(PolicyName(SelectionPolicyKind::kHeadVote), "head_vote");
  EXPECT_EQ(PolicyName(SelectionPolicyKind::kDense), "dense");
  EXPECT_EQ(PolicyName(SelectionPolicyKind::kStreaming), "streaming");
}

TEST(SelectionOptionsTest, UnknownPolicyNameListsTheValidOnes) {
  for (const char* name : {"soft_vote", "TokenSelect", ""}) {
    absl::StatusOr<SelectionPolicyKind> parsed = ParsePolicy(name);
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("selection.policy"));
    EXPECT_THAT(std::string(parsed.status().message()),
                HasSubstr("tokenselect, topk, head_vote, dense, streaming"));
  }
}

// Each case breaks one field; the error must name it.
struct BadField {
  const char* field;
  void (*apply)(SelectionOptions&);
};

TEST(SelectionOptionsTest, EveryValidationErrorNamesItsField) {
  const BadField cases[] = {
      {"selection.policy", [](SelectionOptions& o) { o.policy = SelectionPolicyKind(42); }},
      {"selection.n_init", [](SelectionOptions& o) { o.n_init = -1; }},
      {"selection.n_init", [](SelectionOptions& o) { o.n_init = int64_t{1} << 40; }},
      {"selection.k", [](SelectionOptions& o) { o.k = -3; }},
      {"selection.n_local", [](SelectionOptions& o) { o.n_local = -512; }},
      {"selection.n_init + selection.k + selection.n_local",
       [](SelectionOptions& o) { o.k = kMaxSelectionTokens; }},
      {"selection.theta", [](SelectionOptions& o) { o.theta = -1.5; }},
      {"selection.theta", [](SelectionOptions& o) { o.theta = std::nan(""); }},
      {"selection.theta",
       [](SelectionOptions& o) { o.theta = std::numeric_limits<double>::infinity(); }},
      {"selection.chunk_size", [](SelectionOptions& o) { o.chunk_size = 0; }},
      {"selection.chunk_size", [](SelectionOptions& o) { o.chunk_size = -4; }},
      {"selection.scale", [](SelectionOptions& o) { o.scale = 0.0f; }},
      {"selection.scale", [](SelectionOptions& o) { o.scale = -1.0f; }},
      {"selection.scale", [](SelectionOptions& o) { o.scale = std::nanf(""); }},
  };
  for (const BadField& c : cases) {
    SelectionOptions options;
    c.apply(options);
    absl::Status status = ValidateSelectionOptions(options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.field));
  }
}

TEST(SelectionOptionsTest, ExactMessageForNegativeK) {
  SelectionOptions options;
  options.k = -3;
  EXPECT_EQ(ValidateSelectionOptions(options).message(), "selection.k must be >= 0, got -3");
}

TEST(SelectionOptionsTest, ThetaMessageExplainsTheDisableRange) {
  SelectionOptions options;
  options.theta = -2.0;
  EXPECT_THAT(std::string(ValidateSelectionOptions(options).message()),
              HasSubstr("> 1 disables the selection cache"));
}

TEST(SelectionOptionsTest, EdgeValuesAreValid) {
  SelectionOptions options;
  for (double theta : {-1.0, 0.0, 1.0, 1.01, 5.0}) {
    options.theta = theta;
    EXPECT_TRUE(ValidateSelectionOptions(options).ok()) << theta;
  }
  options = SelectionOptions();
  options.n_init = 0;
  options.k = 0;
  options.n_local = 0;
  options.chunk_size = 1;
  EXPECT_TRUE(ValidateSelectionOptions(options).ok());
}

}  // namespace
}  // namespace tokenselect::params
