// Split-KV decode attention over token-index lists with RoPE at gather time
// (decode_attention.h).
//
// DecodeSplitKernel: block (split, kv head, request), 4 warps. The split's list entries are dealt
// to warps in steps; a token's K and V rows of this kv head (d bf16 each) are read by L = d / 8
// lanes, so a warp walks 32 / L tokens at once. Lane `sub` owns the rotate_half pairs
// (4 sub + p, d/2 + 4 sub + p), p < 4: it loads 8 B of each half of K (and V), rotates its pairs
// with cos/sin of float(position) * inv_freq[i] (the HF fp32 angle; reduced by a two-part 2*pi
// before the fast sincos, so that angles up to ~1e7 keep ~1e-6 accuracy), and dots them with the
// g query heads of this kv head (rotated and pre-scaled by scale * log2(e) once, in registers).
// The partial dots are summed over the L lanes with xor shuffles; each lane group keeps an online
// softmax (base 2) and an fp32 accumulator for its 8 dims of each of the g heads. At the end the
// warps' states meet in shared memory and the block writes, per head, the normalised partial
// output [d] fp32 and its log2-sum-exp to the workspace.
// Bytes per token and kv head: 4 d (K + V) + 8 (slot, position); 512 + 8 B at d = 128.
// FP8 cache: the lane loads 4 B of each half of K and V instead of 8 and converts them (e4m3 ->
// half -> float) before the same arithmetic: 2 d + 8 B per token. The kv head's power-of-two
// scales stay out of the loop (the query is pre-scaled by K's, the accumulators multiplied by
// V's at the end; exact), so the result is bit for bit the bf16 one over the dequantized cache.
// This CUDA-core kernel is the fallback (params.use_tensor_cores = false); measured on H200 at 1M
// tokens: 1.69 ms (2.55 TB/s), instruction-bound (~120 warp instructions per (token, kv head):
// 64 FMAs per lane for q.k and p.v, ~32 for RoPE cos/sin, 32 for the shuffle reduction, the
// g-head online softmax repeated in all L lanes). The default is the tensor-core kernel in
// decode_attention_mma.cu (1.18-1.26 ms).
//
// DecodeMergeKernel: block (head, request), d threads: weights 2^(lse_s - max) over the splits,
// out = sum w_s o_s / sum w_s in bf16 (zeros when every split was empty).
//
// Both launches are programmatic dependents (pdl.cuh) of the kernel ahead of them; the split
// kernels wait for it before reading anything (the tensor-core one loads RoPE's inverse
// frequencies first, a model constant) and let the merge launch at once (one wave: every split
// block has started). Sparse decode (2688 tokens, H200): 13.1-13.2 -> 12.6 us with the top-k's
// trigger; no change in the decode step's time measured.
#include "kernels/cuda/decode_attention.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/decode_attention_internal.h"
#include "kernels/cuda/kv_cache_load.cuh"
#include "kernels/cuda/pdl.cuh"

