#include "tokenizer/pretokenizer.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/normalizer.h"

namespace tokenselect::tokenizer {

using internal::Json;

namespace {

absl::StatusOr<SplitBehavior> ParseBehavior(const Json& value, absl::string_view path) {
  ASSIGN_OR_RETURN(std::string name, internal::ReadString(value, path, "behavior"));
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return internal::FieldError(internal::JoinPath(path, "behavior"),
                              absl::StrCat("'", name, "' is not a split behavior"));
}

absl::StatusOr<PrependScheme> ParsePrependScheme(const Json& value, absl::string_view path) {
  ASSIGN_OR_RETURN(std::optional<std::string> scheme,
                   internal::ReadOptionalString(value, path, "prepend_scheme"));
  if (!scheme.has_value()) {
    // Files written before prepend_scheme existed carry add_prefix_space.
    ASSIGN_OR_RETURN(bool add_prefix_space,
                     internal::ReadBool(value, path, "add_prefix_space", true));
    return add_prefix_space ? PrependScheme::kAlways : PrependScheme::kNever;
  }
  if (*scheme == "first") return PrependScheme::kFirst;
  if (*scheme == "always") return PrependScheme::kAlways;
  if (*scheme == "never") return PrependScheme::kNever;
  return internal::FieldError(internal::JoinPath(path, "prepend_scheme"),
                              absl::StrCat("'", *scheme, "' is not first, always or never"));
}

std::vector<std::pair<size_t, size_t>> LiteralMatches(absl::string_view text,
                                                      absl::string_view literal) {
  std::vector<std::pair<size_t, size_t>> matches;
  if (literal.empty()) return matches;
  for (size_t pos = text.find(literal); pos != absl::string_view::npos;
       pos = text.find(literal, pos + literal.size())) {
    matches.emplace_back(pos, pos + literal.size());
  }
  return matches;
}

// The complement of sorted, disjoint `matches` within [0, size).
std::vector<std::pair<size_t, size_t>> Invert(const std::vector<std::pair<size_t, size_t>>& m,
                                              size_t size) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t pos = 0;
  for (const auto& [begin, end] : m) {
    if (pos < begin) out.emplace_back(pos, begin);
    pos = end;
  }
  if (pos < size) out.emplace_back(pos, size);
  return out;
}

}  // namespace

std::vector<std::pair<size_t, size_t>> SplitByMatches(
    absl::string_view text, const std::vector<std::pair<size_t, size_t>>& matches,
    SplitBehavior behavior) {
  // Lay out the text as alternating (range, is_match) parts.
  struct Part {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Part> parts;
  size_t pos = 0;
  for (const auto& [begin, end] : matches) {
    if (pos < begin) parts.push_back({pos, begin, false});
    if (begin < end) parts.push_back({begin, end, true});
    pos = end;
  }
  if (pos < text.size()) parts.push_back({pos, text.size(), false});

  std::vector<Part> merged;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Part& p : parts) {
        if (!p.is_match) merged.push_back(p);
      }
      break;
    case SplitBehavior::kIsolated:
      merged = parts;
      break;
    case SplitBehavior::kContiguous:
      for (const Part& p : parts) {
        if (p.is_match && !merged.empty() && merged.back().is_match) {
          merged.back().end = p.end;
        } else {
          merged.push_back(p);
        }
      }
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Part& p : parts) {
        if (p.is_match && !previous_match && !merged.empty()) {
          merged.back().end = p.end;
        } else {
          merged.push_back(p);
        }
        previous_match = p.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool next_match = false;  // walking backwards: whether the part after this one matched
      for (size_t i = parts.size(); i-- > 0;) {
        const Part& p = parts[i];
        if (p.is_match && !next_match && !merged.empty()) {
          merged.back().begin = p.begin;
        } else {
          merged.push_back(p);
        }
        next_match = p.is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
  }
  std::vector<std::pair<size_t, size_t>> out;
  for (const Part& p : merged) {
    if (p.begin < p.end) out.emplace_back(p.begin, p.end);
  }
  return out;
}

absl::StatusOr<PreTokenizer> PreTokenizer::FromJson(const Json& value, absl::string_view path) {
  PreTokenizer pre_tokenizer;
  if (value.is_null()) return pre_tokenizer;
  RETURN_IF_ERROR(Parse(value, path, &pre_tokenizer.steps_));
  return pre_tokenizer;
}

