// The router's selection checks: wire policy numbers map onto params policies by name, and a
// request's selection fields are validated by params::ValidateSelectionOptions.
#include "router/request_spec.h"

#include <optional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/dispatch_service.h"
#include "rpc/proto_params.h"

namespace tokenselect::router {
namespace {

using ::testing::HasSubstr;

TEST(SelectionPolicyNumberTest, EveryWirePolicyRoundTrips) {
  // tokenselect.v1.SelectionPolicy: UNSPECIFIED = 0, then TOKENSELECT = 1 .. CASCADE = 9.
  for (int number = 1; number <= 9; ++number) {
    absl::StatusOr<std::optional<params::SelectionPolicyKind>> kind =
        rpc::SelectionPolicyFromNumber(number);
    ASSERT_TRUE(kind.ok()) << number << ": " << kind.status();
    ASSERT_TRUE(kind->has_value()) << number;
    EXPECT_EQ(rpc::SelectionPolicyNumber(**kind), number);
  }
  EXPECT_EQ(*rpc::SelectionPolicyFromNumber(2), params::SelectionPolicyKind::kTopK);
  EXPECT_EQ(*rpc::SelectionPolicyFromNumber(6), params::SelectionPolicyKind::kTokenSelectSpan);
}

TEST(SelectionPolicyNumberTest, UnspecifiedIsTheWorkersDefault) {
  absl::StatusOr<std::optional<params::SelectionPolicyKind>> kind =
      rpc::SelectionPolicyFromNumber(0);
  ASSERT_TRUE(kind.ok()) << kind.status();
  EXPECT_FALSE(kind->has_value());
}

TEST(SelectionPolicyNumberTest, UnknownNumberNamesTheField) {
  for (int number : {-1, 10, 99}) {
    absl::StatusOr<std::optional<params::SelectionPolicyKind>> kind =
        rpc::SelectionPolicyFromNumber(number);
    ASSERT_FALSE(kind.ok()) << number;
    EXPECT_EQ(kind.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(kind.status().message()), HasSubstr("selection.policy"));
  }
}

TEST(ValidateSelectionTest, UnsetFieldsAreValid) {
  EXPECT_TRUE(ValidateSelection(SelectionSpec{}).ok());
}

TEST(ValidateSelectionTest, SetFieldsUseTheSharedMessages) {
  SelectionSpec spec;
  spec.k = -3;
  EXPECT_EQ(ValidateSelection(spec).message(), "selection.k must be >= 0, got -3");
  spec = SelectionSpec{};
  spec.chunk_size = 0;
  EXPECT_THAT(std::string(ValidateSelection(spec).message()), HasSubstr("selection.chunk_size"));
  spec = SelectionSpec{};
  spec.theta = -2;
  EXPECT_THAT(std::string(ValidateSelection(spec).message()), HasSubstr("selection.theta"));
}

TEST(ValidateSelectionTest, BudgetSumCountsOnlyTheSetFields) {
  SelectionSpec spec;
  spec.k = params::kMaxSelectionTokens;  // valid alone: the worker's defaults decide the sum
  EXPECT_TRUE(ValidateSelection(spec).ok());
  spec.n_init = 1;
  EXPECT_THAT(std::string(ValidateSelection(spec).message()),
              HasSubstr("selection.n_init + selection.k + selection.n_local"));
}

}  // namespace
}  // namespace tokenselect::router