namespace tokenselect::kernels::cuda {
namespace {

using internal::CarveDecodeWorkspace;
using internal::DecodeWorkspace;
using internal::FastExp2;
using internal::kLog2e;
using internal::RopeSinCos;
constexpr int kWarps = internal::kDecodeWarps;

constexpr int kMinSplitTokens = 128;
constexpr int kMaxSplits = 4096;  // the merge kernel keeps one weight per split in shared memory

__device__ __forceinline__ void Unpack4(uint2 raw, float* out) {
  out[0] = __uint_as_float(raw.x << 16);
  out[1] = __uint_as_float(raw.x & 0xffff0000u);
  out[2] = __uint_as_float(raw.y << 16);
  out[3] = __uint_as_float(raw.y & 0xffff0000u);
}

// 4 cache elements as fp32: bf16 (uint2) or e4m3 (uint32_t, times scale).
__device__ __forceinline__ void Unpack4(uint32_t raw, float* out, float scale) {
  kv_internal::Fp8x4ToFloat(raw, scale, out);
}
__device__ __forceinline__ void Unpack4(uint2 raw, float* out, float) { Unpack4(raw, out); }

// kUnroll: tokens per lane group per step (loads in flight per lane). kFp8: e4m3 cache.
template <int D, int G, int kUnroll, bool kFp8>
__global__ void __launch_bounds__(kWarps * 32, G <= 4 ? (kUnroll > 2 ? 3 : 4) : 2)
    DecodeSplitKernel(DecodeAttentionParams p, DecodeWorkspace ws) {
  using Elem = std::conditional_t<kFp8, uint8_t, __nv_bfloat16>;
  using Raw = std::conditional_t<kFp8, uint32_t, uint2>;  // 4 elements
  constexpr int L = D / 8;
  constexpr int TPW = 32 / L;  // tokens per warp per sub-step
  constexpr int kHalf = D / 2;
  __shared__ float sm_acc[kWarps * TPW][G][D];
  __shared__ float2 sm_ml[kWarps * TPW][G];

  PdlWait();              // launched as a dependent of the kernel ahead (pdl.cuh)
  PdlAllowDependents();  // one wave: every block has started, the merge may launch and wait
  const int split = blockIdx.x, kv = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = lane % L, group = lane / L;
  const int num_heads = static_cast<int>(p.num_heads);
  const int64_t row = p.num_kv_heads * D;  // elements per cache slot
  const Elem* k_cache = static_cast<const Elem*>(p.k_cache);
  const Elem* v_cache = static_cast<const Elem*>(p.v_cache);

  float freq[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) freq[i] = __ldg(p.inv_freq + 4 * sub + i);

  // Rotated, pre-scaled query rows: q[gi][0..3] = dims 4 sub + i, q[gi][4..7] = d/2 + 4 sub + i.
  float q[G][8];
  {
    const float q_pos = static_cast<float>(p.q_positions[b]);
    float cs[4], sn[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) RopeSinCos(q_pos * freq[i], &sn[i], &cs[i]);
    const float qscale = p.scale * kLog2e * (kFp8 ? __ldg(p.k_scale + kv) : 1.0f);
#pragma unroll
    for (int gi = 0; gi < G; ++gi) {
      const __nv_bfloat16* qh = p.q + (static_cast<int64_t>(b) * num_heads + kv * G + gi) * D;
      float lo[4], hi[4];
      Unpack4(*reinterpret_cast<const uint2*>(qh + 4 * sub), lo);
      Unpack4(*reinterpret_cast<const uint2*>(qh + kHalf + 4 * sub), hi);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        q[gi][i] = (lo[i] * cs[i] - hi[i] * sn[i]) * qscale;
        q[gi][4 + i] = (hi[i] * cs[i] + lo[i] * sn[i]) * qscale;
      }
    }
  }

  float acc[G][8];
  float m[G], l[G];
#pragma unroll
  for (int gi = 0; gi < G; ++gi) {
    m[gi] = -INFINITY;
    l[gi] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[gi][e] = 0.0f;
  }

  const int64_t list_begin = p.indptr[b];
  const int64_t len = p.indptr[b + 1] - list_begin;
  const int64_t per_split = (len + p.num_splits - 1) / p.num_splits;
  const int64_t begin = list_begin + min(len, split * per_split);
  const int64_t end = list_begin + min(len, (split + 1) * per_split);
  constexpr int kStep = kWarps * TPW * kUnroll;

  // Loads are unconditional (entries clamped into the range, results masked), so a step's loads
  // issue back to back; the next step's slots and positions are fetched before this step's math.
  int64_t base = begin + warp * TPW * kUnroll;
  int32_t slot[kUnroll] = {}, pos_next[kUnroll] = {};
  if (begin < end) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = min(base + u * TPW + group, end - 1);
      slot[u] = __ldg(p.indices + j);
      pos_next[u] = __ldg(p.kv_positions + j);
    }
  }
  for (; base < end; base += kStep) {
    Raw k_raw[kUnroll][2], v_raw[kUnroll][2];
    float pos[kUnroll];
    bool valid[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      valid[u] = base + u * TPW + group < end;
      pos[u] = static_cast<float>(pos_next[u]);
      const int64_t off = static_cast<int64_t>(slot[u]) * row + kv * D + 4 * sub;
      k_raw[u][0] = __ldg(reinterpret_cast<const Raw*>(k_cache + off));
      k_raw[u][1] = __ldg(reinterpret_cast<const Raw*>(k_cache + off + kHalf));
      v_raw[u][0] = __ldg(reinterpret_cast<const Raw*>(v_cache + off));
      v_raw[u][1] = __ldg(reinterpret_cast<const Raw*>(v_cache + off + kHalf));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = min(base + kStep + u * TPW + group, end - 1);
      slot[u] = __ldg(p.indices + j);
      pos_next[u] = __ldg(p.kv_positions + j);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float k[8];
      Unpack4(k_raw[u][0], k, 1.0f);
      Unpack4(k_raw[u][1], k + 4, 1.0f);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float sn, cs;
        RopeSinCos(pos[u] * freq[i], &sn, &cs);
        const float a = k[i], c = k[4 + i];
        k[i] = a * cs - c * sn;
        k[4 + i] = c * cs + a * sn;
      }
      float s[G];
#pragma unroll
      for (int gi = 0; gi < G; ++gi) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) dot = fmaf(q[gi][e], k[e], dot);
        s[gi] = dot;
      }
