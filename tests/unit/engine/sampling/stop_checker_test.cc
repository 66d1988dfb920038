#include "engine/sampling/stop_checker.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/sampling/prng.h"
#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

constexpr int32_t kEos = 2;
constexpr int32_t kText = 100;  // any id that is not a stop token

SamplingParams WithStops(std::vector<std::string> stop, bool include = false) {
  SamplingParams params;
  params.max_new_tokens = 1000;
  params.stop = std::move(stop);
  params.include_stop_str_in_output = include;
  return params;
}

// Appends one token and returns the text released by it.
std::string Step(StopChecker& checker, absl::string_view delta, int32_t id = kText) {
  absl::StatusOr<StopCheckResult> r = checker.Append(id, delta);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->text : "<error>";
}

TEST(FinishReasonTest, ToStringNamesEveryReason) {
  EXPECT_EQ(ToString(FinishReason::kNone), "none");
  EXPECT_EQ(ToString(FinishReason::kStop), "stop");
  EXPECT_EQ(ToString(FinishReason::kStopString), "stop_string");
  EXPECT_EQ(ToString(FinishReason::kLength), "length");
}

TEST(StopCheckerTest, WithoutStopsTextPassesStraightThrough) {
  StopChecker checker(WithStops({}), {kEos});
  EXPECT_EQ(Step(checker, "Hello"), "Hello");
  EXPECT_EQ(Step(checker, ""), "");
  EXPECT_EQ(Step(checker, " world"), " world");
  EXPECT_FALSE(checker.finished());
  EXPECT_EQ(checker.num_tokens(), 3);
}

TEST(StopCheckerTest, StopStringSpanningDeltasIsCutAndNeverStreamed) {
  StopChecker checker(WithStops({"STOP"}), {kEos});
  EXPECT_EQ(Step(checker, "Hello ST"), "Hello ");
  EXPECT_EQ(checker.held_back(), "ST");
  EXPECT_EQ(Step(checker, "O"), "");
  EXPECT_EQ(checker.held_back(), "STO");
  absl::StatusOr<StopCheckResult> r = checker.Append(kText, "P there");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, "");
  EXPECT_EQ(r->finish_reason, FinishReason::kStopString);
  EXPECT_EQ(checker.finish_reason(), FinishReason::kStopString);
  ASSERT_TRUE(checker.stop_string().has_value());
  EXPECT_EQ(*checker.stop_string(), "STOP");
  EXPECT_FALSE(checker.stop_token_id().has_value());
  EXPECT_EQ(checker.held_back(), "");
  EXPECT_EQ(checker.Flush(), "");
}

TEST(StopCheckerTest, HeldBackTextIsReleasedOnceItCannotMatch) {
  StopChecker checker(WithStops({"STOP"}), {kEos});
  EXPECT_EQ(Step(checker, "ST"), "");
  EXPECT_EQ(Step(checker, "AR"), "STAR");
  EXPECT_EQ(checker.held_back(), "");
  // Partially: "xab" + "cab" against "abd" holds back only the live suffix "ab" each time.
  StopChecker partial(WithStops({"abd"}), {kEos});
  EXPECT_EQ(Step(partial, "xab"), "x");
  EXPECT_EQ(Step(partial, "cab"), "abc");
  EXPECT_EQ(partial.held_back(), "ab");
  EXPECT_EQ(Step(partial, "d!"), "");
  EXPECT_EQ(partial.finish_reason(), FinishReason::kStopString);
}

TEST(StopCheckerTest, HoldbackUsesTheLongestLivePrefixAcrossStrings) {
  // "aXab": suffix "ab" is a prefix of "abc"; suffix "b" would be one of "bz" -> hold "ab".
  StopChecker checker(WithStops({"bz", "abc"}), {kEos});
  EXPECT_EQ(Step(checker, "aXab"), "aX");
  EXPECT_EQ(checker.held_back(), "ab");
  EXPECT_EQ(Step(checker, "z"), "a");  // "bz" matched: "a" is released, "bz" cut
  EXPECT_EQ(*checker.stop_string(), "bz");
}

