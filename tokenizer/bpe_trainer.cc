#include "tokenizer/bpe_trainer.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <queue>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tokenizer/byte_level.h"
#include "tokenizer/split_pattern.h"

namespace tokenselect::tokenizer {
namespace {

using OrderedJson = nlohmann::ordered_json;

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct Word {
  std::vector<int32_t> symbols;
  int64_t count;
};

class Trainer {
 public:
  Trainer(absl::string_view corpus, int min_frequency) : min_frequency_(min_frequency) {
    for (int b = 0; b < 256; ++b) AddToken(BytesToByteLevel(std::string(1, static_cast<char>(b))));
    // Words in sorted order, so word indices (and everything below) are deterministic.
    std::map<std::string, int64_t> counts;
    for (const auto& [begin, end] : FindPatternMatches(SplitPattern::kLlama3, corpus)) {
      ++counts[std::string(corpus.substr(begin, end - begin))];
    }
    for (const auto& [text, count] : counts) {
      Word word{{}, count};
      for (char c : text) word.symbols.push_back(static_cast<uint8_t>(c));
      words_.push_back(std::move(word));
    }
    for (size_t w = 0; w < words_.size(); ++w) AddPairs(w, +1);
    for (const auto& [key, count] : pair_counts_) PushCandidate(key);
  }

  // Learns merges until the vocab has `target` tokens or nothing qualifies.
  void Train(size_t target) {
    while (vocab_.size() < target && !queue_.empty()) {
      Candidate top = queue_.top();
      queue_.pop();
      auto it = pair_counts_.find(PairKey(top.left, top.right));
      if (it == pair_counts_.end() || it->second != top.count) continue;  // stale
      if (top.count < min_frequency_) break;
      std::string merged = tokens_[top.left] + tokens_[top.right];
      int32_t new_id = AddToken(merged);
      merges_.emplace_back(top.left, top.right);
      ApplyMerge(top.left, top.right, new_id);
    }
  }

  const std::vector<std::string>& tokens() const { return tokens_; }
  const std::vector<std::pair<int32_t, int32_t>>& merges() const { return merges_; }

 private:
  struct Candidate {
    int64_t count;
    int32_t left;
    int32_t right;
    const std::vector<std::string>* tokens;
    // priority_queue pops the largest: higher count, then smaller (left, right) strings.
    bool operator<(const Candidate& o) const {
      if (count != o.count) return count < o.count;
      const std::string& a = (*tokens)[left];
      const std::string& b = (*tokens)[o.left];
      if (a != b) return a > b;
      return (*tokens)[right] > (*tokens)[o.right];
    }
  };

  int32_t AddToken(const std::string& token) {
    auto it = vocab_.find(token);
    if (it != vocab_.end()) return it->second;  // another merge already made this string
    int32_t id = static_cast<int32_t>(tokens_.size());
    tokens_.push_back(token);
    vocab_.emplace(token, id);
    return id;
  }

  void PushCandidate(uint64_t key) {
    int64_t count = pair_counts_[key];
    if (count <= 0) return;
    queue_.push(
        {count, static_cast<int32_t>(key >> 32), static_cast<int32_t>(key & 0xFFFFFFFF), &tokens_});
  }

  // Adds (sign +1) or removes (-1) the pairs of word `w` from the counts.
  void AddPairs(size_t w, int sign) {
    const Word& word = words_[w];
    for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
      uint64_t key = PairKey(word.symbols[i], word.symbols[i + 1]);
      pair_counts_[key] += sign * word.count;
      if (sign > 0) pair_words_[key].insert(static_cast<int32_t>(w));
      touched_.insert(key);
    }
  }

  void ApplyMerge(int32_t left, int32_t right, int32_t new_id) {
    uint64_t key = PairKey(left, right);
    std::set<int32_t> affected = pair_words_[key];  // sorted: deterministic order
    touched_.clear();
    for (int32_t w : affected) {
      std::vector<int32_t>& symbols = words_[w].symbols;
      bool found = false;
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        found = found || (symbols[i] == left && symbols[i + 1] == right);
      }
      if (!found) continue;
      AddPairs(w, -1);
      std::vector<int32_t> merged;
      merged.reserve(symbols.size());
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
          merged.push_back(new_id);
          ++i;
        } else {
          merged.push_back(symbols[i]);
        }
      }
      symbols = std::move(merged);
      AddPairs(w, +1);
    }
    pair_counts_.erase(key);
    pair_words_.erase(key);
    for (uint64_t touched : touched_) {
      if (touched != key) PushCandidate(touched);
    }
  }

  int min_frequency_;
  std::vector<Word> words_;
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::pair<int32_t, int32_t>> merges_;
  std::unordered_map<uint64_t, int64_t> pair_counts_;
  std::unordered_map<uint64_t, std::set<int32_t>> pair_words_;
  std::set<uint64_t> touched_;
  std::priority_queue<Candidate> queue_;
};

