#include "common/flags.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gtest/gtest.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(int, test_pages, 7, "A flag defined by this test.");

namespace tokenselect::common {
namespace {

std::vector<char*> Argv(std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return argv;
}

TEST(FlagsTest, ParsesFlagsAppliesLogLevelAndReturnsPositionals) {
  std::vector<std::string> args = {"prog", "--test_pages=12", "serve", "--log_level=warn",
                                   "extra"};
  std::vector<char*> argv = Argv(args);
  auto positional = ParseFlags(static_cast<int>(argv.size()), argv.data(), "usage");
  ASSERT_TRUE(positional.ok()) << positional.status();
  EXPECT_EQ(*positional, (std::vector<std::string>{"serve", "extra"}));
  EXPECT_EQ(absl::GetFlag(FLAGS_test_pages), 12);
  EXPECT_EQ(spdlog::get_level(), spdlog::level::warn);
}

TEST(FlagsTest, DashesInFlagNamesAreUnderscoresButValuesAreKept) {
  std::vector<std::string> args = {"prog", "--test-pages", "5", "--log-level=error", "--",
                                   "--not-a-flag"};
  std::vector<char*> argv = Argv(args);
  auto positional = ParseFlags(static_cast<int>(argv.size()), argv.data(), "usage");
  ASSERT_TRUE(positional.ok()) << positional.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_test_pages), 5);
  EXPECT_EQ(spdlog::get_level(), spdlog::level::err);
  EXPECT_EQ(*positional, (std::vector<std::string>{"--not-a-flag"}));
}

TEST(FlagsTest, BadLogLevelIsAnError) {
  std::vector<std::string> args = {"prog", "--log_level=loud"};
  std::vector<char*> argv = Argv(args);
  auto positional = ParseFlags(static_cast<int>(argv.size()), argv.data(), "usage");
  EXPECT_EQ(positional.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tokenselect::common
