// Selection scoring on tensor cores (selection.h: ScoreKeys) for head_dim 128 and a query-head
// group of 4 (Llama-3-8B at TP = 1, 2 and 4: 8, 4 or 2 kv heads per GPU), FP8 or bf16 keys, and a
// 16-byte-aligned query.
//
// Why: the lane kernel (key_scores.cu) spends ~5 instructions per key element (unpack, then one
// fp32 FMA per query head of the group, then a reduce-scatter over lanes). With bf16 keys that
// stays under the memory time; with FP8 keys (half the bytes) it does not: 0.484 ms at 1M keys,
// 2.2 TB/s, against 0.58 ms for twice the bf16 bytes. Here a key element costs half a
// conversion and no FMA: the dot products are mma.sync m16n8k16 with fp32 accumulation.
//
// The query in 16-bit parts. Tensor cores take 16-bit inputs, so each query value q (fp32, times
// the kv head's FP8 scale) is split into parts whose sum is q to ~fp32 precision:
//   FP8 keys   A = the e4m3 keys as f16 (exact), B = q as f16 hi + lo (22 significant bits);
//              the 8 columns of one m16n8k16 are 4 heads x {hi, lo}: one MMA per 16 dims.
//   bf16 keys  A = the keys as stored, B = q as bf16 hi + mid + lo (24 bits): 4 heads x {hi,
//              mid} in one MMA, 4 heads x {lo, 0} in a second.
// The logit of (token, head) is the sum of its columns. Products of 16-bit values are exact in
// fp32, so the result differs from the lane kernel's fp32 FMA chain only by summation order and
// the last bits of q (the GPU tests bound it against an fp64 reference).
//
// Work mapping: a warp owns one kv head and walks 16-token tiles of its block's token range; a
// block is 8 warps = (8 / kv heads) rows of warps over the kv heads. In a tile, lane (g, t)
// (g = lane / 4, t = lane % 4) takes tokens g and g + 8, dims [32 t, 32 t + 32) of its kv head:
// 32 B per token for FP8 (loaded so, the 4 lanes of a quad reading one token's whole 128-dim
// row), 64 B for bf16 (read from the shared-memory ring, filled a token slice per half warp,
// below). The MMA's k index is permuted so that these words are its A fragment directly: MMA
// j's k positions {2t, 2t+1, 2t+8, 2t+9} are dims 32 t + 4 j + {0, 1, 2, 3}; the query
// fragments (registers for the whole kernel) use the same permutation. The accumulator of lane
// (g, t) then holds head t's logits of tokens g and g + 8: stored, and folded into the
// lane's online (max, sum-exp); quads, then rows of warps, then blocks combine those
// (key_scores_internal.cuh). The next tile's keys are loaded before this tile's MMAs: into
// registers for FP8 keys, through a per-warp ring in shared memory (cp.async) for bf16 keys.
//
// Tried for FP8 (eighth session, bench_fp8_kv_cuda on an H200, two runs each): loading two
// tiles ahead instead of one, the same bytes in flight per warp as bf16: 0.389 ms at 1M keys
// against 0.327 ms. It needs 107 registers, so 2 blocks per multiprocessor instead of 3 (80
// registers); more warps beat more bytes per warp here.
//
// Tried for bf16 (twenty-sixth session, docs/kernel_tuning_log.md): a producer warp bringing each
// tile's 2 KiB token rows in by bulk copies (cp.async.bulk on full / empty mbarriers, 3-6 tiles
// of 32 KiB in flight per block, no block barrier) for 8 consumer warps: correct, but 0.549-0.568
// ms at 1M against 0.545 ms for the ring below. What this kernel loses against the read ceiling
// is the logit stores: without them (timing only) it reads the keys at 97-98% of the ceiling in
// 0.49 ms; 16-bit logits, another layout or bulk stores cost as much as these.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/decode_attention_internal.h"
#include "kernels/cuda/kernel_attributes.h"
#include "kernels/cuda/key_scores_internal.cuh"
#include "kernels/cuda/l2_policy.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/selection.h"

