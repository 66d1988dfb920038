// Tensor-core split kernel of decode attention (decode_attention.h; used when
// params.use_tensor_cores). Same work split as the CUDA-core kernel: block (split, kv head,
// request), 4 warps; warp w takes the split's 16-token tiles w, w + 4, w + 8, ...
//
// Memory pipeline (why: the previous version loaded a tile into registers and then computed on
// it, so a warp had bytes in flight only between its tiles: 1.27 ms at 1M tokens, 73% of cuDNN
// SDPA). Each warp now owns kStages shared-memory stages of one tile (K and V rows of this kv
// head, [16][D] bf16 each with 16-byte chunks swizzled per row, StageLayout) and keeps
// kStages - 1 tiles in flight with cp.async (16 B per copy, L2 only) while it computes the
// oldest: 2 x 8 KiB in flight per warp, 128 KiB per multiprocessor at 2 blocks. The tile's slot
// and position ids are loaded one tile ahead of its copies (lanes 0-15: slots, 16-31:
// positions) and handed out by shuffles; positions go to the stage next to the rows. Only the
// warp's own lanes touch its stages, so cp.async.wait_group + __syncwarp order everything.
//
// Per tile, with mma.sync m16n8k16 (bf16 in, fp32 accumulate; sm_80+), g = lane / 4, t = lane % 4:
//   S^T [16 x 16] = Q [16 x d] . K^T: rows are the query heads of this kv head (below; rows of
//     heads >= G are zero), two n = 8 halves of tokens, d / 16 k-steps. K's B fragments come
//     from ldmatrix (x4: both token halves, both 8-dim halves of a k-step): thread (g, t) holds
//     dims 16 kk + 2t + {0, 1, 8, 9} of tokens g and 8 + g, and k-steps kk and kk + d/32 hold the
//     rotate_half partners (dim i and i + d/2), so RoPE is applied in registers (fp32, HF angle,
//     at gather time). Rotated K and Q are split into bf16 hi + lo parts, which keeps the
//     scores at ~fp32 accuracy: Q's hi parts are A's rows g and its lo parts rows g + 8 (a head
//     group has at most 8 heads), so one mma with K's hi part and one with its lo part give
//     hi.hi + lo.hi in rows g / g + 8 and hi.lo + lo.lo on top; a score is row g + row g + 8
//     (the same thread's c0 + c2, c1 + c3). Q's fragments are built once per block into shared
//     memory in exactly the A register order (one 16-byte load per mma pair, no moves).
//   Online softmax (base 2) on the C fragments: thread (g, t) holds head g's scores of tokens
//     2t, 2t+1 of each half; the tile max meets over the 4 threads of a row by shuffles.
//   O^T [d x 16] += V^T . P^T (16 dims per mma, d / 16 mma): P^T's B fragments are exactly the
//     S^T accumulators (bf16), no data movement; V^T's A fragments come from ldmatrix.trans of
//     the V rows (tokens x 8 dims matrices, transposed in flight).
// Registers: ~218-221 at d = 128; shared memory ~101 KiB per block (two blocks per SM, the
// occupancy limit). One wave of blocks is fastest (PlanDecodeSplits).
//
// Stage layout and L2 (twenty-first session). Until then the rows were padded to D + 8
// elements for conflict-free ldmatrix. Nsight Compute at 1M tokens (H200) then counted 201.7M
// L2 sector lookups from the SMs (34% of them hits) for 134M sectors of K and V, against 134.2M
// for cuDNN SDPA, with L2 at 95.7% of its throughput: a cp.async.cg whose 128-byte source piece
// lands across two 128-byte segments of shared memory requests some of its sectors twice (a
// probe kernel: 1.5x the lookups for any padded destination, 1.0x for aligned ones; .ca copies
// hit the repeats in L1 but leave too little L1 for the bytes in flight: 1.13-1.25 ms). With
// the chunk swizzle every piece is aligned: 135.8M lookups, and in the same call (an H200 where
// SDPA took 0.1274 / 0.4698 / 0.9258 ms at 128K / 512K / 1M) dense decode 0.1429-0.1432 /
// 0.5290-0.5296 / 1.0598-1.0692 -> 0.1433-0.1434 / 0.5153-0.5157 / 0.9960-1.0013 ms cold and,
// after 3 s of load, 0.1499 / 0.5660 / 1.1150 -> 0.1394 / 0.5306 / 1.0442 ms; sparse decode 13.6
// -> 13.1 us. Same arithmetic, same bits.
//
// Earlier analysis: the kernel looked bound by instruction issue: Nsight Compute (eleventh
// session, 1M tokens) showed 65% issue-slot use at 2 warps per scheduler, L2 at 96% and DRAM at
// 86% of peak, and "selected" / "wait" / "dispatch" as the top stall reasons (long scoreboard
// 4%), ~1215 instructions per 16-token tile of which RoPE (angle, reduction, sincos, rotation) is
// ~380. The eleventh session cut ~20% of them: 2 instead of 3 mma per k-step half with no zero
// or copied A registers (above; ~130 moves per tile), the hi/lo split without byte permutes, and
// a cache row's address as one 32 x 32 -> 64-bit multiply-add off a per-lane base pointer (was
// 64-bit index arithmetic, ~100 instructions per tile). Dense decode went 1.288 -> 1.145 /
// 1.151 ms at 1M, 0.634 -> 0.572 / 0.577 at 512K (same call, two runs each; 88% / 90% of cuDNN
// SDPA).
// The loop's SASS (twentieth session, cuobjdump, d = 128, G = 4): 968 instructions per tile:
// RoPE's sine and cosine 256 (FMUL, FRND, 2 FFMA, FMUL, 2 MUFU per token and frequency; every kv
// head's block computes them again), the rotation 128, the hi/lo split 192, unpacking K 64, mma
// 40. Being issue-bound, it slows down with the SM clock, which an H200 SXM lowers to ~1.5 GHz
// at its 700 W cap under sustained load, where cuDNN's memory-bound SDPA does not
// (bench_kernels_cuda --sustain=3 against torch_peers.py --sustain=3). Tried and reverted: the
// scores' mma in f16 (rotated K as one f16 part, Q as f16 hi + lo; 786 instructions per tile):
// dense decode 3.5-5% faster and one-GPU errors unchanged, but at TP = 2 it widened the
// differences from one GPU for the sparse policies past the TP test's logit bound. Kept (same
// bits): the rescale of O skipped when no head's maximum grew, the mask applied to the last
// tile only, RoPE's frequencies in registers (206-216 registers, still two blocks per SM):
// 1M 1.095-1.106 against 1.118-1.122 ms, after 3 s of load 1.131 against 1.157 ms (same call,
// a host capped at ~1.46 GHz).
//
// Measured on H200, Llama-3-8B shape, paged slots (bench/kernels_cuda_bench.cu, each figure in
// the same run as cuDNN SDPA on contiguous K/V; two runs of this kernel): 1M tokens 1.18 / 1.26 ms
// (3.64 / 3.40 TB/s of K + V, 78% / 75% of SDPA's speed), 512K 0.590 / 0.622 ms (80% / 77%),
// 128K 0.152 / 0.161 ms (84% / 82%); 2688 random slots 16.1 / 16.4 us. The register-pipelined
// predecessor: 1.27 ms at 1M, 0.174 ms at 128K. Variants that were not faster: 8-warp blocks
// over all kv heads of a token range (whole 2 KiB rows per block, one block per SM): 1.27 and
// 1.35 ms; Q's fragments in registers: 1.31 ms; 66 or 132 splits: 1.31-1.32 ms (vs 1.26 in
// that run); contiguous instead of paged slots: the same. prefetch.global.L2 of 2 or 4 tiles
// beyond the stages was clearly slower (1.41 / 1.80 ms). Everything lands at ~3.4-3.6 TB/s
// against 4.5 TB/s for a pure streaming read; the cap is not the paging and not the bytes in
// flight (more made it worse).
//
// FP8 cache (kFp8): the stages hold the tile's raw e4m3 rows ([16][D] bytes of K and of V, one
// 16 B cp.async per lane and row piece: half the bytes of bf16) and there are kStages + 1 of
// them (the same bytes in flight in fewer copies); once a tile lands, the warp converts it
// (e4m3 -> half -> bf16, exact; 8 elements per lane and store, conflict-free) into one bf16
// stage of the layout above, and everything after that is the bf16 code. The kv head's scales
// (powers of two) stay out of the loop: Q's fragments are built times K's scale, and O is
// multiplied by V's when the warps' states are stored. Rounding commutes with power-of-two
// scaling, so every score, probability and output is exactly the bf16 kernel's over the
// dequantized cache: bit for bit its result. Shared memory: 4 x (4 x 4160 + 8256) B of stages
// at d = 128, ~98 KiB per block (two blocks per SM still).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/decode_attention_internal.h"
#include "kernels/cuda/kernel_attributes.h"
#include "kernels/cuda/kv_cache_load.cuh"
#include "kernels/cuda/pdl.cuh"

