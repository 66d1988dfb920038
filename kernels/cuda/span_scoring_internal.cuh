// Pieces shared by the selection launchers of span_scoring.h: span_select.cu (tokenselect_span),
// quest_select.cu (Quest) and infllm_select.cu (InfLLM). Templates and inline helpers live here;
// the shared non-template functions (launch sizing, problem checks, output assembly) are defined
// in span_scoring_common.cu. Included by .cu files only.
//
// GroupScoreKernel: sum_h max_i scale * q_h . K[slot_i, h / g] for groups of keys, InfLLM's
// blocks' representatives (slots given). One warp per group; a kv head's d-vector is read by L = d
// / 8 lanes (16 B each), 32 / L kv heads per "pass", and up to 4 passes' loads are issued together
// per key (a 2 KB Llama-3 row is one load per lane per pass, all in flight at once). The query sits
// in shared memory. Partial dots are reduced over the L lanes by xor shuffles; the per-head maxima
// then sum across the warp in a fixed order. Reads (index vectors) * H_kv * d * 2 bytes of keys;
// latency-bound per group (a chain of a few dependent loads), so every group gets its own warp.
//
// The keys may be FP8 (e4m3 with per-KV-head scales, 8 B per lane instead of 16, dequantized in
// registers: the same floats as the bf16 kernel over the dequantized keys). (tokenselect_span's
// span scores used this kernel until the thirty-seventh session: span_select.cu says why not.)
//
// Output assembly (span_scoring_common.cu) writes the selected set from the picked units; see
// AssembleArgs.
#ifndef TOKENSELECT_KERNELS_CUDA_SPAN_SCORING_INTERNAL_CUH_
#define TOKENSELECT_KERNELS_CUDA_SPAN_SCORING_INTERNAL_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/device_length.h"
#include "kernels/cuda/kv_cache_load.cuh"
#include "kernels/cuda/span_scoring.h"

namespace tokenselect::kernels::cuda::span_internal {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * 32;
constexpr int kChooseThreads = 512;  // the one-block choice kernels (span walk, Quest pages)
constexpr int kPassChunk = 4;  // kv-head passes whose loads are in flight together
constexpr size_t kAlign = 256;
constexpr int64_t kMaxQueryFloats = 12288;  // 48 KB of shared memory
constexpr int kNumCounters = 8;  // device counters in the span and Quest workspaces

// Consecutive aligned pieces of a workspace; with a null base it only adds up sizes.
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  template <typename T>
  T* Take(int64_t count) {
    T* p = base_ != nullptr ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += (static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T) + kAlign - 1) /
             kAlign * kAlign;
    return p;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

// The device's SM count (cached; 132 when it cannot be queried).
int NumSms();

// Blocks of per_block items for items, clamped to [1, max_blocks].
int GridFor(int64_t items, int64_t per_block, int64_t max_blocks);

// The shapes and sizes every selection launcher accepts (head_dim 64 or 128, group size 1, 2, 4
// or 8, the query within kMaxQueryFloats, a finite scale, 32-bit token counts).
bool ValidProblem(const SelectionProblem& p);

// n_init + k + n_local >= N: every token is selected, no key is read.
bool Covers(const SelectionProblem& p);

// Units (Quest pages, InfLLM blocks) of `unit` tokens over the candidates [n_init, N - n_local);
// 0 when unit <= 0.
int64_t NumUnits(const SelectionProblem& p, int64_t unit);

// Calls fn(integral_constant<D>, integral_constant<G>) for the problem's head dim and group.
template <int D, typename Fn>
cudaError_t DispatchGroup(int64_t group, Fn&& fn) {
  switch (group) {
    case 1: return fn(std::integral_constant<int, D>{}, std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, D>{}, std::integral_constant<int, 2>{});
    case 4: return fn(std::integral_constant<int, D>{}, std::integral_constant<int, 4>{});
    case 8: return fn(std::integral_constant<int, D>{}, std::integral_constant<int, 8>{});
    default: return cudaErrorInvalidValue;
  }
}

template <typename Fn>
cudaError_t DispatchShape(const SelectionProblem& p, Fn&& fn) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  switch (p.head_dim) {
    case 64: return DispatchGroup<64>(group, fn);
    case 128: return DispatchGroup<128>(group, fn);
    default: return cudaErrorInvalidValue;
  }
}

