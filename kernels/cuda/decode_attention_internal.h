// Pieces shared by the two split kernels of decode attention (decode_attention.cu: CUDA cores;
// decode_attention_mma.cu: tensor cores). Included by .cu files only.
#ifndef TOKENSELECT_KERNELS_CUDA_DECODE_ATTENTION_INTERNAL_H_
#define TOKENSELECT_KERNELS_CUDA_DECODE_ATTENTION_INTERNAL_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/decode_attention.h"

namespace tokenselect::kernels::cuda::internal {

constexpr int kDecodeWarps = 4;  // warps per split block
constexpr float kLog2e = 1.4426950408889634f;

struct DecodeWorkspace {
  float* partial_out;  // [batch, num_heads, num_splits, head_dim]
  float* partial_lse;  // [batch, num_heads, num_splits], log2 domain
};

inline DecodeWorkspace CarveDecodeWorkspace(const DecodeAttentionParams& p) {
  DecodeWorkspace w;
  w.partial_out = static_cast<float*>(p.workspace);
  w.partial_lse = w.partial_out + p.batch * p.num_heads * p.num_splits * p.head_dim;
  return w;
}

// cos/sin of the HF fp32 RoPE angle: reduced by a two-part 2*pi (float(2 pi) = 6.2831854820...,
// 2 pi - float(2 pi) = -1.7484555e-7) before the fast sincos, so that angles up to ~1e7 keep
// ~1e-6 absolute accuracy.
__device__ __forceinline__ void RopeSinCos(float angle, float* s, float* c) {
  const float turns = rintf(angle * 0.15915494309189535f);
  float r = fmaf(-turns, 6.28318548202514648f, angle);
  r = fmaf(turns, 1.74845553e-07f, r);
  __sincosf(r, s, c);
}

// 2^x with the bare MUFU instruction (exp2f adds range fix-ups we do not need: x <= 0 here, and
// results below 2^-126 may flush to zero).
__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The block's kStates online-softmax states per head (m: running max, l: sum, acc: [D] fp32,
// in sm_ml / sm_acc) become the split's normalised partial output and log2-sum-exp.
template <int D, int G, int kStates>
__device__ __forceinline__ void WriteSplitResult(const DecodeAttentionParams& p,
                                                 const DecodeWorkspace& ws,
                                                 const float (*sm_acc)[G][D],
                                                 const float2 (*sm_ml)[G]) {
  const int split = blockIdx.x, kv = blockIdx.y, b = blockIdx.z;
  for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
    const int gi = idx / D, dim = idx % D;
    float m_all = -INFINITY;
    for (int st = 0; st < kStates; ++st) m_all = fmaxf(m_all, sm_ml[st][gi].x);
    float l_all = 0.0f, o = 0.0f;
    if (m_all != -INFINITY) {
      for (int st = 0; st < kStates; ++st) {
        const float w = exp2f(sm_ml[st][gi].x - m_all);  // 0 for empty states (m = -inf)
        l_all += sm_ml[st][gi].y * w;
        o += sm_acc[st][gi][dim] * w;
      }
    }
    const int64_t head = static_cast<int64_t>(b) * p.num_heads + kv * G + gi;
    const int64_t slot = head * p.num_splits + split;
    ws.partial_out[slot * D + dim] = l_all > 0.0f ? o / l_all : 0.0f;
    if (dim == 0) ws.partial_lse[slot] = l_all > 0.0f ? m_all + __log2f(l_all) : -INFINITY;
  }
}

// Tensor-core split kernel (decode_attention_mma.cu), D in {64, 128}, G in {1, 2, 4, 8}; kFp8:
// an e4m3 cache.
// Every LaunchDecodeSplitMma instantiation's shared-memory opt-in on the current device
// (kernel_attributes.h); PrepareAttentionKernels calls it.
cudaError_t ConfigureDecodeMmaKernels();
template <int D, int G, bool kFp8>
cudaError_t LaunchDecodeSplitMma(const DecodeAttentionParams& p, const DecodeWorkspace& ws,
                                 cudaStream_t stream);

}  // namespace tokenselect::kernels::cuda::internal

#endif  // TOKENSELECT_KERNELS_CUDA_DECODE_ATTENTION_INTERNAL_H_
