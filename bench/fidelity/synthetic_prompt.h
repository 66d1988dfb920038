// Deterministic synthetic prompts for the fidelity harness: text with long-range structure
// (records that are referred to again much later), so that which distant tokens a policy keeps
// matters.
#ifndef TOKENSELECT_BENCH_FIDELITY_SYNTHETIC_PROMPT_H_
#define TOKENSELECT_BENCH_FIDELITY_SYNTHETIC_PROMPT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace tokenselect::bench {

// Records such as "Record 17: the silver lantern is kept in box 482.\n" in a seeded order, a
// record mentioned earlier repeated now and then, ending with a question about an early record.
// About num_records lines; the same seed gives the same text.
std::string SyntheticText(int64_t num_records, uint64_t seed);

// Exactly num_tokens ids: SyntheticText through `tok` (with its special tokens, e.g. BOS),
// cut so that the closing question stays at the end.
std::vector<int32_t> SyntheticPromptFromText(const tokenizer::Tokenizer& tok, int64_t num_tokens,
                                             uint64_t seed);

// Exactly num_tokens ids in [0, vocab_size) without a tokenizer: a seeded sequence of 64 random
// "phrases" of 12 ids each, so that phrases recur at long distances.
std::vector<int32_t> SyntheticPromptIds(int64_t vocab_size, int64_t num_tokens, uint64_t seed);

}  // namespace tokenselect::bench

#endif  // TOKENSELECT_BENCH_FIDELITY_SYNTHETIC_PROMPT_H_