namespace tokenselect::kernels::cuda::internal {
namespace {

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// x = hi + lo with both parts bf16-representable (to ~2^-16 relative); packs pairs. The hi
// halves are read back by bit operations (no byte permutes).
__device__ __forceinline__ void SplitPack(float x0, float x1, uint32_t* hi, uint32_t* lo) {
  const uint32_t h = PackBf16(x0, x1);
  *hi = h;
  *lo = PackBf16(x0 - __uint_as_float(h << 16), x1 - __uint_as_float(h & 0xffff0000u));
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

// Four 8x8 bf16 matrices; lane l gives the row address of matrix l / 8, row l % 8.
__device__ __forceinline__ void LdMatrixX4(uint32_t addr, uint32_t* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t addr, uint32_t* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ float Lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float Hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

constexpr int kTile = 16;    // tokens per warp tile
constexpr int kStages = 3;   // tiles per warp: kStages - 1 in flight while one is computed

// One warp's stage: K and V rows [kTile][D] bf16, then the tile's kTile positions. Row r's
// 16-byte chunk c is stored at chunk c ^ (r & 7) (SwizzledChunk): the 8 rows of an ldmatrix
// 8x8 matrix then hit 8 different bank groups, and each 128-byte piece of a cache row lands in
// one 128-byte-aligned piece of shared memory (see the header: with padded rows the copies'
// L2 sectors were requested 1.5 times).
template <int D>
struct StageLayout {
  static constexpr int kRowsBytes = kTile * D * 2;
  static constexpr int kBytes = 2 * kRowsBytes + kTile * 4;
};
__device__ __forceinline__ int SwizzledChunk(int r, int c) { return c ^ (r & 7); }

// FP8: one warp's raw stage: K and V rows [kTile][D] e4m3, then the positions.
template <int D>
struct Fp8StageLayout {
  static constexpr int kRowsBytes = kTile * D;
  static constexpr int kBytes = 2 * kRowsBytes + kTile * 4;
};
template <bool kFp8>
__host__ __device__ constexpr int StagesOf() { return kFp8 ? kStages + 1 : kStages; }

// One warp's share of the front: its stages (FP8: raw stages, then one bf16 stage).
template <int D, bool kFp8>
__host__ __device__ constexpr size_t WarpStageBytes() {
  return kFp8 ? static_cast<size_t>(StagesOf<true>()) * Fp8StageLayout<D>::kBytes +
                    StageLayout<D>::kBytes
              : static_cast<size_t>(kStages) * StageLayout<D>::kBytes;
}

// Stages (after the loop: the warps' states), then Q's fragments [D / 16][32] and inv_freq.
template <int D, int G, bool kFp8>
__host__ __device__ constexpr size_t MmaFrontBytes() {
  constexpr size_t stages = static_cast<size_t>(kDecodeWarps) * WarpStageBytes<D, kFp8>();
  constexpr size_t reduce =
      sizeof(float) * kDecodeWarps * G * D + sizeof(float2) * kDecodeWarps * G;
  return stages > reduce ? stages : reduce;
}
template <int D, int G, bool kFp8>
__host__ __device__ constexpr size_t MmaSharedBytes() {
  return MmaFrontBytes<D, G, kFp8>() + sizeof(uint4) * (D / 16) * 32 + sizeof(float) * D / 2;
}

template <int D, int G, bool kFp8>
__global__ void __launch_bounds__(kDecodeWarps * 32, 2)
    DecodeSplitMmaKernel(DecodeAttentionParams p, DecodeWorkspace ws) {
  constexpr int KS = D / 16;     // k-steps of S^T
  constexpr int KH = KS / 2;     // k-step of the rotate_half partner
  constexpr int kHalf = D / 2;
  constexpr int CPR = D / 8;     // 16 B chunks per row
  using Stage = StageLayout<D>;
  using RawStage = Fp8StageLayout<D>;
  constexpr int NS = StagesOf<kFp8>();
  constexpr int CPR8 = D / 16;    // FP8: 16 B chunks per row
  // Per warp: where stage st starts, and its rows' and positions' offsets.
  constexpr int kStageBytes = kFp8 ? RawStage::kBytes : Stage::kBytes;
  constexpr int kRowsBytes = kFp8 ? RawStage::kRowsBytes : Stage::kRowsBytes;
  extern __shared__ __align__(16) unsigned char sm_dyn[];
  uint4* sm_q = reinterpret_cast<uint4*>(sm_dyn + MmaFrontBytes<D, G, kFp8>());  // [KS][32]
  float* sm_freq = reinterpret_cast<float*>(sm_q + KS * 32);             // [D / 2]

  const int kv = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;

  // RoPE's inverse frequencies are model constants (no kernel of a step writes them): loaded
  // before the wait for the kernel ahead (a programmatic dependent launch, pdl.cuh).
  for (int i = threadIdx.x; i < kHalf; i += blockDim.x) sm_freq[i] = __ldg(p.inv_freq + i);
  PdlWait();
  PdlAllowDependents();  // one wave: every block has started, the merge may launch and wait
  __syncthreads();

  // Q fragments of head g (zero rows for g >= G), rotated, scaled by scale * log2(e), split
  // into bf16 hi/lo: {hi a0, hi a2, lo a0, lo a2} per k-step and lane. a0 holds dims
  // 16 kk + 2t + {0, 1}, a2 dims 16 kk + 8 + 2t + {0, 1}; k-step kk + KH holds the partners.
  // Warp 0 writes them; every warp reads the same (in shared memory, not registers: measured
  // faster).
  if (warp == 0) {
    float x[KS][4];
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) x[kk][0] = x[kk][1] = x[kk][2] = x[kk][3] = 0.0f;
    if (g < G) {
      const __nv_bfloat16* qrow = p.q + (static_cast<int64_t>(b) * p.num_heads + kv * G + g) * D;
      const float q_pos = static_cast<float>(p.q_positions[b]);
      // FP8: times K's scale (exact), which the converted K tiles leave out.
      const float qscale = p.scale * kLog2e * (kFp8 ? __ldg(p.k_scale + kv) : 1.0f);
#pragma unroll
      for (int kk = 0; kk < KH; ++kk) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int dim = 16 * kk + 2 * t + (j & 1) + 8 * (j >> 1);
          const float a = __bfloat162float(qrow[dim]);
          const float c = __bfloat162float(qrow[dim + kHalf]);
          float sn, cs;
          RopeSinCos(q_pos * sm_freq[dim], &sn, &cs);
          x[kk][j] = (a * cs - c * sn) * qscale;
          x[kk + KH][j] = (c * cs + a * sn) * qscale;
        }
      }
    }
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      uint4 f;  // {a0, a1, a2, a3}: hi of row g, lo as row g + 8
      SplitPack(x[kk][0], x[kk][1], &f.x, &f.y);
      SplitPack(x[kk][2], x[kk][3], &f.z, &f.w);
      sm_q[kk * 32 + lane] = f;
    }
  }
  __syncthreads();