#pragma unroll
      for (int off = L / 2; off >= 1; off >>= 1) {
#pragma unroll
        for (int gi = 0; gi < G; ++gi) s[gi] += __shfl_xor_sync(0xffffffffu, s[gi], off);
      }
      if (valid[u]) {
        float v[8];
        Unpack4(v_raw[u][0], v, 1.0f);
        Unpack4(v_raw[u][1], v + 4, 1.0f);
#pragma unroll
        for (int gi = 0; gi < G; ++gi) {
          if (s[gi] > m[gi]) {
            const float alpha = FastExp2(m[gi] - s[gi]);
            l[gi] *= alpha;
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[gi][e] *= alpha;
            m[gi] = s[gi];
          }
          const float pr = FastExp2(s[gi] - m[gi]);
          l[gi] += pr;
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[gi][e] = fmaf(pr, v[e], acc[gi][e]);
        }
      }
    }
  }

  // Combine the kWarps * TPW lane groups' states (FP8: times V's scale, left out of the loop).
  const int state = warp * TPW + group;
  const float v_scale = kFp8 ? __ldg(p.v_scale + kv) : 1.0f;
#pragma unroll
  for (int gi = 0; gi < G; ++gi) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      sm_acc[state][gi][4 * sub + i] = acc[gi][i] * v_scale;
      sm_acc[state][gi][kHalf + 4 * sub + i] = acc[gi][4 + i] * v_scale;
    }
    if (sub == 0) sm_ml[state][gi] = make_float2(m[gi], l[gi]);
  }
  __syncthreads();
  internal::WriteSplitResult<D, G, kWarps * TPW>(p, ws, sm_acc, sm_ml);
}

// The merge's partial outputs per thread kept in registers when the splits are this few.
constexpr int kMergePrefetch = 32;

__global__ void DecodeMergeKernel(DecodeAttentionParams p, DecodeWorkspace ws) {
  // Split weights 2^(lse_s - max) / sum in shared memory first (loads in parallel, not one
  // dependent L2 round trip per split), then one coalesced pass over the partial outputs. With
  // at most kMergePrefetch splits and one dim per thread, the thread's partial outputs are loaded
  // with the weights' inputs, so the two loads share one round trip (twenty-second session, H200,
  // same call: sparse decode 12.5-12.6 -> 11.5 us, the cache-hit decode step 21.6 -> 20.1 us;
  // the same sum in the same order, so the same bits).
  extern __shared__ float sm_weight[];  // [num_splits]
  __shared__ float sm_red[32];
  PdlWait();  // the split kernel's partial outputs
  const int64_t head = static_cast<int64_t>(blockIdx.y) * p.num_heads + blockIdx.x;
  const float* partial = ws.partial_out + head * p.num_splits * p.head_dim;
  const bool prefetch = p.num_splits <= kMergePrefetch && p.head_dim == blockDim.x;
  float pre[kMergePrefetch];
  if (prefetch) {
#pragma unroll
    for (int s = 0; s < kMergePrefetch; ++s) {
      if (s < p.num_splits) pre[s] = partial[s * p.head_dim + threadIdx.x];
    }
  }
  const float* lse = ws.partial_lse + head * p.num_splits;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  float m = -INFINITY;
  for (int s = threadIdx.x; s < p.num_splits; s += blockDim.x) {
    sm_weight[s] = lse[s];
    m = fmaxf(m, sm_weight[s]);
  }
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (lane == 0) sm_red[warp] = m;
  __syncthreads();
  float m_all = -INFINITY;
  for (int w = 0; w < warps; ++w) m_all = fmaxf(m_all, sm_red[w]);
  __syncthreads();
  float sum = 0.0f;
  for (int s = threadIdx.x; s < p.num_splits; s += blockDim.x) {
    const float w = m_all == -INFINITY ? 0.0f : exp2f(sm_weight[s] - m_all);
    sm_weight[s] = w;
    sum += w;
  }
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) sm_red[warp] = sum;
  __syncthreads();
  float w_sum = 0.0f;
  for (int w = 0; w < warps; ++w) w_sum += sm_red[w];
  const float inv = w_sum > 0.0f ? 1.0f / w_sum : 0.0f;
  if (prefetch) {  // the same sum, in the same order, as the loop below
    float o = 0.0f;
#pragma unroll
    for (int s = 0; s < kMergePrefetch; ++s) {
      if (s < p.num_splits) o = fmaf(sm_weight[s], pre[s], o);
    }
    p.out[head * p.head_dim + threadIdx.x] = __float2bfloat16(o * inv);
    return;
  }
  for (int dim = threadIdx.x; dim < p.head_dim; dim += blockDim.x) {
    float o = 0.0f;
#pragma unroll 8
    for (int s = 0; s < p.num_splits; ++s) o = fmaf(sm_weight[s], partial[s * p.head_dim + dim], o);
    p.out[head * p.head_dim + dim] = __float2bfloat16(o * inv);
  }
}