namespace tokenselect::kernels::cuda::score_internal {
namespace {

constexpr int kD = 128;
constexpr int kG = 4;
constexpr int kThreads = 256;
constexpr int kTile = 16;  // tokens per MMA tile
// Bound mode's window: tokens x 32 heads of floats, head h of token j at 32 j + (h ^ 4 (j % 8))
// (TermAt): a warp's stores of tokens g, g + 8 x heads 4 kv + t land in 32 distinct banks, and
// 8 threads' 16-byte reads of consecutive tokens in 8 distinct bank groups. (Padding to 36
// floats did the same but took the 2 blocks of an SM over 196 KiB of shared memory, leaving
// 28 KiB of L1 instead of 60: H200 bound scoring 0.575 against 0.532 ms at 1M.)
constexpr int kBoundWindow = 256;
// Bound mode's sample: each block's first kSampleTiles steps (at most half a window), their
// logits held in the window until the sample barrier fixes C_h.
constexpr int kSampleTiles = 8;
constexpr int kTermStride = 32;
__device__ __forceinline__ int TermAt(int token, int head) {
  return token * kTermStride + (head ^ ((token & 7) << 2));
}
using internal::FastExp2;
using internal::kLog2e;

template <bool kFp8>
struct MmaTraits {
  static constexpr int kWords = kFp8 ? 8 : 16;  // 32-bit words of a lane's 32 dims of a token
  static constexpr int kMmas = kFp8 ? 1 : 2;    // MMAs per 16 dims
};

// Part `part` of q as a 16-bit value (raw bits): FP8 f16 {hi, lo}; bf16 {hi, mid, lo}; part -1
// is zero.
template <bool kFp8>
__device__ __forceinline__ uint16_t QueryPart(float q, int part) {
  if (part < 0) return 0;
  if constexpr (kFp8) {
    const __half hi = __float2half_rn(q);
    const __half lo = __float2half_rn(q - __half2float(hi));
    return __half_as_ushort(part == 0 ? hi : lo);
  } else {
    const __nv_bfloat16 hi = __float2bfloat16_rn(q);
    const float r = q - __bfloat162float(hi);
    const __nv_bfloat16 mid = __float2bfloat16_rn(r);
    const __nv_bfloat16 lo = __float2bfloat16_rn(r - __bfloat162float(mid));
    return __bfloat16_as_ushort(part == 0 ? hi : (part == 1 ? mid : lo));
  }
}

// Two e4m3 bytes (the lower at bits 0-7) as f16x2, the lower byte in the lower half.
__device__ __forceinline__ uint32_t Fp8x2ToHalf2(uint32_t two) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

template <bool kFp8>
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (kFp8) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// kStages > 0 (bf16 keys): the next tile's keys go to a per-warp ring of kStages tiles in shared
// memory. The copies are CpAsyncCa16 (cp_async.cuh: cached in L1 too), and each copy
// instruction of the warp takes two whole 256-byte token slices of this kv head (lanes 0-15 one
// token's 16 pieces, lanes 16-31 the next one's); after a __syncwarp the lanes read back the
// pieces of their MMA fragments (a swizzled layout, conflict-free). Twentieth session, same
// call against the previous copies (each lane copying its own four pieces, 64 bytes apart from
// its neighbours': half a 32-byte sector per copy, the other half from L1), H200, three rounds:
// 512K scoring 0.2808-0.2814 against 0.2836-0.2839 ms, the selection 0.3143-0.3147 against
// 0.3163-0.3168; 1M scoring 0.5446-0.5450 against 0.5491-0.5495, the selection 0.5989-0.5993
// against 0.6027-0.6031. (The nineteenth session had tried these copies with the slots loaded
// one tile ahead and shuffled to the lanes: the selection no faster.) Three stages of them:
// 0.3158-0.3163 at 512K against 0.3148-0.3150 for two (same call). Copies that bypass L1 were
// slower on an H200 whatever their shape: the per-lane copies as .cg 0.565 against 0.288 ms at
// 512K (eighteenth session), these coalesced ones as .cg 0.330-0.332, per-warp bulk copies
// (cp.async.bulk, an mbarrier per stage) 0.337-0.357 (nineteenth, docs/kernel_tuning_log.md). An L2
// prefetch-size hint: .L2::128B the same, .L2::256B slower (0.302 ms).
// The ring against keys in registers (eighteenth session, same binary): 512K scoring 0.2881 /
// 0.2880 against 0.2897 / 0.2900 ms, 1M 0.5596 / 0.5597 against 0.5622 / 0.5622. FP8 keys keep
// the registers (80 of them: 3 blocks per SM).
// kBound (selection.h: KeyScoreParams::vote_bound): every lane puts its term exp(l - C_h) into
// a shared window of kBoundWindow tokens x 32 heads (after the ring; TermAt's swizzle), and
// when the block's walk leaves the window each thread reduces one token's terms into its bound
// and top term (plain stores, no atomics: shared float atomics are compare-and-swap loops on
// sm_90, and the 8 kv heads' warps all add into the same 16 tokens per tile; the twenty-eighth
// session's atomics cost the H200 most of what dropping the logit stores saved: bound scoring
// 0.532 against 0.524 ms now). The walk is block-uniform (every warp the same number of
// steps), so the window's flushes and the sample barrier can use block barriers. The sample
// (thirty-first session; one step before, and every block waited for it): each block's first
// kSampleTiles steps; a block arrives and goes on, its logits held in the window, and waits for
// the flag only when the window is full. The bounds tighten (bench_kernels_cuda's data at 1M:
// bound ratio 6.8 -> 2.3; bench_fp8_kv_cuda's 8190 -> 2355 candidates, FP8 8698 -> 3032) and
// no block stalls at its start: H100 selection at 1M 0.7745-0.7763 -> 0.7706-0.7723 ms, on the
// FP8 bench's data 0.7962 -> 0.7787 (docs/kernel_tuning_log.md). Waiting for the sample after
// 8 steps instead cost 1-5 us.
// The L2 (thirty-second session): in bound mode the keys are read under an evict_first policy
// and the bounds stored under an evict_last one, and the screen discards the bounds' lines once
// read (l2_policy.cuh): the 8 bytes per token never reach DRAM. Their write-back had cost the
// key stream ~2%: with the stores left out (timing only) the bound scoring at 1M took 0.722
// against 0.740 ms on an H100. Evict_last stores alone kept only part of the lines (the chain
// 0.770 against 0.776 ms); the keys' evict_first is what keeps them: the selection at 1M
// 0.7763-0.7782 -> 0.7504-0.7522 ms, at 512K 0.4106-0.4129 -> 0.3947-0.3994 (H100, alternating
// in one call). The plain chain keeps normal loads: evict_first keys slowed its scoring (128
// MiB of logits written) from 0.790 to 0.803 ms.
// FP8 keys in bound mode are held to 3 blocks per SM (80 registers, no spills; 94 gave 2):
// bench_fp8_kv_cuda's FP8 selection at 512K / 1M went 0.2196-0.2224 -> 0.1980-0.2003 and
// 0.3839-0.3852 -> 0.3385-0.3395 ms on an H200 (the plain chain 0.2000-0.2013 / 0.3687-0.3690:
// the bound chain had been the slower one there), 0.2568-0.2583 -> 0.2469-0.2486 and
// 0.4653-0.4673 -> 0.4409-0.4416 on an H100 (thirty-first session).
template <bool kFp8, int kStages, bool kBound>
__global__ void __launch_bounds__(kThreads, kFp8 && kBound ? 3 : 2)
    ScoreKeysMmaKernel(KeyScoreParams p, ScoreWorkspace ws, int rows, int64_t chunk) {
  using Traits = MmaTraits<kFp8>;
  constexpr int kWords = Traits::kWords;
  constexpr int kMmas = Traits::kMmas;
  constexpr int kVecs = kWords / 4;  // 16-byte loads per token
  __shared__ float2 sm_stats[kThreads / 32][kG];
  PdlWait();  // launched as a dependent of the kernel ahead (the query's, or the cache check's)
  if (p.skip != nullptr && *p.skip != 0) return;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int num_kv = static_cast<int>(p.num_kv_heads);
  const int kv = warp % num_kv, row = warp / num_kv;
  const int g = lane >> 2, t = lane & 3;

  float2 stats = make_float2(-INFINITY, 0.0f);  // head t of this warp's kv head
  // Token indices fit in 32 bits (ScoreKeys takes n <= INT32_MAX - 2^20).
  const int n = static_cast<int>(max(ResolveLength(p.device_n, p.n), int64_t{1}));
  const int begin = static_cast<int>(blockIdx.x * chunk);
  const int end = static_cast<int>(min(static_cast<int64_t>(n), begin + chunk));
  const int stride = rows * kTile;
  const uint4* keys = static_cast<const uint4*>(p.k_cache);
  // 16-byte vectors per cache row, and this lane's first vector within a row.
  const int64_t row_vecs = p.num_kv_heads * kD * (kFp8 ? 1 : 2) / 16;
  const int64_t lane_vec = (kv * kD + 32 * t) * (kFp8 ? 1 : 2) / 16;
  // kStages > 0: [warp][stage][16 tokens][16 pieces of 16 B] (this kv head's 256 bytes of each
  // token row), the pieces swizzled so that the 8 lanes of a quarter warp reading tokens g, g + 1
  // x pieces 4 t + v hit 8 distinct 16-byte bank groups.
  extern __shared__ uint4 sm_stage[];
  auto stage_at = [&](int stage, int tok, int piece) {
    const int phys = (piece & 8) | ((piece & 7) ^ ((piece >> 3) << 1) ^ (tok & 1));
    return sm_stage + (warp * kStages + stage) * (kTile * 16) + tok * 16 + phys;
  };
  // Copy instruction i takes tokens 2 i and 2 i + 1 of the tile whole: lanes 0-15 the first's
  // 16 pieces, lanes 16-31 the second's (512 contiguous bytes per instruction and token pair).
  const uint4* head_keys = keys + kv * kD * 2 / 16;
  // Bound mode: the keys, read once, are evicted first, so that the bounds stay in L2 for the
  // screen (l2_policy.cuh). The prologue's copies (`hint` false) go without the policy: there
  // ptxas 13.0 gave the policy's descriptor an odd uniform register (LDGSTS ... desc[UR1]),
  // an illegal instruction at run time; the loop's copies get even ones. Checked by
  // disassembly (no odd desc register in the binary) and by the GPU tests, which fault if it
  // comes back.
  const uint64_t key_policy = kBound ? L2EvictFirst() : 0u;
  auto issue_tile = [&](int base, int stage, bool hint) {
#pragma unroll
    for (int i = 0; i < kTile / 2; ++i) {
      const int tok = 2 * i + (lane >> 4);
      const int64_t slot = __ldg(p.slots + min(base + tok, end - 1));
      const uint4* src = head_keys + slot * row_vecs + (lane & 15);
      if (kBound && hint) {
        CpAsyncCa16Policy(stage_at(stage, tok, lane & 15), src, key_policy);
      } else {
        CpAsyncCa16(stage_at(stage, tok, lane & 15), src);
      }
    }
  };
  // kStages == 0 (FP8 keys): this lane's pieces of tokens base + g and base + g + 8 into
  // registers (clamped: an L2 hit, masked later).
  uint4 raw[2][kVecs];
  auto load_tile = [&](int base, bool hint) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int tok = min(base + g + 8 * r, end - 1);
      const int64_t slot = __ldg(p.slots + tok);
      const uint4* src = keys + slot * row_vecs + lane_vec;
#pragma unroll
      for (int v = 0; v < kVecs; ++v) {
        raw[r][v] = kBound && hint ? LdgPolicy(src + v, key_policy) : __ldg(src + v);
      }
    }
  };
  int base = begin + row * kTile;
  int issue = base, stage = 0;
  // Bound mode: this block's window of terms, after the ring.
  float* sm_terms = reinterpret_cast<float*>(sm_stage + (kThreads / 32) * kStages * kTile * 16);
  int window_begin = begin;
  float bound_c2 = 0.0f;  // C_h log2(e) of this lane's head (kv * kG + t)
  // Token tok's place in the window for this lane's head, and its term from its logit.
  auto term_at = [&](int tok) -> float& {
    return sm_terms[TermAt(tok - window_begin, kv * kG + t)];
  };
  auto term = [&](float logit, int tok) {
    return tok < end ? FastExp2(fmaf(logit, kLog2e, -bound_c2)) : 0.0f;
  };
  if constexpr (kStages > 0) {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (issue < end) issue_tile(issue, s, /*hint=*/false);
      CpAsyncCommit();
      issue += stride;
    }
  } else {
    if (base < end) load_tile(base, /*hint=*/false);
  }
  // Query fragments: column g of MMA m is head g / 2, part (g % 2) + 2 m (FP8: parts 0, 1 in the
  // one MMA; bf16: 0, 1 in the first, 2 and zero in the second). Built while the first tiles'
  // copies are in flight, and the lane's 32 query values read as 8 16-byte loads (the launcher
  // checks the alignment). Before (twenty-second session), every call began with 32 scalar
  // loads per lane, each load instruction touching 16 lines of 128 bytes, then the splits, and
  // only then the first copies: H200, same call, scoring 0.0798 -> 0.0769 / 0.2807 -> 0.2781 /
  // 0.5469 -> 0.5438 ms at 128K / 512K / 1M. (Waiting for the cache check only after the first
  // copies, as KeyScoreParams could allow, took 0.5 us off the decode step and added 1.4 us to
  // its cache hit: not kept.)
  const float k_scale = kFp8 ? p.k_scale[kv] : 1.0f;
  const float4* q_head =
      reinterpret_cast<const float4*>(p.query + (kv * kG + g / 2) * kD + 32 * t);
  float qv[32];
