#include "common/status.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace tokenselect::common {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError(absl::StrCat(x, " is odd"));
  return x / 2;
}

absl::Status CheckEven(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return absl::OkStatus();
}

int g_evaluations = 0;
absl::Status CountedCheck(int x) {
  ++g_evaluations;
  return CheckEven(x);
}

absl::Status UseReturnIfError(int x, bool* reached_end) {
  RETURN_IF_ERROR(CountedCheck(x));
  RETURN_IF_ERROR(Half(x));  // StatusOr works too
  *reached_end = true;
  return absl::OkStatus();
}

absl::StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int half, Half(x));
  ASSIGN_OR_RETURN(int quarter, Half(half), _.WithPrefix("second halving: "));
  return quarter;
}

absl::StatusOr<std::unique_ptr<int>> MakeBox(int x) {
  if (x < 0) return absl::OutOfRangeError("negative");
  return std::make_unique<int>(x);
}

absl::StatusOr<int> Unbox(int x) {
  ASSIGN_OR_RETURN(std::unique_ptr<int> box, MakeBox(x));  // move-only values are moved
  return *box;
}

TEST(StatusTest, ReturnIfErrorPassesOkAndReturnsErrorsEvaluatingOnce) {
  bool reached = false;
  g_evaluations = 0;
  EXPECT_TRUE(UseReturnIfError(4, &reached).ok());
  EXPECT_TRUE(reached);
  EXPECT_EQ(g_evaluations, 1);

  reached = false;
  absl::Status s = UseReturnIfError(3, &reached);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd");
  EXPECT_FALSE(reached);
  EXPECT_EQ(g_evaluations, 2);
}

TEST(StatusTest, AssignOrReturnAssignsAndPrefixes) {
  EXPECT_EQ(*Quarter(8), 2);
  absl::StatusOr<int> first = Quarter(3);
  EXPECT_EQ(first.status().message(), "3 is odd");
  absl::StatusOr<int> second = Quarter(6);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(second.status().message(), "second halving: 3 is odd");
}

TEST(StatusTest, AssignOrReturnMovesMoveOnlyValues) {
  EXPECT_EQ(*Unbox(7), 7);
  EXPECT_EQ(Unbox(-1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(StatusTest, AnnotateKeepsCodeAndPayloadsAndLeavesOkAlone) {
  absl::Status s = absl::NotFoundError("tensor missing");
  s.SetPayload("type.tokenselect/field", absl::Cord("model"));
  absl::Status a = Annotate(s, "loading: ");
  EXPECT_EQ(a.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a.message(), "loading: tensor missing");
  ASSERT_TRUE(a.GetPayload("type.tokenselect/field").has_value());
  EXPECT_EQ(*a.GetPayload("type.tokenselect/field"), "model");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "x").ok());
}

}  // namespace
}  // namespace tokenselect::common