  // O^T accumulators: mma c covers dims 16 c + g (c[0], c[1]) and 16 c + 8 + g (c[2], c[3]) of
  // heads 2t, 2t+1.
  float o[KS][4];
#pragma unroll
  for (int c = 0; c < KS; ++c) o[c][0] = o[c][1] = o[c][2] = o[c][3] = 0.0f;
  float m = -INFINITY, l = 0.0f;

  const int64_t list_begin = p.indptr[b];
  const int64_t len = p.indptr[b + 1] - list_begin;
  const int64_t per_split = (len + p.num_splits - 1) / p.num_splits;
  const int64_t begin = list_begin + min(len, blockIdx.x * per_split);
  const int64_t end = list_begin + min(len, (blockIdx.x + 1) * per_split);
  constexpr int64_t kWarpStride = kDecodeWarps * kTile;

  const uint32_t my_stages = static_cast<uint32_t>(__cvta_generic_to_shared(sm_dyn)) +
                             warp * static_cast<uint32_t>(WarpStageBytes<D, kFp8>());
  // FP8: the warp's bf16 stage, after its raw stages (the generic pointer for the converting
  // stores, the shared address for ldmatrix).
  unsigned char* my_bf16 = sm_dyn + warp * WarpStageBytes<D, kFp8>() + NS * RawStage::kBytes;
  const uint32_t my_bf16_addr = my_stages + NS * RawStage::kBytes;