#pragma unroll
  for (int v = 0; v < 8; ++v) {
    const float4 x = q_head[v];
    qv[4 * v] = x.x;
    qv[4 * v + 1] = x.y;
    qv[4 * v + 2] = x.z;
    qv[4 * v + 3] = x.w;
  }
  const int part0 = g % 2;
  uint32_t b[8][kMmas][2];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int m = 0; m < kMmas; ++m) {
      const int part = m == 0 ? part0 : (part0 == 0 ? 2 : -1);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float q0 = qv[4 * j + 2 * half] * k_scale;
        const float q1 = qv[4 * j + 2 * half + 1] * k_scale;
        const uint16_t lo = QueryPart<kFp8>(q0, part), hi = QueryPart<kFp8>(q1, part);
        b[j][m][half] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
      }
    }
  }

  const int num_heads = static_cast<int>(p.num_heads);
  // Bound mode: the block's first sample_tiles steps are its sample (at most half the first
  // window: the steps after them are held there too until the flag is seen).
  const int sample_tiles = max(1, min(kSampleTiles, kBoundWindow / stride / 2));
  int steps_held = 0;  // steps whose logits wait in the window for C_h
  bool arrived = false, sampled = false;
  // The block's (max, sum-exp) per head to ws.partial, from each lane's state st (head t of
  // its warp's kv head): over the 8 lanes of equal t, then over the rows of warps.
  auto write_partial = [&](float2 st) {
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {
      float2 other;
      other.x = __shfl_xor_sync(0xffffffffu, st.x, off);
      other.y = __shfl_xor_sync(0xffffffffu, st.y, off);
      st = CombineStats(st, other);
    }
    if (g == 0) sm_stats[warp][t] = st;
    __syncthreads();
    for (int h = threadIdx.x; h < num_heads; h += blockDim.x) {
      float2 acc = make_float2(-INFINITY, 0.0f);
      for (int r = 0; r < rows; ++r) acc = CombineStats(acc, sm_stats[r * num_kv + h / kG][h % kG]);
      ws.partial[blockIdx.x * num_heads + h] = acc;
    }
  };
  // The sample barrier (bound mode), in two halves so that a block goes on scoring in between
  // (its logits held in the window). Arrive: this block's state so far (its sample steps') to
  // ws.partial; the last block to arrive merges them into sample_max / sample_inv_sum and
  // raises the flag.
  auto sample_arrive = [&] {
    write_partial(stats);
    if (LastToArrive(ws.sample_counter, gridDim.x)) {
      CombinePartials<8>(ws.partial, static_cast<int>(gridDim.x), num_heads, nullptr,
                         p.sample_max, p.sample_inv_sum);
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0) {
        asm volatile("st.release.gpu.global.u32 [%0], 1;" ::"l"(ws.sample_flag) : "memory");
      }
    }
    arrived = true;
  };
  // Wait (every block, before it writes ws.partial again): the flag, then its lanes' C_h, and
  // the held steps' logits in the window turned into terms.
  auto sample_wait = [&] {
    if (threadIdx.x == 0) {
      unsigned int seen;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                     : "=r"(seen)
                     : "l"(ws.sample_flag)
                     : "memory");
      } while (seen == 0u);
    }
    __syncthreads();
    // A common shift (the sampled share of n) keeps the bounds near the votes' scale.
    const float sampled_tokens =
        fminf(static_cast<float>(n), static_cast<float>(gridDim.x) * stride * sample_tiles);
    const int h = kv * kG + t;
    bound_c2 = (__ldcg(p.sample_max + h) - __logf(__ldcg(p.sample_inv_sum + h)) +
                __logf(static_cast<float>(n) / sampled_tokens)) *
               kLog2e;
    for (int a = 0; a < steps_held; ++a) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int tok = window_begin + row * kTile + a * stride + g + 8 * r;
        term_at(tok) = term(term_at(tok), tok);
      }
    }
    sampled = true;
  };
  // Token i of the window: the sum of its terms and the largest, its head in the low 5 bits.
  auto flush_window = [&] {
    __syncthreads();
    const int count = min(kBoundWindow, end - window_begin);
    for (int i = threadIdx.x; i < count; i += kThreads) {
      float sum = 0.0f;
      uint32_t top = 0u;
      for (int q = 0; q < num_heads / 4; ++q) {
        const float4 v = *reinterpret_cast<const float4*>(sm_terms + TermAt(i, 4 * q));
        const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          sum += e[u];
          top = max(top, (__float_as_uint(e[u]) & ~31u) | static_cast<uint32_t>(4 * q + u));
        }
      }
      const uint64_t keep = L2EvictLast();  // until the screen reads and discards them
      StorePolicy(reinterpret_cast<uint32_t*>(p.vote_bound) + window_begin + i,
                  __float_as_uint(sum), keep);
      StorePolicy(p.vote_top + window_begin + i, top, keep);
    }
    __syncthreads();
  };
  const int walk_end = kBound ? begin + (end - begin + stride - 1) / stride * stride : end;
  for (; kBound ? base - row * kTile < walk_end : base < end; base += stride) {
    if constexpr (kStages > 0) {
      __syncwarp();  // every lane has read the stage refilled next
      if (issue < end) issue_tile(issue, (stage + kStages - 1) % kStages, /*hint=*/true);
      CpAsyncCommit();
      issue += stride;
      CpAsyncWait<kStages - 1>();
      __syncwarp();  // the other lanes' copies of this tile are visible
    }
    // The A fragments of the 8 MMAs (from this tile's stage, or its registers), then the next
    // tile's loads into the freed registers.
    uint32_t words[2][kWords];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int v = 0; v < kVecs; ++v) {
        const uint4 q = kStages > 0 ? *stage_at(stage, g + 8 * r, 4 * t + v) : raw[r][v];
        words[r][4 * v] = q.x;
        words[r][4 * v + 1] = q.y;
        words[r][4 * v + 2] = q.z;
        words[r][4 * v + 3] = q.w;
      }
    }
    if constexpr (kStages > 0) {
      stage = (stage + 1) % kStages;
    } else {
      if (base + stride < end) load_tile(base + stride, /*hint=*/true);
    }
    float c[kMmas][4] = {};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      uint32_t a[4];
      if constexpr (kFp8) {
        a[0] = Fp8x2ToHalf2(words[0][j]);        // token g, dims 4j + {0, 1}
        a[1] = Fp8x2ToHalf2(words[1][j]);        // token g + 8
        a[2] = Fp8x2ToHalf2(words[0][j] >> 16);  // token g, dims 4j + {2, 3}
        a[3] = Fp8x2ToHalf2(words[1][j] >> 16);
      } else {
        a[0] = words[0][2 * j];
        a[1] = words[1][2 * j];
        a[2] = words[0][2 * j + 1];
        a[3] = words[1][2 * j + 1];
      }
