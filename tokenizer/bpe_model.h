// The tokenizer.json "model" of type BPE: vocab, ranked merges, and the options the supported
// families use (byte_fallback, unk_token, fuse_unk, ignore_merges). Immutable after loading;
// Tokenize is thread-safe (the per-pre-token cache has its own lock).
#ifndef TOKENSELECT_TOKENIZER_BPE_MODEL_H_
#define TOKENSELECT_TOKENIZER_BPE_MODEL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "tokenizer/json_util.h"

namespace tokenselect::tokenizer {

class BpeModel {
 public:
  // Builds from the "model" object at `path`. InvalidArgument naming the field for a model
  // type other than BPE, a malformed vocab or merge, a merge whose parts or result are not in
  // the vocab, an unk_token missing from the vocab, and options we do not implement
  // (dropout > 0, continuing_subword_prefix, end_of_word_suffix).
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(const internal::Json& value,
                                                            absl::string_view path);

  // Appends the ids of one pre-token. Characters missing from the vocab become <0xNN> byte
  // tokens (byte_fallback), else the unk token (fused when fuse_unk), else are dropped, as HF
  // does. Then merges apply lowest rank first, leftmost first among equal ranks.
  void Tokenize(absl::string_view word, std::vector<int32_t>* out) const;

  std::optional<int32_t> TokenToId(absl::string_view token) const;
  // nullptr for ids outside the vocab.
  const std::string* IdToToken(int32_t id) const;
  // One past the largest id of the vocab.
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }
  size_t num_merges() const { return merges_.size(); }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  BpeModel() = default;
  absl::Status AddMerge(const std::string& left, const std::string& right, int32_t rank,
                        const std::string& path);
  // The uncached algorithm: initial symbols, then merges with a priority queue.
  void MergeWord(absl::string_view word, std::vector<int32_t>* out) const;

  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> id_present_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_ids_{};  // <0xNN> ids, -1 when absent
  std::optional<int32_t> unk_id_;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;

  // Results for pre-tokens up to kMaxCachedWordBytes; cleared when it reaches kMaxCacheEntries.
  static constexpr size_t kMaxCachedWordBytes = 256;
  static constexpr size_t kMaxCacheEntries = 200000;
  mutable absl::Mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_ ABSL_GUARDED_BY(cache_mu_);
};

}  // namespace tokenselect::tokenizer

#endif  // TOKENSELECT_TOKENIZER_BPE_MODEL_H_
