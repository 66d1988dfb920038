// Tensor-core split kernel of decode attention (decode_attention.h; used when
// params.use_tensor_cores). Same work split as the CUDA-core kernel: block (split, kv head,
// request), 4 warps; each warp takes 16-token tiles of the split in turn.
//
// Per tile, with mma.sync m16n8k16 (bf16 in, fp32 accumulate; sm_80+), g = lane / 4, t = lane % 4:
//   S^T [16 x 16] = Q [16 x d] . K^T: rows are the g query heads of this kv head (rows >= g are
//     zero), two n = 8 halves of tokens, d / 16 k-steps. The k index is permuted consistently
//     for Q and K so that thread t holds dims [t d/8, (t+1) d/8) and the same dims + d/2: each
//     rotate_half pair is in one thread (RoPE in registers, fp32, at gather time) and the thread's
//     K loads are 16 B vectors. Rotated K and Q are split into bf16 hi + lo parts and multiplied
//     as hi.hi + lo.hi + hi.lo (3 mma per k-step), which keeps the scores at ~fp32 accuracy.
//     Q's fragments are built once per block into shared memory.
//   Online softmax (base 2) on the C fragments: thread (g, t) holds head g's scores of tokens
//     2t, 2t+1 of each half; the tile max meets over the 4 threads of a row by shuffles.
//   O^T [d x 16] += V^T . P^T (16 dims per mma, d / 16 mma): P^T's B fragments are exactly the
//     S^T accumulators (bf16), no data movement; V^T's A fragments come from 16 B loads of
//     dims [g d/8, (g+1) d/8) of tokens 2t, 2t+1, 2t+8, 2t+9, paired with byte permutes.
//   The warp's next tile slots/positions are fetched while this tile computes.
// Registers: 233 at d = 128 (2 blocks per SM); one wave of blocks is fastest (PlanDecodeSplits).
// Measured on H200, Llama-3-8B shape: 1M tokens 1.27 ms (3.39 TB/s of K+V, 73% of cuDNN SDPA's
// speed on contiguous K/V without RoPE); 2688 random slots 15.3 us.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/decode_attention_internal.h"

namespace tokenselect::kernels::cuda::internal {
namespace {

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// x = hi + lo with both parts bf16-representable (to ~2^-16 relative); packs pairs.
__device__ __forceinline__ void SplitPack(float x0, float x1, uint32_t* hi, uint32_t* lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  *hi = *reinterpret_cast<const uint32_t*>(&h);
  *lo = PackBf16(x0 - __low2float(h), x1 - __high2float(h));
}

// c += a . b for one m16n8k16 tile (a0..a3: the A fragment registers, b0, b1: B's).
__device__ __forceinline__ void Mma(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                    uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void UnpackBf16x8(const uint4& raw, float* out) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <int D, int G>
__global__ void __launch_bounds__(kDecodeWarps * 32, 2)
    DecodeSplitMmaKernel(DecodeAttentionParams p, DecodeWorkspace ws) {
  constexpr int E = D / 8;       // dims per thread in each half; also rotate_half pairs
  constexpr int KS = D / 16;     // k-steps of S^T
  constexpr int V16 = E / 8;     // 16-byte vectors per thread per half row
  constexpr int kHalf = D / 2;
  __shared__ float sm_acc[kDecodeWarps][G][D];
  __shared__ float2 sm_ml[kDecodeWarps][G];

  const int kv = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row = p.num_kv_heads * D;

  // inv_freq in shared memory, not registers: the kernel sits at the 255-register limit.
  __shared__ float sm_freq[kHalf];
  for (int i = threadIdx.x; i < kHalf; i += blockDim.x) sm_freq[i] = __ldg(p.inv_freq + i);
  __syncthreads();
  const float* freq = sm_freq + t * E;

  // Q fragments of head g (zero rows for g >= G), rotated, scaled by scale * log2(e), split
  // into bf16 hi/lo: {hi a0, hi a2, lo a0, lo a2} per k-step and lane, in shared memory (the
  // kernel sits at the 255-register limit). Warp 0 writes them; every warp reads the same.
  __shared__ uint4 sm_q[KS][32];
  if (warp == 0) {
    float x[2 * E];
#pragma unroll
    for (int i = 0; i < 2 * E; ++i) x[i] = 0.0f;
    if (g < G) {
      const __nv_bfloat16* qrow = p.q + (static_cast<int64_t>(b) * p.num_heads + kv * G + g) * D;
#pragma unroll
      for (int v = 0; v < V16; ++v) {
        UnpackBf16x8(*reinterpret_cast<const uint4*>(qrow + t * E + 8 * v), x + 8 * v);
        UnpackBf16x8(*reinterpret_cast<const uint4*>(qrow + kHalf + t * E + 8 * v), x + E + 8 * v);
      }
      const float q_pos = static_cast<float>(p.q_positions[b]);
      const float qscale = p.scale * kLog2e;
#pragma unroll
      for (int i = 0; i < E; ++i) {
        float sn, cs;
        RopeSinCos(q_pos * freq[i], &sn, &cs);
        const float a = x[i], c = x[E + i];
        x[i] = (a * cs - c * sn) * qscale;
        x[E + i] = (c * cs + a * sn) * qscale;
      }
    }
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      uint4 f;
      SplitPack(x[4 * kk], x[4 * kk + 1], &f.x, &f.z);
      SplitPack(x[4 * kk + 2], x[4 * kk + 3], &f.y, &f.w);
      sm_q[kk][lane] = f;
    }
  }
  __syncthreads();

  // O^T accumulators: mma c covers dims g E + c (rows g) and g E + c + E/2 (rows g + 8) of
  // heads 2t, 2t+1 (columns).
  float o[E / 2][4];
#pragma unroll
  for (int c = 0; c < E / 2; ++c) o[c][0] = o[c][1] = o[c][2] = o[c][3] = 0.0f;
  float m = -INFINITY, l = 0.0f;

  const int64_t list_begin = p.indptr[b];
  const int64_t len = p.indptr[b + 1] - list_begin;
  const int64_t per_split = (len + p.num_splits - 1) / p.num_splits;
  const int64_t begin = list_begin + min(len, blockIdx.x * per_split);
  const int64_t end = list_begin + min(len, (blockIdx.x + 1) * per_split);

  // Slots and positions of the warp's next tile are fetched one tile ahead (indices clamped
  // into the range; masked tokens get zero weight).
  // K rows: tokens g and 8 + g; V rows: tokens 2t, 2t+1, 2t+8, 2t+9.
  int32_t k_slot[2] = {0, 0}, k_pos[2] = {0, 0}, v_slot[4] = {0, 0, 0, 0};
  auto fetch_indices = [&](int64_t jb) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int64_t j = min(jb + 8 * hf + g, end - 1);
      k_slot[hf] = __ldg(p.indices + j);
      k_pos[hf] = __ldg(p.kv_positions + j);
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      v_slot[r] = __ldg(p.indices + min(jb + 2 * t + (r & 1) + 8 * (r >> 1), end - 1));
    }
  };
  if (begin < end) fetch_indices(begin + warp * 16);

