#include "common/ids.h"

#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "gmock/gmock.h"

namespace tokenselect::common {
namespace {

TEST(IdsTest, FormatIsPrefixDashSixteenHex) {
  EXPECT_THAT(NewId("req"), ::testing::MatchesRegex("req-[0-9a-f]{16}"));
}

TEST(IdsTest, UniqueAcrossThreads) {
  absl::Mutex mu;
  std::set<std::string> ids;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 5000; ++i) {
        std::string id = NewId("lease");
        absl::MutexLock lock(&mu);
        ids.insert(std::move(id));
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ids.size(), 20000u);
}

}  // namespace
}  // namespace tokenselect::common
