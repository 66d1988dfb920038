// One warp's soft vote of one candidate token, scored on CUDA cores: the bound-vote selection's
// screen scores the candidates it lists with it (bound_vote.cu, BoundVoteSelect's second
// launch).
//
// The row's kKv kv heads x 128 dims are split over the 32 lanes, kLanes = 32 / kKv lanes to a
// kv head, kDims = 128 / kLanes consecutive dims each (4 to 32). A lane dots its dims with the
// query of the 4 heads of its kv head (fp32, sequential fmaf), the kv head's lanes add up by an
// xor butterfly, and lane `part` < 4 of the group keeps head 4 kv + part's logit. The vote then
// follows VoteFromLogits' arithmetic exactly (expf(l - m) * inv_sum summed per chunk of 4 heads
// in order, the chunks in that kernel's tree order), so equal logits give equal votes; the
// logits themselves are fp32 dots, not the tensor-core kernel's bits.
#ifndef TOKENSELECT_KERNELS_CUDA_CANDIDATE_VOTE_CUH_
#define TOKENSELECT_KERNELS_CUDA_CANDIDATE_VOTE_CUH_

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cp_async.cuh"

namespace tokenselect::kernels::cuda::candidate_vote {

constexpr int kD = 128;  // head_dim
constexpr int kG = 4;    // query heads per kv head
// The staged query's size: 32 heads x 128 fp32.
constexpr int kQueryVecs = 32 * kD / 4;

// A key cache row's bytes: kv heads x 128 dims of bf16 or FP8.
__host__ __device__ constexpr int64_t RowBytes(bool fp8, int64_t kv_heads) {
  return kv_heads * kD * (fp8 ? 1 : 2);
}

// kDims values of one lane's key piece as floats (FP8: times the kv head's scale), read as
// 4- to 64-byte words (the piece's size: aligned, as the cache rows are).
template <bool kFp8, int kDims>
__device__ __forceinline__ void LoadPiece(const uint8_t* src, float scale, float (&k)[kDims]) {
  constexpr int kBytes = kDims * (kFp8 ? 1 : 2);
  constexpr int kWords = kBytes / 4;
  uint32_t raw[kWords];
  if constexpr (kBytes >= 16) {
#pragma unroll
    for (int v = 0; v < kBytes / 16; ++v) {
      const uint4 x = __ldg(reinterpret_cast<const uint4*>(src) + v);
      raw[4 * v] = x.x;
      raw[4 * v + 1] = x.y;
      raw[4 * v + 2] = x.z;
      raw[4 * v + 3] = x.w;
    }
  } else if constexpr (kBytes == 8) {
    const uint2 x = __ldg(reinterpret_cast<const uint2*>(src));
    raw[0] = x.x;
    raw[1] = x.y;
  } else {
    raw[0] = __ldg(reinterpret_cast<const uint32_t*>(src));
  }
#pragma unroll
  for (int d = 0; d < kDims; ++d) {
    if constexpr (kFp8) {
      __nv_fp8_e4m3 f;
      f.__x = static_cast<__nv_fp8_storage_t>((raw[d / 4] >> (8 * (d % 4))) & 0xffu);
      k[d] = static_cast<float>(f) * scale;
    } else {
      k[d] = __uint_as_float((d % 2 == 0 ? raw[d / 2] << 16 : raw[d / 2] & 0xffff0000u));
    }
  }
}

// The query rearranged for the lanes' reads: float4 (g, d / 4, lane) holds dims d .. d + 3 of
// the lane's piece for head 4 kv + g, so that a warp's 16-byte reads are 512 contiguous bytes
// (in the natural layout every lane of a step hit the same bank: 18 us for 2.2K candidates on
// an H200, against 10). Threads tid of nthreads share the copy, by cp.async (query 16-byte
// aligned): the caller commits and waits for its copies (cp_async.cuh), then synchronises.
template <int kKv>
__device__ __forceinline__ void StageQuery(float4* sm_q, const float* query, int tid,
                                           int nthreads) {
  constexpr int kLanes = 32 / kKv, kDims = kD / kLanes;
  for (int i = tid; i < kG * kKv * kD / 4; i += nthreads) {
    const int lane = i % 32, d4 = (i / 32) % (kDims / 4), g = i / 32 / (kDims / 4);
    const int kv = lane / kLanes, part = lane % kLanes;
    CpAsyncCa16(sm_q + i, query + (kv * kG + g) * kD + part * kDims + 4 * d4);
  }
}

// The soft vote of the token in cache slot `slot` (every lane of the warp; lane 0 returns it):
// sm_q from StageQuery, sm_m / sm_inv the heads' max and inverse sum.
template <bool kFp8, int kKv>
__device__ __forceinline__ float SoftVote(const float4* sm_q, const float* sm_m,
                                          const float* sm_inv, const void* k_cache,
                                          const float* k_scale, int32_t slot, float scale) {
  constexpr int kLanes = 32 / kKv, kDims = kD / kLanes, kElem = kFp8 ? 1 : 2;
  const int lane = threadIdx.x & 31;
  const int kv = lane / kLanes, part = lane % kLanes;
  const uint8_t* src = static_cast<const uint8_t*>(k_cache) +
                       static_cast<int64_t>(slot) * RowBytes(kFp8, kKv) +
                       (kv * kD + part * kDims) * kElem;
  float k[kDims];
  LoadPiece<kFp8, kDims>(src, kFp8 ? k_scale[kv] : 1.0f, k);
  float dot[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    float acc = 0.0f;
#pragma unroll
    for (int d4 = 0; d4 < kDims / 4; ++d4) {
      const float4 q = sm_q[(g * (kDims / 4) + d4) * 32 + lane];
      acc = fmaf(k[4 * d4], q.x, acc);
      acc = fmaf(k[4 * d4 + 1], q.y, acc);
      acc = fmaf(k[4 * d4 + 2], q.z, acc);
      acc = fmaf(k[4 * d4 + 3], q.w, acc);
    }
    dot[g] = acc;
  }
#pragma unroll
  for (int off = 1; off < kLanes; off <<= 1) {
#pragma unroll
    for (int g = 0; g < kG; ++g) dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], off);
  }
  float term = 0.0f;
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (part == g) {
      const int h = kv * kG + g;
      term = expf(dot[g] * scale - sm_m[h]) * sm_inv[h];
    }
  }
  // The chunk's sum in head order (VoteFromLogits: vote += term, e = 0..3), then the chunks in
  // its tree order (v[c] += v[c + off] for c a multiple of 2 off).
  const int group = kv * kLanes;
  float v = __shfl_sync(0xffffffffu, term, group);
