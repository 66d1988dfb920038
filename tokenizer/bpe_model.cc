#include "tokenizer/bpe_model.h"

#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "tokenizer/unicode.h"

namespace tokenselect::tokenizer {

using internal::Json;

namespace {

// Ids beyond this are treated as a corrupt file rather than allocated.
constexpr int64_t kMaxTokenId = int64_t{1} << 26;

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const Json& value,
                                                             absl::string_view path) {
  RETURN_IF_ERROR(internal::RequireObject(value, path));
  ASSIGN_OR_RETURN(std::string type, internal::ReadType(value, path));
  if (type != "BPE") return internal::UnsupportedType(path, type);
  std::unique_ptr<BpeModel> model(new BpeModel());

  // Options first, so errors about them come before any heavy work.
  const Json* dropout = internal::FindMember(value, "dropout");
  if (dropout != nullptr && !dropout->is_null() &&
      !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return internal::FieldError(internal::JoinPath(path, "dropout"),
                                "is not supported (must be null: dropout is for training)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    ASSIGN_OR_RETURN(std::optional<std::string> affix,
                     internal::ReadOptionalString(value, path, key));
    if (affix.has_value() && !affix->empty()) {
      return internal::FieldError(internal::JoinPath(path, key), "is not supported");
    }
  }
  ASSIGN_OR_RETURN(model->byte_fallback_, internal::ReadBool(value, path, "byte_fallback", false));
  ASSIGN_OR_RETURN(model->fuse_unk_, internal::ReadBool(value, path, "fuse_unk", false));
  ASSIGN_OR_RETURN(model->ignore_merges_, internal::ReadBool(value, path, "ignore_merges", false));

  // Vocab: {"token": id, ...}.
  std::string vocab_path = internal::JoinPath(path, "vocab");
  const Json* vocab = internal::FindMember(value, "vocab");
  if (vocab == nullptr) return internal::FieldError(vocab_path, "is missing");
  if (!vocab->is_object()) return internal::FieldError(vocab_path, "must be an object");
  model->vocab_.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    std::string entry_path = absl::StrCat(vocab_path, "[\"", it.key(), "\"]");
    if (!it->is_number_integer()) return internal::FieldError(entry_path, "must be an integer");
    int64_t id = it->get<int64_t>();
    if (id < 0 || id >= kMaxTokenId) {
      return internal::FieldError(entry_path, absl::StrCat("has id ", id, " out of range"));
    }
    if (static_cast<size_t>(id) >= model->id_to_token_.size()) {
      model->id_to_token_.resize(id + 1);
      model->id_present_.resize(id + 1, false);
    }
    if (model->id_present_[id]) {
      return internal::FieldError(
          entry_path, absl::StrCat("reuses id ", id, " of '", model->id_to_token_[id], "'"));
    }
    model->id_present_[id] = true;
    model->id_to_token_[id] = it.key();
    model->vocab_.emplace(it.key(), static_cast<int32_t>(id));
  }

  // Merges: ["a b", ...] (older files) or [["a", "b"], ...].
  std::string merges_path = internal::JoinPath(path, "merges");
  const Json* merges = internal::FindMember(value, "merges");
  if (merges != nullptr && !merges->is_null()) {
    if (!merges->is_array()) return internal::FieldError(merges_path, "must be an array");
    model->merges_.reserve(merges->size());
    for (size_t i = 0; i < merges->size(); ++i) {
      const Json& merge = (*merges)[i];
      std::string merge_path = internal::IndexPath(merges_path, i);
      std::string left, right;
      if (merge.is_string()) {
        const std::string& s = merge.get_ref<const std::string&>();
        size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          return internal::FieldError(merge_path, absl::StrCat("'", s, "' must be 'left right'"));
        }
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
                 merge[1].is_string()) {
        left = merge[0].get<std::string>();
        right = merge[1].get<std::string>();
      } else {
        return internal::FieldError(merge_path, "must be a string or a pair of strings");
      }
      RETURN_IF_ERROR(model->AddMerge(left, right, static_cast<int32_t>(i), merge_path));
    }
  }

  ASSIGN_OR_RETURN(std::optional<std::string> unk,
                   internal::ReadOptionalString(value, path, "unk_token"));
  if (unk.has_value()) {
    std::optional<int32_t> unk_id = model->TokenToId(*unk);
    if (!unk_id.has_value()) {
      return internal::FieldError(internal::JoinPath(path, "unk_token"),
                                  absl::StrCat("'", *unk, "' is not in the vocab"));
    }
    model->unk_id_ = unk_id;
  }
  for (int b = 0; b < 256; ++b) {
    std::optional<int32_t> id = model->TokenToId(absl::StrFormat("<0x%02X>", b));
    model->byte_ids_[b] = id.value_or(-1);
  }
  return model;
}

absl::Status BpeModel::AddMerge(const std::string& left, const std::string& right, int32_t rank,
                                const std::string& path) {
  std::optional<int32_t> a = TokenToId(left);
  std::optional<int32_t> b = TokenToId(right);
  std::optional<int32_t> merged = TokenToId(left + right);
  if (!a.has_value() || !b.has_value() || !merged.has_value()) {
    const std::string& missing = !a ? left : !b ? right : left + right;
    return internal::FieldError(
        path, absl::StrCat("'", left, " ", right, "': token '", missing, "' is not in the vocab"));
  }
  // A repeated pair keeps its last rank, as HF's map construction does.
  merges_[PairKey(*a, *b)] = Merge{rank, *merged};
  return absl::OkStatus();
}

std::optional<int32_t> BpeModel::TokenToId(absl::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !id_present_[id]) {
    return nullptr;
  }
  return &id_to_token_[id];
}

void BpeModel::Tokenize(absl::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (std::optional<int32_t> id = TokenToId(word)) {
      out->push_back(*id);
      return;
    }
  }
  bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    absl::MutexLock lock(&cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  MergeWord(word, &ids);
  out->insert(out->end(), ids.begin(), ids.end());
  if (cacheable) {
    absl::MutexLock lock(&cache_mu_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(word, std::move(ids));
  }
}

void BpeModel::MergeWord(absl::string_view word, std::vector<int32_t>* out) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool removed;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&symbols](int32_t id) {
    int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, -1, false});
    if (index > 0) symbols[index - 1].next = index;
  };

  // Initial symbols: one per character, with HF's byte-fallback and unk handling (a pending
  // unk is emitted before the next in-vocab character, and after any byte-fallback tokens).
  bool unk_pending = false;
  for (size_t pos = 0; pos < word.size();) {
    size_t len = DecodeUtf8At(word, pos).length;
    absl::string_view piece = word.substr(pos, len);
    pos += len;
    if (std::optional<int32_t> id = TokenToId(piece)) {
      if (unk_pending) add(*unk_id_);
      unk_pending = false;
      add(*id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : piece) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        for (char c : piece) add(byte_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_id_.has_value()) {
      if (unk_pending && !fuse_unk_) add(*unk_id_);
      unk_pending = true;
    }
  }
  if (unk_pending) add(*unk_id_);

  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator<(const Candidate& o) const {  // priority_queue pops the largest
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate> queue;
  auto push_pair = [&](int32_t pos) {
    int32_t next = symbols[pos].next;
    if (next < 0) return;
    auto it = merges_.find(PairKey(symbols[pos].id, symbols[next].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.new_id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) push_pair(i);

  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.removed || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    auto it = merges_.find(PairKey(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;  // stale entry
    left.id = top.new_id;
    right.removed = true;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& s : symbols) {
    if (!s.removed) out->push_back(s.id);
  }
}

}  // namespace tokenselect::tokenizer
