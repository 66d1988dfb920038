#include "common/logging.h"

#include <memory>
#include <sstream>

#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"

namespace tokenselect::common {
namespace {

TEST(LoggingTest, SetLogLevelAcceptsKnownNamesAndRejectsOthers) {
  EXPECT_TRUE(SetLogLevel("debug").ok());
  EXPECT_EQ(spdlog::get_level(), spdlog::level::debug);
  EXPECT_TRUE(SetLogLevel("off").ok());
  EXPECT_EQ(spdlog::get_level(), spdlog::level::off);
  absl::Status bad = SetLogLevel("verbose");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("verbose"), absl::string_view::npos);
  EXPECT_EQ(spdlog::get_level(), spdlog::level::off);  // unchanged by a bad name
  ASSERT_TRUE(SetLogLevel("info").ok());
}

TEST(LoggingTest, LevelFiltersMessages) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink));
  ASSERT_TRUE(SetLogLevel("warn").ok());
  TS_LOG(INFO, "hidden {}", 1);
  TS_LOG(WARN, "shown {}", 2);
  spdlog::set_default_logger(previous);
  ASSERT_TRUE(SetLogLevel("info").ok());
  EXPECT_EQ(out.str().find("hidden"), std::string::npos);
  EXPECT_NE(out.str().find("shown 2"), std::string::npos);
}

TEST(LoggingDeathTest, CheckFailureAbortsWithConditionAndMessage) {
  int pages = 3;
  EXPECT_DEATH(TS_CHECK(pages == 4, "pool has {} pages", pages),
               "check failed: pages == 4: pool has 3 pages");
  TS_CHECK(pages == 3);  // passes silently
}

}  // namespace
}  // namespace tokenselect::common
