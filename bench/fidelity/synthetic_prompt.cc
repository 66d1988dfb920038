#include "bench/fidelity/synthetic_prompt.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tokenselect::bench {
namespace {

// splitmix64: a portable, seedable stream (no std:: distributions, whose output varies).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int64_t Below(int64_t n) { return static_cast<int64_t>(Next() % static_cast<uint64_t>(n)); }

 private:
  uint64_t state_;
};

const char* const kAdjectives[] = {"silver", "red",   "quiet", "heavy",  "bright", "old",
                                   "narrow", "green", "warm",  "broken", "tiny",   "golden"};
const char* const kNouns[] = {"lantern", "key",   "ledger", "compass", "kettle", "map",
                              "violin",  "clock", "anchor", "mirror",  "basket", "letter"};

struct Record {
  int64_t id;
  const char* adjective;
  const char* noun;
  int64_t box;
};

std::string Line(const Record& r) {
  return absl::StrCat("Record ", r.id, ": the ", r.adjective, " ", r.noun, " is kept in box ",
                      r.box, ".\n");
}

std::string Question(const Record& r) {
  return absl::StrCat("Question: where is the ", r.adjective, " ", r.noun, " of record ", r.id,
                      "? Answer: it is kept in box");
}

std::vector<Record> Records(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<Record> records;
  for (int64_t i = 0; i < n; ++i) {
    records.push_back(
        {i + 1, kAdjectives[rng.Below(12)], kNouns[rng.Below(12)], 100 + rng.Below(900)});
  }
  return records;
}

// The body: every record once, and every fourth line a repeat of a random earlier record.
std::string Body(const std::vector<Record>& records, uint64_t seed) {
  Rng rng(seed ^ 0x5EEDull);
  std::string text;
  for (size_t i = 0; i < records.size(); ++i) {
    text += Line(records[i]);
    if (i % 4 == 3) text += Line(records[rng.Below(static_cast<int64_t>(i))]);
  }
  return text;
}

}  // namespace

std::string SyntheticText(int64_t num_records, uint64_t seed) {
  const std::vector<Record> records = Records(std::max<int64_t>(num_records, 1), seed);
  return Body(records, seed) + Question(records[records.size() / 8]);
}

std::vector<int32_t> SyntheticPromptFromText(const tokenizer::Tokenizer& tok, int64_t num_tokens,
                                             uint64_t seed) {
  // Lines are ~12-20 tokens; make enough records and cut the body.
  const int64_t num_records = num_tokens / 8 + 8;
  const std::vector<Record> records = Records(num_records, seed);
  std::vector<int32_t> ids = tok.Encode(Body(records, seed), /*add_special_tokens=*/true);
  // Ask about a record that survives the cut: one from the first eighth of the kept part.
  const std::vector<int32_t> question =
      tok.Encode(Question(records[std::max<int64_t>(1, num_tokens / 160)]), false);
  const int64_t body = std::max<int64_t>(0, num_tokens - static_cast<int64_t>(question.size()));
  ids.resize(std::min<int64_t>(body, static_cast<int64_t>(ids.size())));
  ids.insert(ids.end(), question.begin(), question.end());
  ids.resize(num_tokens, ids.empty() ? 0 : ids.back());
  return ids;
}

std::vector<int32_t> SyntheticPromptIds(int64_t vocab_size, int64_t num_tokens, uint64_t seed) {
  Rng rng(seed);
  constexpr int64_t kPhrases = 64, kPhraseLen = 12;
  std::vector<int32_t> phrases(kPhrases * kPhraseLen);
  for (int32_t& id : phrases) id = static_cast<int32_t>(rng.Below(vocab_size));
  std::vector<int32_t> ids;
  ids.reserve(num_tokens);
  while (static_cast<int64_t>(ids.size()) < num_tokens) {
    const int64_t p = rng.Below(kPhrases);
    for (int64_t j = 0; j < kPhraseLen && static_cast<int64_t>(ids.size()) < num_tokens; ++j) {
      ids.push_back(phrases[p * kPhraseLen + j]);
    }
  }
  return ids;
}

}  // namespace tokenselect::bench
