// The host framing of K/V transfer between a prefill and a decode worker (docs/kv_transfer.md;
// docs/DESIGN.md section 5). A request's cache travels as blocks, each one a layer range x token
// range of K and V with its dtype, shape and an optional checksum, then a final record with the
// first sampled token. This header holds the transport-independent parts: the structs, the block
// plan, encoding out of a PagePool and the checksum. The receiver's checks live in kv_receiver.h.
#ifndef TOKENSELECT_ENGINE_TRANSFER_KV_FORMAT_H_
#define TOKENSELECT_ENGINE_TRANSFER_KV_FORMAT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/kvcache/page_pool.h"
#include "engine/sampling/logprobs.h"

namespace tokenselect::engine {

// Element type of transferred K/V; the values match tokenselect.v1.KvDType.
enum class KvDType : int32_t {
  kUnspecified = 0,
  kF32 = 1,
  kF16 = 2,
  kBF16 = 3,
  kFp8E4M3 = 4,
};

// Bytes per element; 0 for kUnspecified or an unknown value.
int64_t KvDTypeSize(KvDType dtype);
absl::string_view KvDTypeName(KvDType dtype);

// A worker's cache geometry; sender and receiver must agree on it.
struct KvLayout {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  KvDType dtype = KvDType::kF32;
};

// The layout of `pool` (the CPU pool stores fp32).
KvLayout LayoutOf(const PagePool& pool);

// OK when the two layouts are equal; FailedPrecondition naming the first differing field.
absl::Status CheckLayoutsMatch(const KvLayout& sender, const KvLayout& receiver);

// One block: layers [layer_begin, layer_end) x tokens [token_begin, token_end).
// data holds shape = [layers, 2, tokens, num_kv_heads, head_dim] row-major elements, index 0 of
// the second axis being K (un-rotated) and 1 being V, little-endian.
struct KvBlock {
  int64_t sequence = 0;
  int32_t layer_begin = 0;
  int32_t layer_end = 0;
  int64_t token_begin = 0;
  int64_t token_end = 0;
  KvDType dtype = KvDType::kF32;
  std::vector<int64_t> shape;
  std::optional<uint64_t> checksum;
  std::string data;
  // Set when the payload travels over a device-to-device link of that id (the NCCL transport):
  // `data` is empty then and the receiver's KvSideChannel delivers the bytes.
  std::string link_id;
};

// The end of a stream: the first sampled token, the seed that sampled it and the selection
// policy's per-layer state.
struct KvFinal {
  int32_t first_token_id = -1;
  std::optional<float> first_token_logprob;
  std::vector<TokenLogprob> first_top_logprobs;
  uint64_t seed = 0;
  int64_t num_chunks = 0;
  double prefill_seconds = 0;
  // Per layer, in layer order, the SerializeLayerState bytes (engine/selection/layer_state.h)
  // of the request's SelectionAttention after the last prefill chunk; empty when the policy
  // kept no state (selection_state.h).
  std::vector<std::string> selection_states;
};

// A block to be cut: its ranges (the caller's plan, see PlanKvBlocks).
struct KvBlockRange {
  int32_t layer_begin = 0;
  int32_t layer_end = 0;
  int64_t token_begin = 0;
  int64_t token_end = 0;
};

// Splits layers [0, num_layers) x tokens [token_begin, token_end) into blocks of at most
// `max_block_bytes` payload each (at least one token of one layer per block, whatever the
// limit): whole layers when they fit, else token slices of one layer. Blocks are ordered by token
// range, then layer, so each layer receives its tokens in increasing order.
std::vector<KvBlockRange> PlanKvBlocks(const KvLayout& layout, int64_t token_begin,
                                       int64_t token_end, int64_t max_block_bytes);

// Payload bytes of a block over `range`.
int64_t KvBlockBytes(const KvLayout& layout, const KvBlockRange& range);

// FNV-1a 64-bit hash of `data` (the debug checksum).
uint64_t KvChecksum(absl::string_view data);

// Copies the K/V of tokens [range.token_begin, range.token_end) x layers of `range` out of `pool`
// into a block; `slots[i]` is the pool slot of token range.token_begin + i. With `checksum` the
// block carries KvChecksum(data). InvalidArgument for ranges outside the pool's layers, a slot
// outside the pool, or slots.size() != number of tokens.
absl::StatusOr<KvBlock> EncodeKvBlock(const PagePool& pool, const KvBlockRange& range,
                                      absl::Span<const int32_t> slots, int64_t sequence,
                                      bool checksum);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_TRANSFER_KV_FORMAT_H_
