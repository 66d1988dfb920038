// The element type of a KV cache as the kernels see it (engine/model/kv_cache_dtype.h is the
// engine's name for it; docs/fp8_kv.md).
//   kBf16     [num_slots, num_kv_heads, head_dim] bf16.
//   kFp8E4M3  the same shape in OCP e4m3fn bytes; element x of KV head h stands for
//             float(x) * scale[h], scale a power of two (one array for K, one for V: fp32
//             [num_kv_heads] in device memory). Kernels dequantize to exactly that value (exact
//             in bf16 and fp32) and run their bf16 arithmetic on it, so a kernel over an FP8
//             cache gives bit for bit what it gives over a bf16 cache of the dequantized values.
// Params structs of the kernels that read or write the cache carry the type and the two scale
// arrays next to their k_cache / v_cache pointers (which are untyped device pointers).
#ifndef TOKENSELECT_KERNELS_CUDA_KV_CACHE_TYPE_H_
#define TOKENSELECT_KERNELS_CUDA_KV_CACHE_TYPE_H_

namespace tokenselect::kernels::cuda {

enum class KvCacheType : int { kBf16 = 0, kFp8E4M3 = 1 };

// Bytes per element: 2 or 1.
inline int KvCacheTypeBytes(KvCacheType type) { return type == KvCacheType::kFp8E4M3 ? 1 : 2; }

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_KV_CACHE_TYPE_H_
