#include "engine/kvcache/page_pool.h"

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

PagePoolOptions SmallOptions(int64_t num_pages = 8) {
  PagePoolOptions options;
  options.num_pages = num_pages;
  options.page_size = 4;
  options.num_layers = 2;
  options.num_kv_heads = 2;
  options.head_dim = 8;
  return options;
}

TEST(PagePoolTest, CreateValidatesEveryField) {
  for (int field = 0; field < 5; ++field) {
    PagePoolOptions options = SmallOptions();
    const char* name = nullptr;
    switch (field) {
      case 0:
        options.num_pages = 0, name = "num_pages";
        break;
      case 1:
        options.page_size = -1, name = "page_size";
        break;
      case 2:
        options.num_layers = 0, name = "num_layers";
        break;
      case 3:
        options.num_kv_heads = 0, name = "num_kv_heads";
        break;
      default:
        options.head_dim = 0, name = "head_dim";
        break;
    }
    auto pool = PagePool::Create(options);
    ASSERT_FALSE(pool.ok());
    EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(pool.status().message(), HasSubstr(name));
  }
  PagePoolOptions huge = SmallOptions();
  huge.num_pages = int64_t{1} << 30;
  huge.page_size = 16;
  auto pool = PagePool::Create(huge);
  ASSERT_FALSE(pool.ok());
  EXPECT_THAT(pool.status().message(), HasSubstr("int32 slot range"));
}

TEST(PagePoolTest, GeometryAndZeroedStorage) {
  auto pool = PagePool::Create(SmallOptions()).value();
  EXPECT_EQ(pool->num_slots(), 32);
  EXPECT_EQ(pool->slot_stride(), 16);
  EXPECT_EQ(pool->storage_bytes(), 2 * 2 * 32 * 16 * 4);
  for (int64_t layer = 0; layer < 2; ++layer) {
    EXPECT_TRUE(
        std::all_of(pool->k(layer), pool->k(layer) + 32 * 16, [](float x) { return x == 0.0f; }));
    EXPECT_NE(pool->k(layer), pool->v(layer));
  }
  EXPECT_NE(pool->k(0), pool->k(1));
}

TEST(PagePoolTest, AllocateFreeAndCounts) {
  auto pool = PagePool::Create(SmallOptions()).value();
  EXPECT_EQ(pool->num_free_pages(), 8);
  auto a = pool->Allocate(3, "req-a");
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(*a, ElementsAre(0, 1, 2));
  EXPECT_EQ(pool->num_used_pages(), 3);
  EXPECT_DOUBLE_EQ(pool->usage_ratio(), 3.0 / 8.0);
  auto b = pool->Allocate(5, "req-b");
  ASSERT_TRUE(b.ok());
  EXPECT_THAT(*b, ElementsAre(3, 4, 5, 6, 7));
  EXPECT_EQ(pool->num_free_pages(), 0);
  ASSERT_TRUE(pool->Free(*a).ok());
  EXPECT_EQ(pool->num_free_pages(), 3);
  // Freed pages are reused.
  auto c = pool->Allocate(3, "req-c");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(std::set<int32_t>(c->begin(), c->end()), (std::set<int32_t>{0, 1, 2}));
  auto empty = pool->Allocate(0, "req-d");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(PagePoolTest, ExhaustionIsAllOrNothing) {
  auto pool = PagePool::Create(SmallOptions()).value();
  ASSERT_TRUE(pool->Allocate(6, "req-a").ok());
  auto too_many = pool->Allocate(3, "req-b");
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(too_many.status().message(), "KV cache full: req-b needs 3 pages, 2 of 8 are free");
  EXPECT_EQ(pool->num_free_pages(), 2);
  EXPECT_TRUE(pool->Allocate(2, "req-b").ok());
  EXPECT_EQ(pool->Allocate(-1, "x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PagePoolTest, BadFreesChangeNothing) {
  auto pool = PagePool::Create(SmallOptions()).value();
  std::vector<int32_t> pages = pool->Allocate(2, "req-a").value();
  const std::vector<int32_t> out_of_range = {pages[0], 8};
  absl::Status s = pool->Free(out_of_range);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("page 8 is out of range [0, 8)"));
  const std::vector<int32_t> twice = {pages[0], pages[0]};
  EXPECT_THAT(pool->Free(twice).message(), HasSubstr("listed twice"));
  const std::vector<int32_t> not_allocated = {pages[1], 5};
  EXPECT_THAT(pool->Free(not_allocated).message(), HasSubstr("page 5 is not allocated"));
  EXPECT_EQ(pool->num_used_pages(), 2);
  ASSERT_TRUE(pool->Free(pages).ok());
  EXPECT_THAT(pool->Free(pages).message(), HasSubstr("double free"));
  EXPECT_EQ(pool->num_free_pages(), 8);
}

TEST(PagePoolTest, LeakCheckNamesOwnersAndPages) {
  auto pool = PagePool::Create(SmallOptions()).value();
  EXPECT_TRUE(pool->CheckNoLeaks().ok());
  std::vector<int32_t> a = pool->Allocate(2, "req-a").value();
  std::vector<int32_t> b = pool->Allocate(1, "req-b").value();
  absl::Status leak = pool->CheckNoLeaks();
  EXPECT_EQ(leak.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(leak.message(),
            "page pool: 3 pages still owned: req-a: 2 pages [0, 1]; req-b: 1 pages [2]");
  ASSERT_TRUE(pool->Free(a).ok());
  ASSERT_TRUE(pool->Free(b).ok());
  EXPECT_TRUE(pool->CheckNoLeaks().ok());
}

TEST(PagePoolTest, ConcurrentAllocateAndFreeNeverDoubleBooks) {
  auto pool = PagePool::Create(SmallOptions(64)).value();
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 500; ++round) {
        auto pages = pool->Allocate(1 + (round + t) % 5, "worker");
        if (!pages.ok()) continue;  // momentarily full is fine
        if (!pool->Free(*pages).ok()) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_TRUE(pool->CheckNoLeaks().ok());
}

}  // namespace
}  // namespace tokenselect::engine