#pragma unroll
      for (int m = 0; m < kMmas; ++m) Mma<kFp8>(c[m], a, b[j][m][0], b[j][m][1]);
    }
    // Lane (g, t): c[m][0..1] = token g, head t, two parts; c[m][2..3] = token g + 8.
    float s2[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float dot = c[0][2 * r] + c[0][2 * r + 1];
      if constexpr (kMmas == 2) dot += c[1][2 * r];
      const int tok = base + g + 8 * r;
      s2[r] = dot * p.scale;
      if (tok < end) {
        const float s = s2[r];
        if constexpr (!kBound) {
          p.logits[(static_cast<int64_t>(kv) * p.n + tok) * kG + t] = s;  // LogitIndex
        }
        const float m_new = fmaxf(stats.x, s);
        stats.y = stats.y * __expf(stats.x - m_new) + __expf(s - m_new);
        stats.x = m_new;
      }
    }
    if constexpr (kBound) {
      // Before C_h is known a step's logits wait in the window (block-uniform branches): the
      // sample's steps, then the block arrives, then more steps until the window is full.
      if (!sampled && base - row * kTile < window_begin + kBoundWindow) {
#pragma unroll
        for (int r = 0; r < 2; ++r) term_at(base + g + 8 * r) = s2[r];
        ++steps_held;
        if (!arrived && (steps_held == sample_tiles || base + stride - row * kTile >= walk_end)) {
          sample_arrive();
        }
        continue;
      }
      if (!sampled) sample_wait();  // the window is full
      if (base - row * kTile >= window_begin + kBoundWindow) {  // block-uniform
        flush_window();
        window_begin += kBoundWindow;
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) term_at(base + g + 8 * r) = term(s2[r], base + g + 8 * r);
    }
  }
  if constexpr (kBound) {
    if (!arrived) sample_arrive();  // a block with no tokens still arrives
    if (!sampled) sample_wait();
    if (begin < end) flush_window();
  }

  if constexpr (kStages > 0) CpAsyncWait<0>();
  PdlAllowDependents();  // the vote may launch: what is left is this block's statistics
  write_partial(stats);
  // The final merger runs after every block has passed the sample barrier: it re-arms it.
  if (FinishScoreStats(p, ws) && kBound && threadIdx.x == 0) {
    *ws.sample_counter = 0;
    *ws.sample_flag = 0;
  }
}