  // ldmatrix row addresses of this lane within a stage's K (or V) rows: matrix l / 8 is
  // (tokens 8 (l / 16) .., dims 8 ((l / 8) % 2) ..), row l % 8. The matrices of 16-dim step j
  // (chunks 2j and 2j + 1) start at ld_off[j % 4] + 128 (j / 4): the swizzle only flips the
  // chunk index's low 3 bits.
  uint32_t ld_off[4];
  {
    const int row = 8 * (lane >> 4) + (lane & 7);
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      ld_off[m] =
          static_cast<uint32_t>(row * D * 2 + 16 * SwizzledChunk(row, 2 * m + ((lane >> 3) & 1)));
    }
  }

  // RoPE's frequencies of this lane's dims (16 kk + 2t + {0, 1, 8, 9}), in registers for the
  // whole loop.
  float freq[KH][4];
#pragma unroll
  for (int kk = 0; kk < KH; ++kk) {
    const float2 f01 = *reinterpret_cast<const float2*>(sm_freq + 16 * kk + 2 * t);
    const float2 f89 = *reinterpret_cast<const float2*>(sm_freq + 16 * kk + 8 + 2 * t);
    freq[kk][0] = f01.x;
    freq[kk][1] = f01.y;
    freq[kk][2] = f89.x;
    freq[kk][3] = f89.y;
  }

  // Ids of the next tile to copy: lanes 0-15 its slots, lanes 16-31 its positions (clamped into
  // the range; masked tokens get zero weight).
  int64_t copy_jb = begin + warp * kTile;
  auto fetch_ids = [&]() {
    const int64_t j = min(copy_jb + (lane & 15), end - 1);
    return lane < 16 ? __ldg(p.indices + j) : __ldg(p.kv_positions + j);
  };
  int32_t ids = copy_jb < end ? fetch_ids() : 0;
  // Copies tile copy_jb into stage st (nothing past the range; a group is committed anyway so
  // that the counting stays uniform), then fetches the ids of the warp's next tile.
  // This lane's 16 bytes of a cache row: the row's start plus lane_k / lane_v; a row's address
  // is one 32 x 32 -> 64-bit multiply-add (slots are non-negative int32, rows < 4 GiB).
  constexpr int kElemBytes = kFp8 ? 1 : 2;
  constexpr int kCpr = kFp8 ? CPR8 : CPR;  // 16 B chunks per row
  const uint32_t row_bytes = static_cast<uint32_t>(p.num_kv_heads * D * kElemBytes);
  const int lane_off = (kv * D) * kElemBytes + (lane % kCpr) * 16;
  const unsigned char* lane_k = static_cast<const unsigned char*>(p.k_cache) + lane_off;
  const unsigned char* lane_v = static_cast<const unsigned char*>(p.v_cache) + lane_off;
  auto issue = [&](int st) {
    if (copy_jb < end) {
      const uint32_t stage = my_stages + st * kStageBytes;
      constexpr int kRowsPerCopy = 32 / kCpr;
#pragma unroll
      for (int i = 0; i < kTile / kRowsPerCopy; ++i) {
        const int r = i * kRowsPerCopy + lane / kCpr;
        const uint64_t off = static_cast<uint64_t>(static_cast<uint32_t>(
                                 __shfl_sync(0xffffffffu, ids, r))) * row_bytes;
        const uint32_t dst = kFp8 ? stage + r * D + (lane % kCpr) * 16
                                  : stage + (r * D + SwizzledChunk(r, lane % kCpr) * 8) * 2;
        CpAsyncCg16(dst, lane_k + off);
        CpAsyncCg16(dst + kRowsBytes, lane_v + off);
      }
      if (lane >= 16) {
        const uint32_t dst = stage + 2 * kRowsBytes + (lane - 16) * 4;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(dst), "r"(ids) : "memory");
      }
    }
    CpAsyncCommit();
    copy_jb += kWarpStride;
    if (copy_jb < end) ids = fetch_ids();
  };

