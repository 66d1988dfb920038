// The element type of the KV cache (docs/fp8_kv.md), a per-run setting of both backends:
//   kBF16     the default: bf16 on the GPU (CudaModel); on the CPU the cache holds the values as
//             the model computes them (fp32, or bf16-rounded with ModelOptions::emulate_bf16).
//   kFP8E4M3  OCP e4m3fn with one power-of-two scale per (layer, KV head) for K and one for V,
//             derived from the weights (engine/model/kv_scales.h): half the bytes of bf16 on
//             the GPU. The CPU model simulates it (stores the dequantized values in its fp32
//             pool): same numerics, no memory saving.
// CPU-only header (no CUDA), so that flags, options and the CPU oracle can name the type.
#ifndef TOKENSELECT_ENGINE_MODEL_KV_CACHE_DTYPE_H_
#define TOKENSELECT_ENGINE_MODEL_KV_CACHE_DTYPE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tokenselect::engine {

enum class KvCacheDType { kBF16, kFP8E4M3 };

// "bf16" -> kBF16, "fp8" -> kFP8E4M3; InvalidArgument naming --kv_dtype for anything else.
absl::StatusOr<KvCacheDType> ParseKvCacheDType(absl::string_view name);
// "bf16" or "fp8" (ParseKvCacheDType's inverse).
const char* KvCacheDTypeName(KvCacheDType dtype);
// Bytes per cached element on the GPU: 2 (bf16) or 1 (fp8).
int64_t KvCacheElementBytes(KvCacheDType dtype);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_MODEL_KV_CACHE_DTYPE_H_
