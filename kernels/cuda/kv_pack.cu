// KvGather / KvScatter (kv_pack.h): a pure copy between paged cache rows and staging rows.
//
// Work mapping: one warp per staging row r (of num_layers * 2 * num_tokens rows, token fastest,
// so consecutive warps of a block touch consecutive staging rows); kWarps warps per block; with
// max_blocks the grid is capped and warps stride over rows. The row index gives (layer, k|v,
// token); the token's slot gives the cache row. A warp copies the row in 16-byte pieces, each
// lane issuing kUnroll loads before its stores (32 lanes x 4 x 16 B = a whole 1024-element bf16
// row in flight per warp, which a capped grid needs to keep HBM busy), when the row length and
// both row pointers allow it, else element by element (2 or 1 bytes). Bytes: row * elem_bytes
// read and written per row; no reuse, so the kernel runs at copy bandwidth
// (bench/nccl_kv_bench.cc).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/kv_pack.h"

namespace tokenselect::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kUnroll = 4;

struct CopyParams {
  __nv_bfloat16* const* k_layers;  // written only by the scatter
  __nv_bfloat16* const* v_layers;
  __nv_bfloat16* staging;  // written only by the gather
  const int32_t* slots;
  int64_t num_layers;
  int64_t num_tokens;
  int64_t row;
  int64_t num_slots;
  int max_blocks;
  int elem_bytes;
};

template <bool kGather>
__device__ __forceinline__ void CopyRow(const CopyParams& p, int64_t r, int lane) {
  const int64_t t = r % p.num_tokens;
  const int64_t layer_kv = r / p.num_tokens;
  const int64_t row_bytes = p.row * p.elem_bytes;
  char* const cache = reinterpret_cast<char*>(((layer_kv & 1) ? p.v_layers : p.k_layers)[layer_kv >> 1]);
  char* const staged = reinterpret_cast<char*>(p.staging) + r * row_bytes;
  const int32_t slot = p.slots[t];
  if (slot < 0 || slot >= p.num_slots) {
    if constexpr (kGather) {
      for (int64_t j = lane; j < row_bytes; j += 32) staged[j] = 0;
    }
    return;
  }
  char* const cached = cache + static_cast<int64_t>(slot) * row_bytes;
  char* const dst = kGather ? staged : cached;
  const char* const src = kGather ? cached : staged;
  const bool vector =
      row_bytes % 16 == 0 &&
      (reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % 16 == 0;
  if (vector) {
    const int64_t pieces = row_bytes / 16;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (int64_t base = 0; base < pieces; base += 32 * kUnroll) {
      uint4 v[kUnroll];  // (a zero initializer spills 4 bytes on sm_80)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = base + u * 32 + lane;
        if (c < pieces) v[u] = s[c];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = base + u * 32 + lane;
        if (c < pieces) d[c] = v[u];
      }
    }
  } else if (p.elem_bytes == 2) {
    const __nv_bfloat16* s = reinterpret_cast<const __nv_bfloat16*>(src);
    __nv_bfloat16* d = reinterpret_cast<__nv_bfloat16*>(dst);
    for (int64_t j = lane; j < p.row; j += 32) d[j] = s[j];
  } else {
    for (int64_t j = lane; j < row_bytes; j += 32) dst[j] = src[j];
  }
}

template <bool kGather>
__global__ void __launch_bounds__(kThreads) KvCopyKernel(CopyParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t rows = p.num_layers * 2 * p.num_tokens;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows;
       r += stride) {
    CopyRow<kGather>(p, r, lane);
  }
}

cudaError_t Launch(const CopyParams& p, bool gather, cudaStream_t stream) {
  if (p.num_layers < 0 || p.num_tokens < 0 || p.row < 0 || p.num_slots < 0 || p.max_blocks < 0 ||
      (p.elem_bytes != 1 && p.elem_bytes != 2)) {
    return cudaErrorInvalidValue;
  }
  if (p.num_layers == 0 || p.num_tokens == 0 || p.row == 0) return cudaSuccess;
  if (p.k_layers == nullptr || p.v_layers == nullptr || p.staging == nullptr ||
      p.slots == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int64_t rows = p.num_layers * 2 * p.num_tokens;
  int64_t blocks = (rows + kWarps - 1) / kWarps;
  if (p.max_blocks > 0 && blocks > p.max_blocks) blocks = p.max_blocks;
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;
  if (gather) {
    KvCopyKernel<true><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  } else {
    KvCopyKernel<false><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t KvGather(const KvGatherParams& params, cudaStream_t stream) {
  // The kernel only reads the caches when gathering; the casts share one kernel body.
  const CopyParams p{const_cast<__nv_bfloat16* const*>(params.k_layers),
                     const_cast<__nv_bfloat16* const*>(params.v_layers),
                     params.staging,
                     params.slots,
                     params.num_layers,
                     params.num_tokens,
                     params.row,
                     params.num_slots,
                     params.max_blocks,
                     params.elem_bytes};
  return Launch(p, /*gather=*/true, stream);
}

cudaError_t KvScatter(const KvScatterParams& params, cudaStream_t stream) {
  // The kernel only reads the staging buffer when scattering.
  const CopyParams p{params.k_layers,   params.v_layers,
                     const_cast<__nv_bfloat16*>(params.staging),
                     params.slots,      params.num_layers,
                     params.num_tokens, params.row,
                     params.num_slots,  params.max_blocks,
                     params.elem_bytes};
  return Launch(p, /*gather=*/false, stream);
}

}  // namespace tokenselect::kernels::cuda