#pragma unroll
  for (int st = 0; st < NS - 1; ++st) issue(st);
  int stage_idx = 0;
  for (int64_t jb = begin + warp * kTile; jb < end; jb += kWarpStride) {
    __syncwarp();  // every lane is done reading the stage refilled next (FP8: and the bf16 one)
    issue(stage_idx == 0 ? NS - 1 : stage_idx - 1);
    CpAsyncWait<NS - 1>();
    __syncwarp();  // the other lanes' copies of this tile are visible
    const uint32_t stage = my_stages + stage_idx * kStageBytes;
    uint32_t rows = stage;  // the tile's bf16 K rows (V rows follow)
    if constexpr (kFp8) {
      // Convert the raw rows into the bf16 stage: per lane 8 e4m3 in (8 B), 8 bf16 out (16 B),
      // consecutive lanes at consecutive addresses (conflict-free).
      const unsigned char* raw = sm_dyn + warp * WarpStageBytes<D, kFp8>() + (stage - my_stages);
      constexpr int kChunks8B = D / 8;  // 8-element chunks per row
#pragma unroll
      for (int kvi = 0; kvi < 2; ++kvi) {
#pragma unroll
        for (int i = 0; i < kTile * kChunks8B / 32; ++i) {
          const int c = i * 32 + lane, r = c / kChunks8B, cc = c % kChunks8B;
          const uint2 in =
              *reinterpret_cast<const uint2*>(raw + kvi * RawStage::kRowsBytes + r * D + cc * 8);
          *reinterpret_cast<uint4*>(my_bf16 + kvi * Stage::kRowsBytes +
                                    (r * D + SwizzledChunk(r, cc) * 8) * 2) =
              kv_internal::Fp8x8ToBf16x8Unscaled(in);
        }
      }
      __syncwarp();  // the bf16 stage is complete
      rows = my_bf16_addr;
    }
    // This lane's matrix address of 16-dim step j in the K rows (V rows: + kRowsBytes).
    auto at = [&](int j) { return rows + ld_off[j % 4] + 128 * (j / 4); };
    stage_idx = stage_idx + 1 == NS ? 0 : stage_idx + 1;
    float kpos[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      int32_t pos;
      asm volatile("ld.shared.b32 %0, [%1];\n"
                   : "=r"(pos)
                   : "r"(stage + 2 * kRowsBytes + (8 * hf + g) * 4));
      kpos[hf] = static_cast<float>(pos);
    }

    // S^T: acc[hf][e] = score of head g, token jb + 8 hf + 2t + e.
    float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int kk = 0; kk < KH; ++kk) {
      // r[0], r[1]: token g's b0, b1; r[2], r[3]: token 8 + g's. lo: k-step kk, hi: kk + KH.
      uint32_t lo[4], hi[4];
      LdMatrixX4(at(kk), lo);
      LdMatrixX4(at(kk + KH), hi);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float x[4], y[4];  // dims 16 kk + 2t + {0, 1, 8, 9} and their partners
        x[0] = Lo(lo[2 * hf]);
        x[1] = Hi(lo[2 * hf]);
        x[2] = Lo(lo[2 * hf + 1]);
        x[3] = Hi(lo[2 * hf + 1]);
        y[0] = Lo(hi[2 * hf]);
        y[1] = Hi(hi[2 * hf]);
        y[2] = Lo(hi[2 * hf + 1]);
        y[3] = Hi(hi[2 * hf + 1]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float sn, cs;
          RopeSinCos(kpos[hf] * freq[kk][j], &sn, &cs);
          const float a = x[j], c = y[j];
          x[j] = a * cs - c * sn;
          y[j] = c * cs + a * sn;
        }
        uint32_t xh0, xl0, xh1, xl1, yh0, yl0, yh1, yl1;
        SplitPack(x[0], x[1], &xh0, &xl0);
        SplitPack(x[2], x[3], &xh1, &xl1);
        SplitPack(y[0], y[1], &yh0, &yl0);
        SplitPack(y[2], y[3], &yh1, &yl1);
        const uint4 qa = sm_q[kk * 32 + lane];
        const uint4 qb = sm_q[(kk + KH) * 32 + lane];
        Mma(acc[hf], qa.x, qa.y, qa.z, qa.w, xh0, xh1);
        Mma(acc[hf], qa.x, qa.y, qa.z, qa.w, xl0, xl1);
        Mma(acc[hf], qb.x, qb.y, qb.z, qb.w, yh0, yh1);
        Mma(acc[hf], qb.x, qb.y, qb.z, qb.w, yl0, yl1);
      }
    }
    float s[2][2];
    const bool whole = jb + kTile <= end;  // the same in the whole warp: only the last tile masks
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        s[hf][e] = acc[hf][e] + acc[hf][2 + e];
        if (!whole && jb + 8 * hf + 2 * t + e >= end) s[hf][e] = -INFINITY;
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
    // A head whose maximum did not grow has alpha = 2^0 = 1 exactly; when that holds for every
    // head of the warp (most tiles once the maxima settle) the rescale is skipped, which leaves
    // the same bits as multiplying by 1.
    if (__any_sync(0xffffffffu, alpha != 1.0f)) {
      const float alpha0 = __shfl_sync(0xffffffffu, alpha, 8 * t);
      const float alpha1 = __shfl_sync(0xffffffffu, alpha, 8 * t + 4);
#pragma unroll
      for (int c = 0; c < KS; ++c) {
        o[c][0] *= alpha0;
        o[c][1] *= alpha1;
        o[c][2] *= alpha0;
        o[c][3] *= alpha1;
      }
    }

    // O^T += V^T . P^T, one mma per 16 output dims. ldmatrix.trans matrices (tokens 0-7,
    // dims lo), (0-7, hi), (8-15, lo), (8-15, hi) are the A fragment's a0..a3 (rows g / g + 8 =
    // dims 16 c + g / 16 c + 8 + g, columns = tokens).
