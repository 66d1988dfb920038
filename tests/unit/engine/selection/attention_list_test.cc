#include "engine/selection/attention_list.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<int32_t> SlotsPlus100(int64_t n) {
  std::vector<int32_t> slots(n);
  for (int64_t t = 0; t < n; ++t) slots[t] = static_cast<int32_t>(100 + t);
  return slots;
}

// The worked example of attention_list.h.
TEST(AttentionListTest, HandWorkedPrefillChunk) {
  AttentionList list;
  ASSERT_TRUE(BuildAttentionList({0, 1, 5, 8, 9}, SlotsPlus100(13), 10, 3, &list).ok());
  EXPECT_THAT(list.kv_slots, ElementsAre(100, 101, 105, 108, 109, 110, 111, 112));
  EXPECT_THAT(list.kv_positions, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_THAT(list.q_positions, ElementsAre(5, 6, 7));
  EXPECT_THAT(list.visible, ElementsAre(6, 7, 8));
  EXPECT_EQ(list.kv_slots.size(), 8u);
  EXPECT_EQ(list.q_positions.size(), 3u);

}

TEST(AttentionListTest, DecodeStepAndScatteredSlots) {
  // Token t in slot 3 * (20 - t); N = 20, selected {2, 19}, one new token 20 in slot 0.
  std::vector<int32_t> slots(21);
  for (int t = 0; t <= 20; ++t) slots[t] = 3 * (20 - t);
  AttentionList list;
  ASSERT_TRUE(BuildAttentionList({2, 19}, slots, 20, 1, &list).ok());
  EXPECT_THAT(list.kv_slots, ElementsAre(54, 3, 0));
  EXPECT_THAT(list.kv_positions, ElementsAre(0, 1, 2));
  EXPECT_THAT(list.q_positions, ElementsAre(2));
  EXPECT_THAT(list.visible, ElementsAre(3));
}

TEST(AttentionListTest, FirstChunkHasNoCachedTokens) {
  AttentionList list;
  ASSERT_TRUE(BuildAttentionList({}, SlotsPlus100(4), 0, 4, &list).ok());
  EXPECT_THAT(list.kv_slots, ElementsAre(100, 101, 102, 103));
  EXPECT_THAT(list.q_positions, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(list.visible, ElementsAre(1, 2, 3, 4));
  ASSERT_TRUE(BuildAttentionList({0, 1}, SlotsPlus100(4), 4, 0, &list).ok());
  EXPECT_THAT(list.kv_slots, ElementsAre(100, 101));
  EXPECT_THAT(list.q_positions, IsEmpty());
}

TEST(AttentionListTest, RejectsBadInput) {
  AttentionList list;
  auto message = [&](std::vector<int32_t> selected, int64_t slots, int64_t n, int64_t c) {
    absl::Status s = BuildAttentionList(selected, SlotsPlus100(slots), n, c, &list);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.message());
  };
  EXPECT_THAT(message({1, 1}, 13, 10, 3), HasSubstr("selected[1]"));
  EXPECT_THAT(message({3, 2}, 13, 10, 3), HasSubstr("selected[1]"));
  EXPECT_THAT(message({10}, 13, 10, 3), HasSubstr("selected[0]"));
  EXPECT_THAT(message({-1}, 13, 10, 3), HasSubstr("selected[0]"));
  EXPECT_THAT(message({0}, 12, 10, 3), HasSubstr("token_slots"));
  EXPECT_THAT(message({0}, 13, 10, -1), HasSubstr("chunk_len"));
}

}  // namespace
}  // namespace tokenselect::engine