OrderedJson SplitThenByteLevel() {
  OrderedJson split = {{"type", "Split"},
                       {"pattern", {{"Regex", std::string(kLlama3Pattern)}}},
                       {"behavior", "Isolated"},
                       {"invert", false}};
  OrderedJson byte_level = {{"type", "ByteLevel"},
                            {"add_prefix_space", false},
                            {"trim_offsets", true},
                            {"use_regex", false}};
  return {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}};
}

OrderedJson BosTemplate(const std::string& bos, int32_t bos_id) {
  OrderedJson special = {{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
  auto sequence = [](const char* id, int type_id) {
    return OrderedJson{{"Sequence", {{"id", id}, {"type_id", type_id}}}};
  };
  OrderedJson special_b = {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}};
  OrderedJson tokens;
  tokens[bos] = {{"id", bos}, {"ids", {bos_id}}, {"tokens", {bos}}};
  return {{"type", "TemplateProcessing"},
          {"single", {special, sequence("A", 0)}},
          {"pair", {special, sequence("A", 0), special_b, sequence("B", 1)}},
          {"special_tokens", tokens}};
}

}  // namespace

absl::StatusOr<std::string> TrainByteLevelBpe(absl::string_view corpus, int vocab_size,
                                              const std::vector<std::string>& special_tokens,
                                              const BpeTrainerOptions& options) {
  if (vocab_size < 256 + static_cast<int>(special_tokens.size())) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size ", vocab_size,
                                                   " must be at least 256 + ",
                                                   special_tokens.size(), " special tokens"));
  }
  std::set<std::string> seen;
  for (const std::string& token : special_tokens) {
    if (token.empty()) return absl::InvalidArgumentError("special tokens must not be empty");
    if (!seen.insert(token).second) {
      return absl::InvalidArgumentError(absl::StrCat("special token '", token, "' is repeated"));
    }
  }
  if (!options.bos_token.empty() && !seen.count(options.bos_token)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bos_token '", options.bos_token, "' is not one of the special tokens"));
  }

  Trainer trainer(corpus, std::max(1, options.min_frequency));
  trainer.Train(static_cast<size_t>(vocab_size) - special_tokens.size());

  OrderedJson vocab = OrderedJson::object();
  const std::vector<std::string>& tokens = trainer.tokens();
  for (size_t id = 0; id < tokens.size(); ++id) vocab[tokens[id]] = id;
  OrderedJson merges = OrderedJson::array();
  for (const auto& [left, right] : trainer.merges()) {
    merges.push_back({tokens[left], tokens[right]});
  }
  OrderedJson added = OrderedJson::array();
  int32_t bos_id = -1;
  for (size_t i = 0; i < special_tokens.size(); ++i) {
    int32_t id = static_cast<int32_t>(tokens.size() + i);
    if (special_tokens[i] == options.bos_token) bos_id = id;
    added.push_back({{"id", id},
                     {"content", special_tokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  OrderedJson post_processor = nullptr;
  if (bos_id >= 0) post_processor = BosTemplate(options.bos_token, bos_id);
  OrderedJson model = {{"type", "BPE"},
                       {"dropout", nullptr},
                       {"unk_token", nullptr},
                       {"continuing_subword_prefix", nullptr},
                       {"end_of_word_suffix", nullptr},
                       {"fuse_unk", false},
                       {"byte_fallback", false},
                       {"ignore_merges", false},
                       {"vocab", vocab},
                       {"merges", merges}};
  OrderedJson out = {{"version", "1.0"},
                     {"truncation", nullptr},
                     {"padding", nullptr},
                     {"added_tokens", added},
                     {"normalizer", nullptr},
                     {"pre_tokenizer", SplitThenByteLevel()},
                     {"post_processor", post_processor},
                     {"decoder",
                      {{"type", "ByteLevel"},
                       {"add_prefix_space", true},
                       {"trim_offsets", true},
                       {"use_regex", true}}},
                     {"model", model}};
  return out.dump(1) + "\n";
}

}  // namespace tokenselect::tokenizer
