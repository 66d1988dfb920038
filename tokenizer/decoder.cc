#include "tokenizer/decoder.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/unicode.h"

namespace tokenselect::tokenizer {

using internal::Json;

namespace {

constexpr char kReplacementUtf8[] = "\xEF\xBF\xBD";  // U+FFFD

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Metaspace decoding of one element: the replacement character becomes a space, or vanishes
// in the first element when the scheme prepends one.
std::string MetaspaceMap(absl::string_view element, absl::string_view replacement, bool drop) {
  std::string out;
  out.reserve(element.size());
  for (size_t pos = 0; pos < element.size();) {
    size_t len = DecodeUtf8At(element, pos).length;
    absl::string_view c = element.substr(pos, len);
    if (c == replacement) {
      if (!drop) out.push_back(' ');
    } else {
      out.append(c.data(), c.size());
    }
    pos += len;
  }
  return out;
}

// Strip: removes up to `start` leading and `stop` trailing copies of `ch` (one character).
std::string StripElement(absl::string_view element, absl::string_view ch, int start, int stop) {
  size_t begin = 0;
  size_t end = element.size();
  for (int i = 0; i < start && begin < end && element.substr(begin, ch.size()) == ch; ++i) {
    begin += ch.size();
  }
  for (int i = 0;
       i < stop && end - begin >= ch.size() && element.substr(end - ch.size(), ch.size()) == ch;
       ++i) {
    end -= ch.size();
  }
  return std::string(element.substr(begin, end - begin));
}

}  // namespace

bool ParseByteToken(absl::string_view token, uint8_t* byte) {
  // As HF: six bytes "<0x" XX ">", XX read by u8::from_str_radix(.., 16), which also takes a
  // leading '+'.
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return false;
  int hi = HexDigit(token[3]);
  int lo = HexDigit(token[4]);
  if (lo < 0) return false;
  if (hi < 0) {
    if (token[3] != '+') return false;
    hi = 0;
  }
  *byte = static_cast<uint8_t>(hi * 16 + lo);
  return true;
}

absl::StatusOr<Decoder> Decoder::FromJson(const Json& value, absl::string_view path) {
  Decoder decoder;
  if (value.is_null()) return decoder;
  decoder.mode_ = Mode::kPieces;
  RETURN_IF_ERROR(decoder.Parse(value, path));
  decoder.fuse_index_ = decoder.steps_.size();
  for (size_t i = 0; i < decoder.steps_.size(); ++i) {
    if (decoder.steps_[i].kind == Step::Kind::kFuse) {
      decoder.fuse_index_ = i;
      break;
    }
  }
  return decoder;
}

absl::Status Decoder::Parse(const Json& value, absl::string_view path) {
  ASSIGN_OR_RETURN(std::string type, internal::ReadType(value, path));
  if (type == "Sequence") {
    std::string list_path = internal::JoinPath(path, "decoders");
    const Json* list = internal::FindMember(value, "decoders");
    if (list == nullptr || !list->is_array()) {
      return internal::FieldError(list_path, "must be an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(Parse((*list)[i], internal::IndexPath(list_path, i)));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    if (!steps_.empty() || mode_ == Mode::kByteLevel) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ByteLevel combined with other decoders is not supported"));
    }
    mode_ = Mode::kByteLevel;
    return absl::OkStatus();
  }
  if (mode_ == Mode::kByteLevel) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", type, " after ByteLevel is not supported"));
  }
  bool fused = false;
  int strips_after_fuse = 0;
  for (const Step& s : steps_) {
    if (s.kind == Step::Kind::kFuse) fused = true;
    if (fused && s.kind == Step::Kind::kStrip) ++strips_after_fuse;
  }
  if (fused && (type != "Strip" || strips_after_fuse > 0) && type != "Fuse") {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", type, " after Fuse is not supported (only one Strip may follow Fuse)"));
  }
  Step step;
  if (type == "Replace") {
    step.kind = Step::Kind::kReplace;
    bool is_regex = false;
    ASSIGN_OR_RETURN(step.pattern, internal::ReadPattern(value, path, "pattern", &is_regex));
    if (is_regex) {
      return internal::FieldError(internal::JoinPath(path, "pattern"),
                                  "Regex patterns are not supported (only String)");
    }
    if (step.pattern.empty()) {
      return internal::FieldError(internal::JoinPath(path, "pattern.String"), "must not be empty");
    }
    ASSIGN_OR_RETURN(step.content, internal::ReadString(value, path, "content"));
  } else if (type == "ByteFallback") {
    step.kind = Step::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = Step::Kind::kFuse;
  } else if (type == "Strip") {
    step.kind = Step::Kind::kStrip;
    ASSIGN_OR_RETURN(step.pattern, internal::ReadChar(value, path, "content", std::nullopt));
    ASSIGN_OR_RETURN(int64_t start, internal::ReadInt(value, path, "start", 0));
    ASSIGN_OR_RETURN(int64_t stop, internal::ReadInt(value, path, "stop", 0));
    if (start < 0 || stop < 0 || start > 1024 || stop > 1024) {
      return internal::FieldError(path, "start and stop must be in [0, 1024]");
    }
    step.start = static_cast<int>(start);
    step.stop = static_cast<int>(stop);
  } else if (type == "Metaspace") {
    step.kind = Step::Kind::kMetaspace;
    ASSIGN_OR_RETURN(step.pattern,
                     internal::ReadChar(value, path, "replacement", std::string("\u2581")));
    ASSIGN_OR_RETURN(std::optional<std::string> scheme,
                     internal::ReadOptionalString(value, path, "prepend_scheme"));
    if (scheme.has_value()) {
      if (*scheme != "first" && *scheme != "always" && *scheme != "never") {
        return internal::FieldError(internal::JoinPath(path, "prepend_scheme"),
                                    absl::StrCat("'", *scheme, "' is not first, always or never"));
      }
      step.strip_first = *scheme != "never";
    } else {
      ASSIGN_OR_RETURN(step.strip_first, internal::ReadBool(value, path, "add_prefix_space", true));
    }
  } else {
    return internal::UnsupportedType(path, type);
  }
  steps_.push_back(std::move(step));
  return absl::OkStatus();
}