  for (int64_t jb = begin + warp * 16; jb < end; jb += kDecodeWarps * 16) {
    uint4 kraw[2][2][V16], vraw[4][V16];
    float kpos[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int64_t off = static_cast<int64_t>(k_slot[hf]) * row + kv * D + t * E;
      kpos[hf] = static_cast<float>(k_pos[hf]);
#pragma unroll
      for (int v = 0; v < V16; ++v) {
        kraw[hf][0][v] = __ldg(reinterpret_cast<const uint4*>(p.k_cache + off + 8 * v));
        kraw[hf][1][v] = __ldg(reinterpret_cast<const uint4*>(p.k_cache + off + kHalf + 8 * v));
      }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t off = static_cast<int64_t>(v_slot[r]) * row + kv * D + g * E;
#pragma unroll
      for (int v = 0; v < V16; ++v) {
        vraw[r][v] = __ldg(reinterpret_cast<const uint4*>(p.v_cache + off + 8 * v));
      }
    }
    fetch_indices(jb + kDecodeWarps * 16);

    // S^T halves: s[hf][e] = score of head g, token jb + 8 hf + 2t + e.
    float s[2][2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float x[2 * E];
#pragma unroll
      for (int v = 0; v < V16; ++v) {
        UnpackBf16x8(kraw[hf][0][v], x + 8 * v);
        UnpackBf16x8(kraw[hf][1][v], x + E + 8 * v);
      }
#pragma unroll
      for (int i = 0; i < E; ++i) {
        float sn, cs;
        RopeSinCos(kpos[hf] * freq[i], &sn, &cs);
        const float a = x[i], c = x[E + i];
        x[i] = a * cs - c * sn;
        x[E + i] = c * cs + a * sn;
      }
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        uint32_t kh0, kl0, kh1, kl1;
        SplitPack(x[4 * kk], x[4 * kk + 1], &kh0, &kl0);
        SplitPack(x[4 * kk + 2], x[4 * kk + 3], &kh1, &kl1);
        const uint4 qf = sm_q[kk][lane];
        Mma(acc, qf.x, 0u, qf.y, 0u, kh0, kh1);
        Mma(acc, qf.x, 0u, qf.y, 0u, kl0, kl1);
        Mma(acc, qf.z, 0u, qf.w, 0u, kh0, kh1);
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        s[hf][e] = jb + 8 * hf + 2 * t + e < end ? acc[e] : -INFINITY;
      }
    }

