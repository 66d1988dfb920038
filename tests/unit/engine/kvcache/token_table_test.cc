#include "engine/kvcache/token_table.h"

#include <memory>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

using ::testing::ElementsAre;

std::unique_ptr<PagePool> MakePool(int64_t num_pages) {
  PagePoolOptions options;
  options.num_pages = num_pages;
  options.page_size = 4;
  options.num_layers = 1;
  options.num_kv_heads = 1;
  options.head_dim = 2;
  return PagePool::Create(options).value();
}

TEST(TokenTableTest, AppendGrowsByPagesAndMapsSlots) {
  auto pool = MakePool(8);
  // Take page 0 first so that the table's pages are not simply 0, 1, 2.
  std::vector<int32_t> other = pool->Allocate(1, "other").value();
  TokenTable table(pool.get(), "req");
  EXPECT_EQ(table.Append(3).value(), 0);
  EXPECT_EQ(table.length(), 3);
  EXPECT_EQ(table.capacity(), 4);
  EXPECT_THAT(table.pages(), ElementsAre(1));
  EXPECT_EQ(table.Append(6).value(), 3);
  EXPECT_EQ(table.length(), 9);
  EXPECT_THAT(table.pages(), ElementsAre(1, 2, 3));
  EXPECT_EQ(table.Slot(0), 4);
  EXPECT_EQ(table.Slot(3), 7);
  EXPECT_EQ(table.Slot(4), 8);
  EXPECT_EQ(table.Slot(8), 12);
  EXPECT_THAT(table.Slots(2, 9), ElementsAre(6, 7, 8, 9, 10, 11, 12));
  EXPECT_THAT(table.Slots(5, 5), ElementsAre());
  EXPECT_EQ(pool->num_used_pages(), 4);
  ASSERT_TRUE(pool->Free(other).ok());
}

TEST(TokenTableTest, SlotsFollowNonContiguousPages) {
  auto pool = MakePool(8);
  std::vector<int32_t> a = pool->Allocate(2, "a").value();  // pages 0, 1
  TokenTable table(pool.get(), "req");
  ASSERT_TRUE(table.Append(2).ok());                        // page 2
  std::vector<int32_t> b = pool->Allocate(1, "b").value();  // page 3
  ASSERT_TRUE(table.Append(4).ok());                        // page 4
  EXPECT_THAT(table.pages(), ElementsAre(2, 4));
  EXPECT_THAT(table.Slots(0, 6), ElementsAre(8, 9, 10, 11, 16, 17));
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(table.Slot(i), table.Slots(i, i + 1)[0]);
  ASSERT_TRUE(pool->Free(a).ok());
  ASSERT_TRUE(pool->Free(b).ok());
}

TEST(TokenTableTest, ReserveIsAbsoluteAndExhaustionLeavesTableUnchanged) {
  auto pool = MakePool(3);
  TokenTable table(pool.get(), "req");
  ASSERT_TRUE(table.Reserve(5).ok());
  EXPECT_EQ(table.capacity(), 8);
  EXPECT_EQ(table.length(), 0);
  ASSERT_TRUE(table.Reserve(2).ok());  // already there
  EXPECT_EQ(table.capacity(), 8);
  ASSERT_TRUE(table.Append(7).ok());
  auto too_long = table.Append(6);  // needs 13 tokens = 4 pages, pool has 3
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(table.length(), 7);
  EXPECT_EQ(table.capacity(), 8);
  EXPECT_EQ(pool->num_used_pages(), 2);
  EXPECT_EQ(table.Append(5).value(), 7);
  EXPECT_EQ(pool->num_free_pages(), 0);
}

TEST(TokenTableTest, ReleaseTruncateAndDestructorReturnPages) {
  auto pool = MakePool(4);
  {
    TokenTable table(pool.get(), "req");
    ASSERT_TRUE(table.Append(10).ok());
    table.Truncate(6);
    EXPECT_EQ(table.length(), 6);
    EXPECT_EQ(table.capacity(), 12);
    table.Release();
    EXPECT_EQ(table.length(), 0);
    EXPECT_EQ(table.capacity(), 0);
    EXPECT_EQ(pool->num_free_pages(), 4);
    table.Release();  // twice is fine
    ASSERT_TRUE(table.Append(5).ok());
    EXPECT_FALSE(pool->CheckNoLeaks().ok());
  }
  EXPECT_TRUE(pool->CheckNoLeaks().ok());
}

TEST(TokenTableTest, MoveTransfersOwnership) {
  auto pool = MakePool(4);
  TokenTable a(pool.get(), "req");
  ASSERT_TRUE(a.Append(5).ok());
  TokenTable b = std::move(a);
  EXPECT_EQ(b.length(), 5);
  EXPECT_EQ(pool->num_used_pages(), 2);
  TokenTable c(pool.get(), "other");
  ASSERT_TRUE(c.Append(1).ok());
  c = std::move(b);  // c's own page goes back first
  EXPECT_EQ(c.length(), 5);
  EXPECT_EQ(pool->num_used_pages(), 2);
  c.Release();
  EXPECT_TRUE(pool->CheckNoLeaks().ok());
}

}  // namespace
}  // namespace tokenselect::engine
