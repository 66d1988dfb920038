// The tokenizer.json "post_processor", for single sequences: the ids put before and after the
// encoded text when special tokens are requested. Supported types: TemplateProcessing (its
// "single" template), BertProcessing, RobertaProcessing, ByteLevel (ids unchanged), Sequence.
#ifndef TOKENSELECT_TOKENIZER_POST_PROCESSOR_H_
#define TOKENSELECT_TOKENIZER_POST_PROCESSOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tokenizer/json_util.h"

namespace tokenselect::tokenizer {

struct SpecialTokenAffixes {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};

// Parses the post_processor at `path` (null: no affixes). InvalidArgument naming the field for
// unsupported types, a template without exactly one $A, or a SpecialToken missing from
// special_tokens.
absl::StatusOr<SpecialTokenAffixes> ParsePostProcessor(const internal::Json& value,
                                                       absl::string_view path);

}  // namespace tokenselect::tokenizer

#endif  // TOKENSELECT_TOKENIZER_POST_PROCESSOR_H_