// top_k.cu's order-preserving key: NaN lowest, -0 == +0.
__device__ __forceinline__ uint32_t OrderedKey(float f) {
  if (f != f) return 0u;
  uint32_t u = __float_as_uint(f);
  if (f == 0.0f) u = 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

struct MinOp {
  template <typename T>
  __device__ __forceinline__ T operator()(const T& a, const T& b) const {
    return b < a ? b : a;
  }
};
struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(const T& a, const T& b) const {
    return a < b ? b : a;
  }
};

// ---------------------------------------------------------------------------------------------
// Group scores.

struct GroupScoreArgs {
  float* scores = nullptr;  // [num_groups]; NaN for a group that is not scored
  const float* query = nullptr;
  const void* keys = nullptr;  // bf16 or e4m3 (kv_type, k_scale)
  KvCacheType kv_type = KvCacheType::kBf16;
  const float* k_scale = nullptr;  // FP8: [num_kv_heads]
  const int32_t* rep_slots = nullptr;  // [num_groups, reps]
  int64_t reps = 0;
  int64_t block_size = 0;
  int64_t num_groups = 0;
  int64_t cand_begin = 0;
  int64_t cand_end = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  float scale = 1.0f;
  const int32_t* skip = nullptr;  // optional [1]: when *skip != 0, write nothing
};

template <int D, int G, bool kFp8>
__global__ void __launch_bounds__(kThreads) GroupScoreKernel(GroupScoreArgs a) {
  // A lane's 8 elements of a key: 16 B of bf16 or 8 B of e4m3.
  using Raw = std::conditional_t<kFp8, uint2, uint4>;
  if (Skipped(a.skip)) return;
  const Raw* keys = static_cast<const Raw*>(a.keys);
  constexpr int L = D / 8;
  constexpr int KPW = 32 / L;
  extern __shared__ float sq[];  // [num_heads * D]
  for (int i = threadIdx.x; i < a.num_heads * D; i += blockDim.x) sq[i] = a.query[i];
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int sub = lane % L;
  const int kv_in_pass = lane / L;
  const int passes = (a.num_kv_heads + KPW - 1) / KPW;
  const int64_t row_vecs = static_cast<int64_t>(a.num_kv_heads) * L;

  auto item_slot = [&](int64_t item) -> int32_t { return __ldg(a.rep_slots + item); };

  for (int64_t grp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; grp < a.num_groups;
       grp += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const int64_t b0 = a.cand_begin + grp * a.block_size;
    const int64_t b1 = min(a.cand_end, b0 + a.block_size);
    const int64_t i0 = grp * a.reps;
    const int64_t i1 = i0 + min(a.reps, b1 - b0);
    const bool valid = i1 > i0;
    float total = 0.0f;
    if (valid) {  // warp-uniform
      for (int c0 = 0; c0 < passes; c0 += kPassChunk) {
        float best[kPassChunk][G];
#pragma unroll
        for (int pp = 0; pp < kPassChunk; ++pp) {
#pragma unroll
          for (int gi = 0; gi < G; ++gi) best[pp][gi] = -INFINITY;
        }
        int32_t next_slot = item_slot(i0);
        for (int64_t it = i0; it < i1; ++it) {
          const int64_t row = static_cast<int64_t>(next_slot) * row_vecs;
          if (it + 1 < i1) next_slot = item_slot(it + 1);
          Raw raw[kPassChunk];
#pragma unroll
          for (int pp = 0; pp < kPassChunk; ++pp) {
            const int kv = min((c0 + pp) * KPW + kv_in_pass, a.num_kv_heads - 1);
            if (c0 + pp < passes) raw[pp] = __ldg(keys + row + kv * L + sub);
          }
#pragma unroll
          for (int pp = 0; pp < kPassChunk; ++pp) {
            if (c0 + pp < passes) {  // warp-uniform
              float k8[8];
              const int kv = min((c0 + pp) * KPW + kv_in_pass, a.num_kv_heads - 1);
              if constexpr (kFp8) {
                kv_internal::Fp8x8ToFloat(raw[pp], __ldg(a.k_scale + kv), k8);
              } else {
                kv_internal::Bf16x8ToFloat(raw[pp], k8);
              }
#pragma unroll
              for (int gi = 0; gi < G; ++gi) {
                const float4* q4 = reinterpret_cast<const float4*>(sq + (kv * G + gi) * D + sub * 8);
                const float4 qa = q4[0], qb = q4[1];
                float dot = qa.x * k8[0] + qa.y * k8[1] + qa.z * k8[2] + qa.w * k8[3] +
                            qb.x * k8[4] + qb.y * k8[5] + qb.z * k8[6] + qb.w * k8[7];
#pragma unroll
                for (int off = L / 2; off > 0; off >>= 1) {
                  dot += __shfl_xor_sync(0xffffffffu, dot, off);
                }
                best[pp][gi] = fmaxf(best[pp][gi], a.scale * dot);
              }
            }
          }
        }
#pragma unroll
        for (int pp = 0; pp < kPassChunk; ++pp) {
          const int kv = (c0 + pp) * KPW + kv_in_pass;
          if (c0 + pp < passes && sub == 0 && kv < a.num_kv_heads) {
#pragma unroll
            for (int gi = 0; gi < G; ++gi) total += best[pp][gi];
          }
        }
      }
      total = WarpSum(total);
    }
    if (lane == 0) a.scores[grp] = valid ? total : __int_as_float(0x7fffffff);
  }
}