TEST(StopCheckerTest, OverlappingStopStringsTheEarliestEndWins) {
  // "ab" completes before "abc" could: it wins whatever the list order or split.
  for (const std::vector<std::string>& stops :
       {std::vector<std::string>{"abc", "ab"}, std::vector<std::string>{"ab", "abc"}}) {
    StopChecker checker(WithStops(stops), {kEos});
    EXPECT_EQ(Step(checker, "xa"), "x");
    EXPECT_EQ(Step(checker, "bc"), "");
    EXPECT_EQ(*checker.stop_string(), "ab");
  }
  // "abc" and "bc" end at the same byte: the longer one (earlier start) wins.
  StopChecker same_end(WithStops({"bc", "abc"}), {kEos});
  EXPECT_EQ(Step(same_end, "-abc-"), "-");
  EXPECT_EQ(*same_end.stop_string(), "abc");
  // A self-overlapping stop string: "aab" inside "aaab".
  StopChecker kmp(WithStops({"aab"}), {kEos});
  EXPECT_EQ(Step(kmp, "a"), "");
  EXPECT_EQ(Step(kmp, "a"), "");
  EXPECT_EQ(Step(kmp, "a"), "a");
  EXPECT_EQ(Step(kmp, "b"), "");
  EXPECT_EQ(kmp.finish_reason(), FinishReason::kStopString);
}

TEST(StopCheckerTest, IncludeStopStringKeepsTheMatchAndHoldsNothingBack) {
  StopChecker checker(WithStops({"STOP"}, /*include=*/true), {kEos});
  EXPECT_EQ(Step(checker, "Hello ST"), "Hello ST");
  EXPECT_EQ(checker.held_back(), "");
  absl::StatusOr<StopCheckResult> r = checker.Append(kText, "OP there");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, "OP");
  EXPECT_EQ(r->finish_reason, FinishReason::kStopString);
}

TEST(StopCheckerTest, StopTokenDropsItsTextAndReleasesHeldText) {
  StopChecker checker(WithStops({"STOP"}), {kEos});
  EXPECT_EQ(Step(checker, "x ST"), "x ");
  absl::StatusOr<StopCheckResult> r = checker.Append(kEos, "</s>");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, "ST");
  EXPECT_EQ(r->finish_reason, FinishReason::kStop);
  EXPECT_EQ(checker.stop_token_id(), kEos);
  EXPECT_FALSE(checker.stop_string().has_value());

  SamplingParams params = WithStops({}, /*include=*/true);
  params.stop_token_ids = {7};
  StopChecker included(params, {kEos});
  r = included.Append(7, "<|end|>");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, "<|end|>");
  EXPECT_EQ(r->finish_reason, FinishReason::kStop);
}

TEST(StopCheckerTest, IgnoreEosSkipsOnlyTheModelsEos) {
  SamplingParams params = WithStops({});
  params.ignore_eos = true;
  params.stop_token_ids = {9};
  StopChecker checker(params, {kEos, 3});
  EXPECT_EQ(Step(checker, "a", kEos), "a");
  EXPECT_EQ(Step(checker, "b", 3), "b");
  EXPECT_FALSE(checker.finished());
  absl::StatusOr<StopCheckResult> r = checker.Append(9, "c");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish_reason, FinishReason::kStop);
  EXPECT_EQ(r->text, "");

  // An eos id listed in stop_token_ids still stops with ignore_eos.
  params.stop_token_ids = {kEos};
  StopChecker listed(params, {kEos});
  r = listed.Append(kEos, "");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish_reason, FinishReason::kStop);

  // Without ignore_eos every eos id stops.
  StopChecker plain(WithStops({}), {kEos, 3});
  r = plain.Append(3, "");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish_reason, FinishReason::kStop);
}

TEST(StopCheckerTest, MaxNewTokensEndsWithLengthAndReleasesEverything) {
  SamplingParams params = WithStops({"STOP"});
  params.max_new_tokens = 3;
  StopChecker checker(params, {kEos});
  EXPECT_EQ(Step(checker, "a"), "a");
  EXPECT_EQ(Step(checker, "b"), "b");
  absl::StatusOr<StopCheckResult> r = checker.Append(kText, "cST");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, "cST");  // no more tokens can complete "STOP"
  EXPECT_EQ(r->finish_reason, FinishReason::kLength);
  EXPECT_EQ(checker.num_tokens(), 3);
}

