// A deterministic byte-level BPE trainer, used to ship a tokenizer with the generated demo
// checkpoints. The output is a tokenizer.json in the Llama-3 layout (Split with the Llama-3
// regex + ByteLevel(use_regex=false) pre-tokenizer, ByteLevel decoder, ignore_merges false so
// encoding replays exactly the learned merges) that Tokenizer loads and HF tokenizers reads.
//
// Algorithm: pre-tokenize and count words; start from the 256 byte symbols (ids 0..255 in byte
// order); repeatedly merge the most frequent adjacent pair, ties broken by the smaller
// (left, right) token strings, until the vocab is full or no pair reaches min_frequency. Every
// choice is a total order on strings, so the same input always gives byte-identical output.
#ifndef TOKENSELECT_TOKENIZER_BPE_TRAINER_H_
#define TOKENSELECT_TOKENIZER_BPE_TRAINER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tokenselect::tokenizer {

struct BpeTrainerOptions {
  // Pairs seen fewer times are never merged.
  int min_frequency = 2;
  // When set (it must be one of the special tokens), the post_processor puts it in front of
  // every encoding, as Llama-3 does with <|begin_of_text|>.
  std::string bos_token;
};

// Trains on `corpus` and returns the tokenizer.json text. `vocab_size` counts the 256 byte
// tokens, the merges and the `special_tokens` (which get the last ids, in the given order);
// training stops early when no pair is frequent enough, giving a smaller vocab.
// InvalidArgument when vocab_size < 256 + special tokens, or a special token is empty or
// repeated, or bos_token is not a special token.
absl::StatusOr<std::string> TrainByteLevelBpe(absl::string_view corpus, int vocab_size,
                                              const std::vector<std::string>& special_tokens,
                                              const BpeTrainerOptions& options = {});

}  // namespace tokenselect::tokenizer

#endif  // TOKENSELECT_TOKENIZER_BPE_TRAINER_H_