// The ring's bytes per block: a stage is stage_at's 16 tokens x 16 pieces of 16 bytes per warp.
template <int kStages>
constexpr size_t kStageBytes =
    static_cast<size_t>(kThreads / 32) * kStages * kTile * 16 * sizeof(uint4);
template <int kStages, bool kBound>
constexpr size_t kSmemBytes =
    kStageBytes<kStages> + (kBound ? kBoundWindow * kTermStride * sizeof(float) : 0);

// The shared-memory opt-in (over 48 KiB) on the current device, once (kernel_attributes.h).
template <bool kFp8, int kStages, bool kBound>
cudaError_t Configure() {
  if constexpr (kSmemBytes<kStages, kBound> == 0) {
    return cudaSuccess;
  } else {
    static std::atomic<uint64_t> done{0};
    return OptInSharedMemoryOnce(ScoreKeysMmaKernel<kFp8, kStages, kBound>,
                                 kSmemBytes<kStages, kBound>, &done);
  }
}

template <bool kFp8, int kStages, bool kBound>
cudaError_t Launch(const KeyScoreParams& p, cudaStream_t stream) {
  const int rows = kThreads / 32 / static_cast<int>(p.num_kv_heads);
  constexpr size_t kSmem = kSmemBytes<kStages, kBound>;
  TS_CUDA_RETURN_IF_ERROR((Configure<kFp8, kStages, kBound>()));
  static std::atomic<int64_t> resident_cache{0};
  int64_t resident = 0;
  TS_CUDA_RETURN_IF_ERROR(ResidentBlocks(ScoreKeysMmaKernel<kFp8, kStages, kBound>, kThreads,
                                         kSmem, &resident_cache, &resident));
  const int64_t step = static_cast<int64_t>(rows) * kTile;
  const ScoreGrid grid = PlanScoreGrid(p.n, step, resident);
  return LaunchPdl(ScoreKeysMmaKernel<kFp8, kStages, kBound>, dim3(grid.blocks), dim3(kThreads),
                   kSmem, stream, /*cooperative=*/kBound, p,
                   CarveScoreWorkspace(p.workspace, p.num_heads), rows, grid.chunk);
}

