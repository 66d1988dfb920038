#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "tokenizer/unicode.h"

namespace tokenselect::tokenizer {

using internal::Json;

namespace {

bool IsWordChar(char32_t cp) { return cp == '_' || IsLetter(cp) || IsNumber(cp); }

// Start of the character that ends text[0, end) (end > 0); a stray byte counts alone.
size_t PrevCharStart(absl::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && end - start < 4 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
    --start;
  }
  return start + DecodeUtf8At(text, start).length == end ? start : end - 1;
}

// The code point that ends text[0, end) (end > 0), or kInvalidCodepoint.
char32_t LastCodepoint(absl::string_view text, size_t end) {
  return DecodeUtf8At(text, PrevCharStart(text, end)).cp;
}

}  // namespace

void AddedVocabulary::Trie::Insert(absl::string_view pattern, int32_t token_index) {
  if (nodes.empty()) nodes.emplace_back();
  first_byte[static_cast<unsigned char>(pattern[0])] = true;
  int32_t node = 0;
  for (char ch : pattern) {
    unsigned char b = static_cast<unsigned char>(ch);
    auto& children = nodes[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(b, int32_t{-1}));
    if (it != children.end() && it->first == b) {
      node = it->second;
    } else {
      int32_t child = static_cast<int32_t>(nodes.size());
      children.insert(it, {b, child});
      nodes.emplace_back();
      node = child;
    }
  }
  nodes[node].token_index = token_index;
}

int32_t AddedVocabulary::Trie::LongestAt(absl::string_view text, size_t pos, size_t* length) const {
  int32_t best = -1;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    unsigned char b = static_cast<unsigned char>(text[i]);
    const auto& children = nodes[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(b, int32_t{-1}));
    if (it == children.end() || it->first != b) break;
    node = it->second;
    if (nodes[node].token_index >= 0) {
      best = nodes[node].token_index;
      *length = i + 1 - pos;
    }
  }
  return best;
}

absl::StatusOr<AddedVocabulary> AddedVocabulary::FromJson(const Json* value, absl::string_view path,
                                                          const Normalizer& normalizer) {
  AddedVocabulary vocab;
  if (value == nullptr || value->is_null()) return vocab;
  if (!value->is_array()) return internal::FieldError(path, "must be an array");
  for (size_t i = 0; i < value->size(); ++i) {
    const Json& entry = (*value)[i];
    std::string entry_path = internal::IndexPath(path, i);
    RETURN_IF_ERROR(internal::RequireObject(entry, entry_path));
    AddedToken token;
    ASSIGN_OR_RETURN(int64_t id, internal::ReadInt(entry, entry_path, "id", -1));
    if (id < 0 || id > INT32_MAX) {
      return internal::FieldError(internal::JoinPath(entry_path, "id"),
                                  "must be a non-negative integer");
    }
    token.id = static_cast<int32_t>(id);
    ASSIGN_OR_RETURN(token.content, internal::ReadString(entry, entry_path, "content"));
    if (token.content.empty()) {
      return internal::FieldError(internal::JoinPath(entry_path, "content"), "must not be empty");
    }
    ASSIGN_OR_RETURN(token.single_word,
                     internal::ReadBool(entry, entry_path, "single_word", false));
    ASSIGN_OR_RETURN(token.lstrip, internal::ReadBool(entry, entry_path, "lstrip", false));
    ASSIGN_OR_RETURN(token.rstrip, internal::ReadBool(entry, entry_path, "rstrip", false));
    ASSIGN_OR_RETURN(token.special, internal::ReadBool(entry, entry_path, "special", false));
    ASSIGN_OR_RETURN(token.normalized,
                     internal::ReadBool(entry, entry_path, "normalized", !token.special));
    if (vocab.by_id_.contains(token.id)) {
      return internal::FieldError(entry_path, absl::StrCat("reuses id ", token.id));
    }
    if (vocab.by_content_.contains(token.content)) {
      return internal::FieldError(entry_path,
                                  absl::StrCat("repeats content '", token.content, "'"));
    }
    size_t index = vocab.tokens_.size();
    vocab.by_id_[token.id] = index;
    vocab.by_content_[token.content] = index;
    token.decoded = token.content;
    if (token.normalized) {
      token.decoded = normalizer.Normalize(token.content);
      if (!token.decoded.empty()) {
        vocab.normalized_trie_.Insert(token.decoded, static_cast<int32_t>(index));
      }
    } else {
      vocab.raw_trie_.Insert(token.content, static_cast<int32_t>(index));
    }
    vocab.tokens_.push_back(std::move(token));
  }
  return vocab;
}

void AddedVocabulary::Split(absl::string_view text, bool normalized_set,
                            std::vector<TextSegment>* out) const {
  const Trie& trie = normalized_set ? normalized_trie_ : raw_trie_;
  size_t plain_start = 0;  // start of the pending plain-text piece
  size_t pos = 0;
  while (pos < text.size() && !trie.nodes.empty()) {
    if (!trie.first_byte[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    size_t length = 0;
    int32_t index = trie.LongestAt(text, pos, &length);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[index];
    size_t start = pos;
    size_t stop = pos + length;
    pos = stop;  // a discarded match still consumes its text, as in HF
    if (token.single_word) {
      bool word_before = start > 0 && IsWordChar(LastCodepoint(text, start));
      bool word_after = stop < text.size() && IsWordChar(DecodeUtf8At(text, stop).cp);
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      // Swallow the whitespace before the token, but not past the previous match.
      while (start > plain_start) {
        size_t prev = PrevCharStart(text, start);
        if (!IsWhitespace(DecodeUtf8At(text, prev).cp)) break;
        start = prev;
      }
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        Utf8Char c = DecodeUtf8At(text, stop);
        if (c.cp == kInvalidCodepoint || !IsWhitespace(c.cp)) break;
        stop += c.length;
      }
      pos = stop;
    }
    if (plain_start < start) out->push_back({plain_start, start, -1});
    out->push_back({start, stop, token.id});
    plain_start = stop;
  }
  if (plain_start < text.size()) out->push_back({plain_start, text.size(), -1});
}

const AddedToken* AddedVocabulary::FindById(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocabulary::FindByContent(absl::string_view content) const {
  auto it = by_content_.find(content);
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

}  // namespace tokenselect::tokenizer
