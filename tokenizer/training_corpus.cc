#include "tokenizer/training_corpus.h"

#include <cstddef>

namespace tokenselect::tokenizer {
namespace internal {
extern const unsigned char kTrainingCorpusData[];
extern const size_t kTrainingCorpusSize;
}  // namespace internal

absl::string_view TrainingCorpus() {
  return absl::string_view(reinterpret_cast<const char*>(internal::kTrainingCorpusData),
                           internal::kTrainingCorpusSize);
}

}  // namespace tokenselect::tokenizer
