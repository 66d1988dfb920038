#include "engine/transfer/kv_store.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tokenselect::engine {

absl::StatusOr<KvBlock> TableKvStore::Encode(const KvBlockRange& range, int64_t sequence,
                                             bool checksum) {
  if (range.token_begin < 0 || range.token_end <= range.token_begin ||
      range.token_end > table_->capacity()) {
    return absl::InvalidArgumentError(absl::StrCat("token range [", range.token_begin, ", ",
                                                   range.token_end, ") outside the reserved ",
                                                   table_->capacity(), " slots"));
  }
  return EncodeKvBlock(*table_->pool(), range, table_->Slots(range.token_begin, range.token_end),
                       sequence, checksum);
}

absl::Status TableKvStore::Write(const KvBlock& block) {
  PagePool* pool = table_->pool();
  const int64_t stride = pool->slot_stride();
  const size_t row_bytes = static_cast<size_t>(stride) * sizeof(float);
  const int64_t n = block.token_end - block.token_begin;
  if (static_cast<int64_t>(block.data.size()) !=
      (block.layer_end - block.layer_begin) * 2 * n * static_cast<int64_t>(row_bytes)) {
    return absl::InvalidArgumentError("block payload does not match its ranges");
  }
  const std::vector<int32_t> slots = table_->Slots(block.token_begin, block.token_end);
  const char* in = block.data.data();
  for (int32_t l = block.layer_begin; l < block.layer_end; ++l) {
    for (float* dst : {pool->k(l), pool->v(l)}) {
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(dst + static_cast<int64_t>(slots[static_cast<size_t>(i)]) * stride, in,
                    row_bytes);
        in += row_bytes;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status TableKvStore::Commit(int64_t tokens) {
  if (table_->length() != 0) {
    return absl::FailedPreconditionError("the reservation already holds tokens");
  }
  ASSIGN_OR_RETURN(int64_t first, table_->Append(tokens));
  (void)first;
  return absl::OkStatus();
}

}  // namespace tokenselect::engine