template <int D, int G, bool kFp8>
cudaError_t LaunchDecode(const DecodeAttentionParams& p, cudaStream_t stream) {
  const DecodeWorkspace ws = CarveDecodeWorkspace(p);
  const dim3 grid(p.num_splits, static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>(p.batch));
  // Two tokens per lane group per step measured faster than four (more blocks per SM:
  // 1M tokens, 132 splits: 1.68 vs 1.79 ms on H200).
  if (p.use_tensor_cores) {
    TS_CUDA_RETURN_IF_ERROR((internal::LaunchDecodeSplitMma<D, G, kFp8>(p, ws, stream)));
  } else {
    TS_CUDA_RETURN_IF_ERROR(LaunchPdl(DecodeSplitKernel<D, G, 2, kFp8>, grid, dim3(kWarps * 32),
                                      0, stream, false, p, ws));
  }
  const dim3 merge_grid(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.batch));
  return LaunchPdl(DecodeMergeKernel, merge_grid, dim3(D), p.num_splits * sizeof(float), stream,
                   false, p, ws);
}

template <int D, bool kFp8>
cudaError_t DispatchDecodeGroup(const DecodeAttentionParams& p, int64_t group,
                                cudaStream_t stream) {
  switch (group) {
    case 1: return LaunchDecode<D, 1, kFp8>(p, stream);
    case 2: return LaunchDecode<D, 2, kFp8>(p, stream);
    case 4: return LaunchDecode<D, 4, kFp8>(p, stream);
    case 8: return LaunchDecode<D, 8, kFp8>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <bool kFp8>
cudaError_t DispatchDecodeDim(const DecodeAttentionParams& p, int64_t group,
                              cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: return DispatchDecodeGroup<64, kFp8>(p, group, stream);
    case 128: return DispatchDecodeGroup<128, kFp8>(p, group, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

int PlanDecodeSplits(int64_t batch, int64_t num_kv_heads, int64_t max_kv_len, int num_sms) {
  const int64_t units = std::max<int64_t>(1, batch * num_kv_heads);
  // One wave of the tensor-core kernel (2 blocks per multiprocessor: ~107 KiB of shared memory
  // each), with ranges of at least 128 tokens. Measured on H200 (Llama-3-8B shape, with the
  // register-pipelined kernel before cp.async): 1M tokens 1.27 ms at 33 splits (66: 1.28, 132:
  // 1.31, 528: 1.46); 2688 tokens 15.3 us at 21 splits (10: 18.3, 42: 20.5, 84: 29.3): every
  // extra wave adds a dependent chain of memory round trips.
  const int64_t want = (static_cast<int64_t>(num_sms) * 2 + units - 1) / units;
  const int64_t most = std::max<int64_t>(1, max_kv_len / kMinSplitTokens);
  return static_cast<int>(std::clamp<int64_t>(std::min(want, most), 1, kMaxSplits));
}

size_t DecodeAttentionWorkspaceBytes(int64_t batch, int64_t num_heads, int64_t head_dim,
                                     int num_splits) {
  return static_cast<size_t>(batch * num_heads * num_splits * (head_dim + 1)) * sizeof(float);
}

cudaError_t DecodeAttention(const DecodeAttentionParams& p, cudaStream_t stream) {
  if (p.batch < 0 || p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0 ||
      p.num_splits < 1 || p.num_splits > kMaxSplits || p.batch > 65535) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0) return cudaSuccess;
  const int64_t group = p.num_heads / p.num_kv_heads;
  if (p.kv_type == KvCacheType::kFp8E4M3) {
    if (p.k_scale == nullptr || p.v_scale == nullptr) return cudaErrorInvalidValue;
    return DispatchDecodeDim<true>(p, group, stream);
  }
  return DispatchDecodeDim<false>(p, group, stream);
}

}  // namespace tokenselect::kernels::cuda