TEST(StopCheckerTest, PrecedenceStopTokenThenStopStringThenLength) {
  SamplingParams params = WithStops({"end"});
  params.max_new_tokens = 2;
  StopChecker checker(params, {kEos});
  EXPECT_EQ(Step(checker, "the e"), "the ");
  absl::StatusOr<StopCheckResult> r = checker.Append(kText, "nd");  // last token, completes "end"
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish_reason, FinishReason::kStopString);
  EXPECT_EQ(r->text, "");

  StopChecker both(params, {kEos});
  EXPECT_EQ(Step(both, "e"), "");
  r = both.Append(kEos, "nd");  // an eos whose text would complete "end"
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish_reason, FinishReason::kStop);
  EXPECT_EQ(r->text, "e");
}

TEST(StopCheckerTest, NothingMayFollowAFinishOrAFlush) {
  StopChecker checker(WithStops({}), {kEos});
  ASSERT_TRUE(checker.Append(kEos, "").ok());
  absl::StatusOr<StopCheckResult> r = checker.Append(kText, "x");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(), "token appended after generation finished (stop)");

  StopChecker flushed(WithStops({"STOP"}), {kEos});
  EXPECT_EQ(Step(flushed, "abS"), "ab");
  EXPECT_EQ(flushed.Flush(), "S");  // e.g. cancelled: the held text goes out
  EXPECT_EQ(flushed.Append(kText, "TOP").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(StopCheckerTest, MultiByteStopStringsCutOnCharacterBoundaries) {
  StopChecker checker(WithStops({"\xe6\x97\xa5\xe6\x9c\xac"}), {kEos});  // U+65E5 U+672C
  EXPECT_EQ(Step(checker, "ok \xe6\x97\xa5"), "ok ");
  EXPECT_EQ(Step(checker, "\xe6\x9c\xac!"), "");
  EXPECT_EQ(checker.finish_reason(), FinishReason::kStopString);
}

// Brute-force model of the contract over random texts, stop sets and splits (including empty
// deltas): the released text is the text cut before (or after) the earliest-ending match, and
// what is held back is exactly the longest suffix that is a proper prefix of some stop string.
TEST(StopCheckerTest, MatchesABruteForceModelOnRandomSplits) {
  const std::vector<std::string> pool = {"abc", "bca", "cc", "aab", "abab", "c", "baab"};
  Prng prng(4242);
  auto below = [&prng](uint64_t n) { return static_cast<size_t>(prng.Next() % n); };
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::string> stops;
    for (const std::string& s : pool) {
      if (below(3) == 0) stops.push_back(s);
    }
    const bool include = below(2) == 0;
    std::string text;
    const size_t length = below(24);
    for (size_t i = 0; i < length; ++i) text.push_back("abcx"[below(4)]);

    // Expected: earliest end over all stops, longest on a tie.
    size_t best_end = std::string::npos, best_len = 0;
    for (const std::string& s : stops) {
      const size_t pos = text.find(s);
      if (pos == std::string::npos) continue;
      const size_t end = pos + s.size();
      if (end < best_end || (end == best_end && s.size() > best_len)) {
        best_end = end;
        best_len = s.size();
      }
    }
    const std::string expected = best_end == std::string::npos ? text
                                 : include                     ? text.substr(0, best_end)
                                           : text.substr(0, best_end - best_len);

    StopChecker checker(WithStops(stops, include), {kEos});
    std::string released, seen;
    size_t pos = 0;
    while (pos < text.size() && !checker.finished()) {
      const size_t n = std::min(below(4), text.size() - pos);
      released += Step(checker, absl::string_view(text).substr(pos, n));
      seen += text.substr(pos, n);
      pos += n;
      if (checker.finished()) break;
      ASSERT_EQ(released + std::string(checker.held_back()), seen);
      size_t hold = 0;
      if (!include) {
        for (const std::string& s : stops) {
          for (size_t k = std::min(s.size() - 1, seen.size()); k > hold; --k) {
            if (seen.compare(seen.size() - k, k, s, 0, k) == 0) {
              hold = k;
              break;
            }
          }
        }
      }
      ASSERT_EQ(checker.held_back().size(), hold) << "seen '" << seen << "'";
    }
    released += checker.Flush();
    ASSERT_EQ(released, expected) << "text '" << text << "' include " << include;
    EXPECT_EQ(checker.finished(), best_end != std::string::npos);
  }
}

}  // namespace
}  // namespace tokenselect::engine