#pragma unroll
    for (int c = 0; c < KS; ++c) {
      uint32_t a[4];
      LdMatrixX4Trans(at(c) + Stage::kRowsBytes, a);
      Mma(o[c], a[0], a[1], a[2], a[3], pb0, pb1);
    }
  }
  CpAsyncWait<0>();

  // Row sums over the 4 threads of head g; then the warps' states meet in shared memory (over
  // the stages: every warp has finished with them after the barrier).
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  __syncthreads();
  auto sm_acc = reinterpret_cast<float(*)[G][D]>(sm_dyn);
  const float v_scale = kFp8 ? __ldg(p.v_scale + kv) : 1.0f;  // FP8: left out of the V tiles
  auto sm_ml = reinterpret_cast<float2(*)[G]>(sm_dyn + sizeof(float) * kDecodeWarps * G * D);
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int head = 2 * t + e;
    if (head < G) {
#pragma unroll
      for (int c = 0; c < KS; ++c) {
        sm_acc[warp][head][16 * c + g] = o[c][e] * v_scale;
        sm_acc[warp][head][16 * c + 8 + g] = o[c][2 + e] * v_scale;
      }
    }
  }
  if (g < G && t == 0) sm_ml[warp][g] = make_float2(m, l);
  __syncthreads();
  WriteSplitResult<D, G, kDecodeWarps>(p, ws, sm_acc, sm_ml);
}

}  // namespace