std::string Decoder::DecodeTokens(const std::vector<std::string>& tokens) const {
  if (mode_ == Mode::kJoinWithSpaces) return absl::StrJoin(tokens, " ");
  if (mode_ == Mode::kByteLevel) {
    std::string bytes;
    for (const std::string& token : tokens) {
      if (!ByteLevelToBytes(token, &bytes)) bytes += token;
    }
    return Utf8Lossy(bytes);
  }
  std::vector<std::string> elements = tokens;
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::kReplace:
        for (std::string& e : elements) e = ReplaceAll(e, step.pattern, step.content);
        break;
      case Step::Kind::kMetaspace:
        for (size_t i = 0; i < elements.size(); ++i) {
          elements[i] = MetaspaceMap(elements[i], step.pattern, i == 0 && step.strip_first);
        }
        break;
      case Step::Kind::kStrip:
        for (std::string& e : elements) e = StripElement(e, step.pattern, step.start, step.stop);
        break;
      case Step::Kind::kFuse:
        elements = {absl::StrJoin(elements, "")};
        break;
      case Step::Kind::kByteFallback: {
        std::vector<std::string> grouped;
        std::string run;
        auto flush = [&] {
          if (run.empty()) return;
          if (IsValidUtf8(run)) {
            grouped.push_back(run);
          } else {
            for (size_t i = 0; i < run.size(); ++i) grouped.push_back(kReplacementUtf8);
          }
          run.clear();
        };
        for (std::string& e : elements) {
          uint8_t b;
          if (ParseByteToken(e, &b)) {
            run.push_back(static_cast<char>(b));
          } else {
            flush();
            grouped.push_back(std::move(e));
          }
        }
        flush();
        elements = std::move(grouped);
        break;
      }
    }
  }
  return absl::StrJoin(elements, "");
}

DecoderState::DecoderState(const Decoder* decoder)
    : decoder_(decoder),
      byte_runs_(decoder->steps_.size()),
      elements_seen_(decoder->steps_.size(), 0) {
  for (size_t i = decoder->fuse_index_; i < decoder->steps_.size(); ++i) {
    const Decoder::Step& step = decoder->steps_[i];
    if (step.kind != Decoder::Step::Kind::kStrip) continue;
    fused_strip_char_ = step.pattern;
    leading_to_strip_ = step.start;
    trailing_limit_ = step.stop;
  }
}