    // Online softmax for head g over this tile.
    float tile_max = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    const float m_new = fmaxf(m, tile_max);  // finite: every tile has a valid token
    const float alpha = FastExp2(m - m_new);  // 0 while m = -inf
    float pr[2][2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
      for (int e = 0; e < 2; ++e) pr[hf][e] = FastExp2(s[hf][e] - m_new);
    }
    l = l * alpha + (pr[0][0] + pr[0][1]) + (pr[1][0] + pr[1][1]);
    m = m_new;
    // P^T fragments are exactly the S^T accumulator layout: b0 = tokens 2t, 2t+1 of head g.
    const uint32_t pb0 = PackBf16(pr[0][0], pr[0][1]);
    const uint32_t pb1 = PackBf16(pr[1][0], pr[1][1]);
    // O^T columns are heads 2t, 2t+1: their rescale factors live in lanes 4 (2t) and 4 (2t+1).
    const float alpha0 = __shfl_sync(0xffffffffu, alpha, 8 * t);
    const float alpha1 = __shfl_sync(0xffffffffu, alpha, 8 * t + 4);

    // O^T += V^T . P^T, one mma per 16 output dims.
#pragma unroll
    for (int c = 0; c < E / 2; ++c) {
      o[c][0] *= alpha0;
      o[c][1] *= alpha1;
      o[c][2] *= alpha0;
      o[c][3] *= alpha1;
      const int e_lo = c, e_hi = c + E / 2;  // element indices within the thread's E dims
      const uint32_t sel_lo = (e_lo & 1) ? 0x7632u : 0x5410u;
      const uint32_t sel_hi = (e_hi & 1) ? 0x7632u : 0x5410u;
      const int v_lo = e_lo / 8, w_lo = (e_lo % 8) / 2, v_hi = e_hi / 8, w_hi = (e_hi % 8) / 2;
      const uint32_t a0 = __byte_perm(Word(vraw[0][v_lo], w_lo), Word(vraw[1][v_lo], w_lo), sel_lo);
      const uint32_t a1 = __byte_perm(Word(vraw[0][v_hi], w_hi), Word(vraw[1][v_hi], w_hi), sel_hi);
      const uint32_t a2 = __byte_perm(Word(vraw[2][v_lo], w_lo), Word(vraw[3][v_lo], w_lo), sel_lo);
      const uint32_t a3 = __byte_perm(Word(vraw[2][v_hi], w_hi), Word(vraw[3][v_hi], w_hi), sel_hi);
      Mma(o[c], a0, a1, a2, a3, pb0, pb1);
    }
  }

  // Row sums over the 4 threads of head g; then the warps' states meet in shared memory.
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int head = 2 * t + e;
    if (head < G) {
#pragma unroll
      for (int c = 0; c < E / 2; ++c) {
        sm_acc[warp][head][g * E + c] = o[c][e];
        sm_acc[warp][head][g * E + c + E / 2] = o[c][2 + e];
      }
    }
  }
  if (g < G && t == 0) sm_ml[warp][g] = make_float2(m, l);
  __syncthreads();
  WriteSplitResult<D, G, kDecodeWarps>(p, ws, sm_acc, sm_ml);
}

}  // namespace

template <int D, int G>
cudaError_t LaunchDecodeSplitMma(const DecodeAttentionParams& p, const DecodeWorkspace& ws,
                                 cudaStream_t stream) {
  const dim3 grid(p.num_splits, static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>(p.batch));
  DecodeSplitMmaKernel<D, G><<<grid, kDecodeWarps * 32, 0, stream>>>(p, ws);
  return cudaGetLastError();
}

#define TS_INSTANTIATE_DECODE_MMA(D, G)                                                 \
  template cudaError_t LaunchDecodeSplitMma<D, G>(const DecodeAttentionParams&,         \
                                                  const DecodeWorkspace&, cudaStream_t);
TS_INSTANTIATE_DECODE_MMA(64, 1)
TS_INSTANTIATE_DECODE_MMA(64, 2)
TS_INSTANTIATE_DECODE_MMA(64, 4)
TS_INSTANTIATE_DECODE_MMA(64, 8)
TS_INSTANTIATE_DECODE_MMA(128, 1)
TS_INSTANTIATE_DECODE_MMA(128, 2)
TS_INSTANTIATE_DECODE_MMA(128, 4)
TS_INSTANTIATE_DECODE_MMA(128, 8)
#undef TS_INSTANTIATE_DECODE_MMA

}  // namespace tokenselect::kernels::cuda::internal