absl::Status PreTokenizer::Parse(const Json& value, absl::string_view path,
                                 std::vector<Step>* steps) {
  ASSIGN_OR_RETURN(std::string type, internal::ReadType(value, path));
  Step step;
  if (type == "Sequence") {
    std::string list_path = internal::JoinPath(path, "pretokenizers");
    const Json* list = internal::FindMember(value, "pretokenizers");
    if (list == nullptr || !list->is_array()) {
      return internal::FieldError(list_path, "must be an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(Parse((*list)[i], internal::IndexPath(list_path, i), steps));
    }
    return absl::OkStatus();
  } else if (type == "ByteLevel") {
    step.kind = Step::Kind::kByteLevel;
    ASSIGN_OR_RETURN(step.add_prefix_space,
                     internal::ReadBool(value, path, "add_prefix_space", true));
    ASSIGN_OR_RETURN(step.use_regex, internal::ReadBool(value, path, "use_regex", true));
  } else if (type == "Split") {
    bool is_regex = false;
    ASSIGN_OR_RETURN(std::string pattern, internal::ReadPattern(value, path, "pattern", &is_regex));
    if (is_regex) {
      std::optional<SplitPattern> known = FindSplitPattern(pattern);
      if (!known.has_value()) {
        return internal::FieldError(
            internal::JoinPath(path, "pattern.Regex"),
            absl::StrCat("'", pattern,
                         "' is not a supported split regex (supported: the GPT-2, Llama-3 "
                         "and Qwen2 patterns)"));
      }
      step.kind = Step::Kind::kSplitRegex;
      step.pattern = *known;
    } else {
      if (pattern.empty()) {
        return internal::FieldError(internal::JoinPath(path, "pattern.String"),
                                    "must not be empty");
      }
      step.kind = Step::Kind::kSplitString;
      step.literal = std::move(pattern);
    }
    ASSIGN_OR_RETURN(step.behavior, ParseBehavior(value, path));
    ASSIGN_OR_RETURN(step.invert, internal::ReadBool(value, path, "invert", false));
  } else if (type == "Metaspace") {
    step.kind = Step::Kind::kMetaspace;
    ASSIGN_OR_RETURN(step.literal,
                     internal::ReadChar(value, path, "replacement", std::string("\u2581")));
    ASSIGN_OR_RETURN(step.prepend_scheme, ParsePrependScheme(value, path));
    ASSIGN_OR_RETURN(step.split, internal::ReadBool(value, path, "split", true));
  } else {
    return internal::UnsupportedType(path, type);
  }
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

void PreTokenizer::Apply(const Step& step, Piece piece, std::vector<Piece>* out) {
  auto emit_ranges = [&](const std::string& text,
                         const std::vector<std::pair<size_t, size_t>>& ranges) {
    for (const auto& [begin, end] : ranges) {
      out->push_back({text.substr(begin, end - begin), piece.at_input_start && begin == 0});
    }
  };
  switch (step.kind) {
    case Step::Kind::kByteLevel: {
      std::string text = std::move(piece.text);
      if (step.add_prefix_space && !absl::StartsWith(text, " ")) text.insert(0, " ");
      if (step.use_regex) {
        for (const auto& [begin, end] : FindPatternMatches(SplitPattern::kGpt2, text)) {
          out->push_back({BytesToByteLevel(absl::string_view(text).substr(begin, end - begin)),
                          piece.at_input_start && begin == 0});
        }
      } else {
        out->push_back({BytesToByteLevel(text), piece.at_input_start});
      }
      return;
    }
    case Step::Kind::kSplitRegex:
    case Step::Kind::kSplitString: {
      auto matches = step.kind == Step::Kind::kSplitRegex
                         ? FindPatternMatches(step.pattern, piece.text)
                         : LiteralMatches(piece.text, step.literal);
      if (step.invert) matches = Invert(matches, piece.text.size());
      emit_ranges(piece.text, SplitByMatches(piece.text, matches, step.behavior));
      return;
    }
    case Step::Kind::kMetaspace: {
      std::string text = ReplaceAll(piece.text, " ", step.literal);
      bool prepend = step.prepend_scheme == PrependScheme::kAlways ||
                     (step.prepend_scheme == PrependScheme::kFirst && piece.at_input_start);
      if (prepend && !absl::StartsWith(text, step.literal)) text.insert(0, step.literal);
      if (step.split) {
        emit_ranges(text, SplitByMatches(text, LiteralMatches(text, step.literal),
                                         SplitBehavior::kMergedWithNext));
      } else if (!text.empty()) {
        out->push_back({std::move(text), piece.at_input_start});
      }
      return;
    }
  }
}

void PreTokenizer::PreTokenize(absl::string_view text, bool at_input_start,
                               std::vector<std::string>* out) const {
  if (text.empty()) return;
  std::vector<Piece> pieces{{std::string(text), at_input_start}};
  std::vector<Piece> next;
  for (const Step& step : steps_) {
    next.clear();
    for (Piece& piece : pieces) Apply(step, std::move(piece), &next);
    pieces.swap(next);
  }
  for (Piece& piece : pieces) {
    if (!piece.text.empty()) out->push_back(std::move(piece.text));
  }
}

}  // namespace tokenselect::tokenizer