void DecoderState::Push(absl::string_view token, std::string* out) {
  switch (decoder_->mode_) {
    case Decoder::Mode::kJoinWithSpaces:
      if (tokens_seen_ > 0) out->push_back(' ');
      out->append(token.data(), token.size());
      break;
    case Decoder::Mode::kByteLevel: {
      if (!ByteLevelToBytes(token, &pending_bytes_))
        pending_bytes_.append(token.data(), token.size());
      size_t keep = IncompleteUtf8Suffix(pending_bytes_);
      if (keep < pending_bytes_.size()) {
        *out +=
            Utf8Lossy(absl::string_view(pending_bytes_).substr(0, pending_bytes_.size() - keep));
        pending_bytes_.erase(0, pending_bytes_.size() - keep);
      }
      break;
    }
    case Decoder::Mode::kPieces:
      Feed(0, std::string(token), out);
      break;
  }
  ++tokens_seen_;
}

void DecoderState::Feed(size_t stage, std::string element, std::string* out) {
  const auto& steps = decoder_->steps_;
  for (size_t s = stage; s < decoder_->fuse_index_; ++s) {
    const Decoder::Step& step = steps[s];
    switch (step.kind) {
      case Decoder::Step::Kind::kReplace:
        element = ReplaceAll(element, step.pattern, step.content);
        break;
      case Decoder::Step::Kind::kMetaspace:
        element = MetaspaceMap(element, step.pattern, elements_seen_[s] == 0 && step.strip_first);
        break;
      case Decoder::Step::Kind::kStrip:
        element = StripElement(element, step.pattern, step.start, step.stop);
        break;
      case Decoder::Step::Kind::kByteFallback: {
        uint8_t b;
        if (ParseByteToken(element, &b)) {
          byte_runs_[s].push_back(static_cast<char>(b));
          return;
        }
        FlushBytes(s, out);
        break;
      }
      case Decoder::Step::Kind::kFuse:
        break;  // not reached: steps before fuse_index_ hold no Fuse
    }
    ++elements_seen_[s];
  }
  EmitFused(element, out);
}

void DecoderState::FlushBytes(size_t stage, std::string* out) {
  if (byte_runs_[stage].empty()) return;
  std::string run = std::move(byte_runs_[stage]);
  byte_runs_[stage].clear();
  // The run counts as elements passing this step (ByteFallback output feeds the next step).
  if (IsValidUtf8(run)) {
    Feed(stage + 1, std::move(run), out);
  } else {
    for (size_t i = 0; i < run.size(); ++i) Feed(stage + 1, kReplacementUtf8, out);
  }
}

void DecoderState::EmitFused(absl::string_view text, std::string* out) {
  if (fused_strip_char_.empty()) {
    out->append(text.data(), text.size());
    return;
  }
  const std::string& ch = fused_strip_char_;
  for (size_t pos = 0; pos < text.size();) {
    size_t len = DecodeUtf8At(text, pos).length;
    absl::string_view c = text.substr(pos, len);
    pos += len;
    bool is_strip_char = c == ch;
    if (leading_to_strip_ > 0) {
      if (is_strip_char) {
        --leading_to_strip_;
        continue;
      }
      leading_to_strip_ = 0;
    }
    leading_to_strip_ = 0;
    if (trailing_limit_ > 0 && is_strip_char) {
      if (++held_count_ > trailing_limit_) {
        out->append(ch);
        --held_count_;
      }
      continue;
    }
    for (; held_count_ > 0; --held_count_) out->append(ch);
    out->append(c.data(), c.size());
  }
}

void DecoderState::Finish(std::string* out) {
  switch (decoder_->mode_) {
    case Decoder::Mode::kJoinWithSpaces:
      break;
    case Decoder::Mode::kByteLevel:
      *out += Utf8Lossy(pending_bytes_);
      pending_bytes_.clear();
      break;
    case Decoder::Mode::kPieces:
      for (size_t s = 0; s < decoder_->fuse_index_; ++s) FlushBytes(s, out);
      held_count_ = 0;  // trailing characters a final Strip removes
      break;
  }
}

}  // namespace tokenselect::tokenizer