#pragma unroll
  for (int e = 1; e < kG; ++e) v += __shfl_sync(0xffffffffu, term, group + e);
#pragma unroll
  for (int off = 1; off < kKv; off <<= 1) v += __shfl_down_sync(0xffffffffu, v, off * kLanes);
  return v;
}

// fn(fp8, kv) with std::integral_constant tags for the runtime shape (kv heads 1, 2, 4, 8).
template <class Fn>
__device__ __forceinline__ void DispatchShape(bool fp8, int64_t num_kv_heads, Fn&& fn) {
  auto by_kv = [&](auto fp8_tag) {
    switch (num_kv_heads) {
      case 1: fn(fp8_tag, std::integral_constant<int, 1>{}); break;
      case 2: fn(fp8_tag, std::integral_constant<int, 2>{}); break;
      case 4: fn(fp8_tag, std::integral_constant<int, 4>{}); break;
      default: fn(fp8_tag, std::integral_constant<int, 8>{}); break;
    }
  };
  if (fp8) {
    by_kv(std::true_type{});
  } else {
    by_kv(std::false_type{});
  }
}

}  // namespace tokenselect::kernels::cuda::candidate_vote

#endif  // TOKENSELECT_KERNELS_CUDA_CANDIDATE_VOTE_CUH_