// The kernel's shared-memory opt-in on the current device, once (kernel_attributes.h).
template <int D, int G, bool kFp8>
cudaError_t ConfigureDecodeSplitMma() {
  static std::atomic<uint64_t> done{0};
  return OptInSharedMemoryOnce(DecodeSplitMmaKernel<D, G, kFp8>, MmaSharedBytes<D, G, kFp8>(),
                               &done);
}

template <int D, bool kFp8>
cudaError_t ConfigureDecodeDim() {
  for (cudaError_t e : {ConfigureDecodeSplitMma<D, 1, kFp8>(),
                        ConfigureDecodeSplitMma<D, 2, kFp8>(),
                        ConfigureDecodeSplitMma<D, 4, kFp8>(),
                        ConfigureDecodeSplitMma<D, 8, kFp8>()}) {
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t ConfigureDecodeMmaKernels() {
  for (cudaError_t e : {ConfigureDecodeDim<64, false>(), ConfigureDecodeDim<128, false>(),
                        ConfigureDecodeDim<64, true>(), ConfigureDecodeDim<128, true>()}) {
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <int D, int G, bool kFp8>
cudaError_t LaunchDecodeSplitMma(const DecodeAttentionParams& p, const DecodeWorkspace& ws,
                                 cudaStream_t stream) {
  constexpr size_t smem = MmaSharedBytes<D, G, kFp8>();
  TS_CUDA_RETURN_IF_ERROR((ConfigureDecodeSplitMma<D, G, kFp8>()));
  const dim3 grid(p.num_splits, static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>(p.batch));
  return LaunchPdl(DecodeSplitMmaKernel<D, G, kFp8>, grid, dim3(kDecodeWarps * 32), smem, stream,
                   false, p, ws);
}

#define TS_INSTANTIATE_DECODE_MMA(D, G)                                                    \
  template cudaError_t LaunchDecodeSplitMma<D, G, false>(const DecodeAttentionParams&,     \
                                                         const DecodeWorkspace&, cudaStream_t); \
  template cudaError_t LaunchDecodeSplitMma<D, G, true>(const DecodeAttentionParams&,      \
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