bool MmaShape(int64_t num_heads, int64_t kv, int64_t head_dim) {
  return head_dim == kD && num_heads == kG * kv && (kv == 1 || kv == 2 || kv == 4 || kv == 8);
}

}  // namespace

cudaError_t LaunchScoreKeysMma(const KeyScoreParams& p, cudaStream_t stream) {
  if (!MmaShape(p.num_heads, p.num_kv_heads, p.head_dim) ||
      reinterpret_cast<uintptr_t>(p.query) % 16 != 0) {
    return cudaErrorNotSupported;
  }
  const bool fp8 = p.kv_type == KvCacheType::kFp8E4M3;
  if (p.vote_bound != nullptr) {
    if (p.sample_max == nullptr || p.sample_inv_sum == nullptr || p.vote_top == nullptr) {
      return cudaErrorInvalidValue;
    }
    return fp8 ? Launch<true, 0, true>(p, stream) : Launch<false, 2, true>(p, stream);
  }
  return fp8 ? Launch<true, 0, false>(p, stream) : Launch<false, 2, false>(p, stream);
}

cudaError_t ConfigureScoreKeysMmaKernels() { return Configure<false, 2, false>(); }

}  // namespace tokenselect::kernels::cuda::score_internal

namespace tokenselect::kernels::cuda {

// The bound mode is the tensor-core kernel's (selection.h).
bool BoundVoteSupported(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim) {
  return score_internal::MmaShape(num_heads, num_kv_heads, head_dim);
}

}  // namespace tokenselect::kernels::cuda
