// The mixed training corpus shipped with the library (English prose, code, accented Latin,
// CJK, emoji, whitespace runs), written for this project. It is
// tokenizer/data/training_corpus.txt, embedded at build time; the HF reference script
// (tests/data/tokenizers/make_reference.py) trains on the same file.
#ifndef TOKENSELECT_TOKENIZER_TRAINING_CORPUS_H_
#define TOKENSELECT_TOKENIZER_TRAINING_CORPUS_H_

#include "absl/strings/string_view.h"

namespace tokenselect::tokenizer {

// The corpus text (UTF-8, a few tens of KB).
absl::string_view TrainingCorpus();

}  // namespace tokenselect::tokenizer

#endif  // TOKENSELECT_TOKENIZER_TRAINING_CORPUS_H_
