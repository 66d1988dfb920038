#include "engine/selection/selected_set.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(SelectedSetTest, BudgetCoversAllAtTheBoundary) {
  SelectionOptions options;
  options.n_init = 4;
  options.k = 8;
  options.n_local = 2;
  EXPECT_TRUE(BudgetCoversAll(options, 0));
  EXPECT_TRUE(BudgetCoversAll(options, 13));
  EXPECT_TRUE(BudgetCoversAll(options, 14));
  EXPECT_FALSE(BudgetCoversAll(options, 15));
}

TEST(SelectedSetTest, InitPicksLocalInOrder) {
  SelectionResult r;
  r.num_candidates_scored = 17;
  AssembleSelection(20, 3, 4, {5, 9, 12}, &r);
  EXPECT_THAT(r.tokens, ElementsAre(0, 1, 2, 5, 9, 12, 16, 17, 18, 19));
  EXPECT_THAT(r.picks, ElementsAre(5, 9, 12));
  EXPECT_FALSE(r.full_attention);
  EXPECT_EQ(r.num_candidates_scored, 17);  // left alone
}

TEST(SelectedSetTest, PicksOutsideTheCandidatesAreDroppedAndDuplicatesMerged) {
  SelectionResult r;
  // Candidates are [3, 16): 1 is in the init window, 16 and 18 in the local window, 25 >= N.
  AssembleSelection(20, 3, 4, {1, 7, 7, 15, 16, 18, 25}, &r);
  EXPECT_THAT(r.tokens, ElementsAre(0, 1, 2, 7, 15, 16, 17, 18, 19));
  EXPECT_THAT(r.picks, ElementsAre(7, 15));
}

TEST(SelectedSetTest, OverlappingWindowsSelectEverything) {
  SelectionResult r;
  AssembleSelection(5, 3, 4, {}, &r);
  EXPECT_THAT(r.tokens, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_TRUE(r.full_attention);
  AssembleSelection(0, 3, 4, {}, &r);
  EXPECT_THAT(r.tokens, IsEmpty());
  AssembleSelection(2, 3, 0, {}, &r);
  EXPECT_THAT(r.tokens, ElementsAre(0, 1));
}

TEST(SelectedSetTest, NoWindows) {
  SelectionResult r;
  AssembleSelection(10, 0, 0, {0, 4, 9}, &r);
  EXPECT_THAT(r.tokens, ElementsAre(0, 4, 9));
}

TEST(SelectedSetTest, SelectAll) {
  SelectionResult r;
  r.picks = {3};
  r.num_candidates_scored = 5;
  SelectAll(4, &r);
  EXPECT_THAT(r.tokens, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(r.picks, IsEmpty());
  EXPECT_TRUE(r.full_attention);
  EXPECT_EQ(r.num_candidates_scored, 0);
}

}  // namespace
}  // namespace tokenselect::engine
