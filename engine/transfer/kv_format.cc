#include "engine/transfer/kv_format.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tokenselect::engine {

int64_t KvDTypeSize(KvDType dtype) {
  switch (dtype) {
    case KvDType::kF32:
      return 4;
    case KvDType::kF16:
    case KvDType::kBF16:
      return 2;
    case KvDType::kFp8E4M3:
      return 1;
    case KvDType::kUnspecified:
      break;
  }
  return 0;
}

absl::string_view KvDTypeName(KvDType dtype) {
  switch (dtype) {
    case KvDType::kF32:
      return "f32";
    case KvDType::kF16:
      return "f16";
    case KvDType::kBF16:
      return "bf16";
    case KvDType::kFp8E4M3:
      return "fp8_e4m3";
    case KvDType::kUnspecified:
      return "unspecified";
  }
  return "unknown";
}

KvLayout LayoutOf(const PagePool& pool) {
  KvLayout layout;
  layout.num_layers = static_cast<int32_t>(pool.options().num_layers);
  layout.num_kv_heads = static_cast<int32_t>(pool.options().num_kv_heads);
  layout.head_dim = static_cast<int32_t>(pool.options().head_dim);
  layout.dtype = KvDType::kF32;
  return layout;
}

absl::Status CheckLayoutsMatch(const KvLayout& sender, const KvLayout& receiver) {
  auto mismatch = [](absl::string_view field, int64_t s, int64_t r) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV layout mismatch: ", field, " is ", s, " on the sender and ", r, " on the receiver"));
  };
  if (sender.num_layers != receiver.num_layers) {
    return mismatch("num_layers", sender.num_layers, receiver.num_layers);
  }
  if (sender.num_kv_heads != receiver.num_kv_heads) {
    return mismatch("num_kv_heads", sender.num_kv_heads, receiver.num_kv_heads);
  }
  if (sender.head_dim != receiver.head_dim) {
    return mismatch("head_dim", sender.head_dim, receiver.head_dim);
  }
  if (sender.dtype != receiver.dtype) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV layout mismatch: dtype is ", KvDTypeName(sender.dtype),
                     " on the sender and ", KvDTypeName(receiver.dtype), " on the receiver"));
  }
  return absl::OkStatus();
}

int64_t KvBlockBytes(const KvLayout& layout, const KvBlockRange& range) {
  return static_cast<int64_t>(range.layer_end - range.layer_begin) * 2 *
         (range.token_end - range.token_begin) * layout.num_kv_heads * layout.head_dim *
         KvDTypeSize(layout.dtype);
}

std::vector<KvBlockRange> PlanKvBlocks(const KvLayout& layout, int64_t token_begin,
                                       int64_t token_end, int64_t max_block_bytes) {
  std::vector<KvBlockRange> blocks;
  if (token_end <= token_begin || layout.num_layers <= 0) return blocks;
  const int64_t token_bytes =
      std::max<int64_t>(1, 2LL * layout.num_kv_heads * layout.head_dim * KvDTypeSize(layout.dtype));
  const int64_t layer_bytes = token_bytes * (token_end - token_begin);
  if (layer_bytes <= max_block_bytes) {
    // Whole layers: as many per block as fit.
    const int32_t per_block = static_cast<int32_t>(
        std::max<int64_t>(1, std::min<int64_t>(layout.num_layers, max_block_bytes / layer_bytes)));
    for (int32_t l = 0; l < layout.num_layers; l += per_block) {
      blocks.push_back({l, std::min(layout.num_layers, l + per_block), token_begin, token_end});
    }
    return blocks;
  }
  // Token slices of one layer each, in token order then layer order.
  const int64_t per_block = std::max<int64_t>(1, max_block_bytes / token_bytes);
  for (int64_t t = token_begin; t < token_end; t += per_block) {
    const int64_t end = std::min(token_end, t + per_block);
    for (int32_t l = 0; l < layout.num_layers; ++l) blocks.push_back({l, l + 1, t, end});
  }
  return blocks;
}

uint64_t KvChecksum(absl::string_view data) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : data) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

absl::StatusOr<KvBlock> EncodeKvBlock(const PagePool& pool, const KvBlockRange& range,
                                      absl::Span<const int32_t> slots, int64_t sequence,
                                      bool checksum) {
  const KvLayout layout = LayoutOf(pool);
  if (range.layer_begin < 0 || range.layer_begin >= range.layer_end ||
      range.layer_end > layout.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer range [", range.layer_begin, ", ",
                                                   range.layer_end, ") outside [0, ",
                                                   layout.num_layers, ")"));
  }
  const int64_t num_tokens = range.token_end - range.token_begin;
  if (range.token_begin < 0 || num_tokens <= 0 ||
      static_cast<int64_t>(slots.size()) != num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("token range [", range.token_begin, ", ",
                                                   range.token_end, ") does not match ",
                                                   slots.size(), " slots"));
  }
  for (int32_t slot : slots) {
    if (slot < 0 || slot >= pool.num_slots()) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot ", slot, " outside the pool's ", pool.num_slots(), " slots"));
    }
  }
  const int64_t stride = pool.slot_stride();
  KvBlock block;
  block.sequence = sequence;
  block.layer_begin = range.layer_begin;
  block.layer_end = range.layer_end;
  block.token_begin = range.token_begin;
  block.token_end = range.token_end;
  block.dtype = KvDType::kF32;
  block.shape = {range.layer_end - range.layer_begin, 2, num_tokens, layout.num_kv_heads,
                 layout.head_dim};
  block.data.resize(static_cast<size_t>(KvBlockBytes(layout, range)));
  char* out = block.data.data();
  const size_t row_bytes = static_cast<size_t>(stride) * sizeof(float);
  for (int32_t l = range.layer_begin; l < range.layer_end; ++l) {
    for (const float* src : {pool.k(l), pool.v(l)}) {
      for (int32_t slot : slots) {
        std::memcpy(out, src + static_cast<int64_t>(slot) * stride, row_bytes);
        out += row_bytes;
      }
    }
  }
  if (checksum) block.checksum = KvChecksum(block.data);
  return block;
}

}  // namespace tokenselect::engine