inline cudaError_t LaunchGroupScore(const GroupScoreArgs& a, int64_t head_dim,
                                    cudaStream_t stream) {
  if (a.num_groups == 0) return cudaSuccess;
  SelectionProblem shape;
  shape.num_heads = a.num_heads;
  shape.num_kv_heads = a.num_kv_heads;
  shape.head_dim = head_dim;
  const size_t smem = static_cast<size_t>(a.num_heads) * head_dim * sizeof(float);
  const int grid = GridFor(a.num_groups, kWarpsPerBlock, static_cast<int64_t>(NumSms()) * 16);
  return DispatchShape(shape, [&](auto d, auto g) {
    constexpr int D = decltype(d)::value, G = decltype(g)::value;
    if (a.kv_type == KvCacheType::kFp8E4M3) {
      GroupScoreKernel<D, G, true><<<grid, kThreads, smem, stream>>>(a);
      return cudaGetLastError();
    }
    GroupScoreKernel<D, G, false><<<grid, kThreads, smem, stream>>>(a);
    return cudaGetLastError();
  });
}

// ---------------------------------------------------------------------------------------------
// Output assembly.

struct AssembleArgs {
  int32_t* out = nullptr;
  int32_t* count = nullptr;
  const int32_t* picks = nullptr;          // ascending unit ids (or indices into map)
  const int32_t* map = nullptr;            // optional: unit id = map[picks[i]]
  const int32_t* num_picks_dev = nullptr;  // else num_picks_host
  int64_t num_picks_host = 0;
  int64_t unit = 1;
  int64_t begin = 0;  // unit u covers [begin + u * unit, min(end, begin + (u + 1) * unit))
  int64_t end = 0;
  int64_t n_init = 0;
  int64_t num_tokens = 0;
  int64_t n_local = 0;
  const int32_t* skip = nullptr;  // optional [1]: when *skip != 0, write nothing
};

// AssembleKernel: [0, n_init) + the picked units' tokens + [N - n_local, N) and the count.
cudaError_t LaunchAssemble(const AssembleArgs& a, int64_t capacity, cudaStream_t stream);

// The covering budget: [0, n) and the count n.
cudaError_t LaunchSelectAll(const SelectionOutput& out, int64_t n, cudaStream_t stream);

// AssembleArgs for out and p with no picks yet: units over the candidates [n_init, N - n_local).
AssembleArgs BaseAssemble(const SelectionOutput& out, const SelectionProblem& p);

}  // namespace tokenselect::kernels::cuda::span_internal

#endif  // TOKENSELECT_KERNELS_CUDA_SPAN_SCORING_INTERNAL_CUH_
