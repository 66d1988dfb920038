// Added tokens (tokenizer.json "added_tokens"): strings that are cut out of the input before
// normalization and pre-tokenization and map straight to one id. Matching is leftmost-longest.
// Per token, as in HF tokenizers:
//   single_word: only matches when not preceded or followed by a word character;
//   lstrip / rstrip: the match swallows the whitespace on its left / right;
//   normalized: matched against normalized text (its content normalized the same way) instead
//               of the raw input;
//   special: skipped by Decode(skip_special_tokens=true) and reported by IsSpecial.
// tests/unit/tokenizer/tokenizer_test.cc checks each flag against what HF tokenizers does.
#ifndef TOKENSELECT_TOKENIZER_ADDED_TOKENS_H_
#define TOKENSELECT_TOKENIZER_ADDED_TOKENS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tokenizer/json_util.h"
#include "tokenizer/normalizer.h"

namespace tokenselect::tokenizer {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
  // What Decode shows for it: HF decodes a normalized token in its normalized form (Llama-2's
  // normalizer turns "a b" into "▁a▁b", which its decoder then shows as " a b").
  std::string decoded;
};

// A piece of text: either plain text [begin, end) or an added token (id >= 0) spanning it.
struct TextSegment {
  size_t begin;
  size_t end;
  int32_t id;  // -1 for plain text
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;

  // Parses the "added_tokens" array at `path` (null or absent: none). `normalizer` gives the
  // form in which normalized tokens are matched. InvalidArgument naming the entry for a
  // malformed entry, an empty content, or an id or content used twice.
  static absl::StatusOr<AddedVocabulary> FromJson(const internal::Json* value,
                                                  absl::string_view path,
                                                  const Normalizer& normalizer);

  // Splits `text` with the tokens whose `normalized` flag equals `normalized_set`; plain
  // pieces may be empty-free but are never merged with neighbours. Appends to `out`, with
  // offsets relative to `text`.
  void Split(absl::string_view text, bool normalized_set, std::vector<TextSegment>* out) const;

  const AddedToken* FindById(int32_t id) const;
  const AddedToken* FindByContent(absl::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  bool has_normalized_tokens() const { return !normalized_trie_.nodes.empty(); }

 private:
  // A byte trie over token patterns; leftmost-longest search.
  struct Trie {
    struct Node {
      std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
      int32_t token_index = -1;
    };
    std::vector<Node> nodes;  // nodes[0] is the root once anything was inserted
    bool first_byte[256] = {};
    void Insert(absl::string_view pattern, int32_t token_index);
    // Longest pattern starting at text[pos]: its token index and length, or -1.
    int32_t LongestAt(absl::string_view text, size_t pos, size_t* length) const;
  };

  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<int32_t, size_t> by_id_;
  absl::flat_hash_map<std::string, size_t> by_content_;
  Trie raw_trie_;
  Trie normalized_trie_;
};

}  // namespace tokenselect::tokenizer

#endif  // TOKENSELECT_TOKENIZER_ADDED_TOKENS_H_
