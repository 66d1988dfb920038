// The tensor-core chunked-prefill kernel (prefill_attention.cu's design note), shared by the two
// files that instantiate it: prefill_attention.cu (bf16 cache) and prefill_attention_fp8.cu
// (FP8 cache; its own file because that instantiation spills 8 bytes at the 255-register limit,
// which the spill guard of the rest of ts_kernels_cuda refuses; see kernels/CMakeLists.txt).
// Included by those .cu files only.
#ifndef TOKENSELECT_KERNELS_CUDA_PREFILL_ATTENTION_KERNEL_CUH_
#define TOKENSELECT_KERNELS_CUDA_PREFILL_ATTENTION_KERNEL_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/decode_attention_internal.h"
#include "kernels/cuda/kernel_attributes.h"
#include "kernels/cuda/kv_cache_load.cuh"
#include "kernels/cuda/prefill_attention.h"

namespace tokenselect::kernels::cuda::prefill_internal {

using internal::FastExp2;
using internal::kLog2e;
using internal::RopeSinCos;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBM = 128;  // (query, head) rows per block: 4 warps x 32 rows
constexpr int kBN = 64;  // list entries per key tile
constexpr int kMinSplitTiles = 4;
constexpr int kMaxSplits = 1024;

// ---- PTX helpers. ----

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// These copies, unlike cp_async.cuh's CpAsyncCg16, carry no "memory" clobber: with it the
// sm_90 code of prefill_attention.cu changes (not measured). Commit and wait: cp_async.cuh.
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(SmemAddr(smem)), "l"(gmem));
}

__device__ __forceinline__ void CpAsync16(uint32_t smem_addr, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr), "l"(gmem));
}

__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(SmemAddr(smem)), "l"(gmem));
}

// addr: a shared-space byte address.
__device__ __forceinline__ void LdMatrixX4(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a . b for one m16n8k16 tile.
__device__ __forceinline__ void Mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint4 Pack8(const float* x) {
  uint4 r;
  r.x = PackBf16(x[0], x[1]);
  r.y = PackBf16(x[2], x[3]);
  r.z = PackBf16(x[4], x[5]);
  r.w = PackBf16(x[6], x[7]);
  return r;
}

// Rotates 8 rotate_half pairs (x[e], y[e]) at `pos` with the thread's 8 frequencies, times `mul`.
__device__ __forceinline__ void Rotate8(float* x, float* y, float pos, const float* freq,
                                        float mul) {
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    float sn, cs;
    RopeSinCos(pos * freq[e], &sn, &cs);
    const float a = x[e], c = y[e];
    x[e] = (a * cs - c * sn) * mul;
    y[e] = (c * cs + a * sn) * mul;
  }
}

// Element offset of 16 B chunk `chunk` of row `row` in a swizzled [rows][D] bf16 tile.
template <int D>
__device__ __forceinline__ int Swz(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// Where the kernel's K and V tiles come from.
enum class KvSource {
  kBf16Cache,  // the bf16 cache by slot, keys rotated per tile
  kFp8Cache,   // the e4m3 cache by slot, dequantized and rotated per tile
  kGathered,   // GatherListKernel's rotated bf16 copy of the list (no work per tile)
};

template <int D, bool kFp8>
constexpr size_t PrefillSmemBytes() {
  // + 256: the tiles start at a 256-byte boundary (see the ldmatrix addressing). FP8: one bf16
  // K and V tile, then two raw e4m3 K and V tiles.
  return kFp8 ? static_cast<size_t>(kBM * D + 2 * kBN * D) * 2 + 4 * kBN * D +
                    2 * kBN * sizeof(int32_t) + 256
              : static_cast<size_t>(kBM * D + 4 * kBN * D) * 2 + 2 * kBN * sizeof(int32_t) + 256;
}

struct SplitWorkspace {
  float* partial_out;  // [total_q * num_heads][num_splits][head_dim]
  float* partial_lse;  // [total_q * num_heads][num_splits], log2 domain
  // KvSource::kGathered: the list's rotated keys and values, [num_kv_heads][capacity + kBN]
  // [head_dim] bf16; list entry j of request b at row kv_indptr[b] + j, then kBN zero rows.
  __nv_bfloat16* gathered_k;
  __nv_bfloat16* gathered_v;
  int64_t capacity;
};

template <int D, int G, KvSource kSrc>
__global__ void __launch_bounds__(kThreads, 2)
    PrefillKernel(PrefillAttentionParams p, SplitWorkspace ws) {
  constexpr bool kFp8 = kSrc == KvSource::kFp8Cache;
  constexpr bool kGathered = kSrc == KvSource::kGathered;
  constexpr int kChunks = D / 8;           // 16 B chunks per row
  constexpr int kHalfChunks = D / 16;      // chunks per rotate_half half
  constexpr int kQPerTile = kBM / G;       // queries per block
  constexpr int kKeyStep = kThreads / kChunks;       // copy pass: keys per thread step
  constexpr int kCopyItems = kBN / kKeyStep;          // copy pass: keys per thread
  constexpr int kRotStep = kThreads / kHalfChunks;    // rotate pass: rows per thread step
  constexpr int kRotItems = kBN / kRotStep;           // rotate pass: keys per thread
  constexpr int kQItems = kBM / kRotStep;             // Q pass: rows per thread
  constexpr int kKSteps = D / 16;
  constexpr int kNTiles = kBN / 8;   // S n-tiles
  constexpr int kDTiles = D / 8;     // O n-tiles
  constexpr int kMT = kBM / (16 * kWarps);  // m16 tiles per warp
  static_assert(kThreads % kChunks == 0 && kBN % kKeyStep == 0, "copy mapping");
  static_assert(kBN % kRotStep == 0 && kBM % kRotStep == 0, "rotate mapping");
  static_assert(kBM == kThreads, "one row statistic per thread");
  constexpr int kTileBufs = kFp8 ? 1 : 2;          // bf16 K/V tiles (FP8: raw tiles double)
  constexpr int kChunks8 = D / 16;                 // FP8 copy: 16 B chunks per raw row
  constexpr int kKeyStep8 = kThreads / kChunks8;
  constexpr int kCopyItems8 = kBN / kKeyStep8;
  constexpr int kVItems = kBN * kChunks / kThreads;  // FP8 V pass: bf16 chunks per thread
  static_assert(kBN % kKeyStep8 == 0 && (kBN * kChunks) % kThreads == 0, "FP8 mapping");

  // Tiles start at a 256-byte boundary, so that the swizzled chunk bits of an ldmatrix address
  // can be flipped with an XOR: chunk 2 kk + b of row r sits at byte r * 2D + ((2 kk + b) ^
  // (r & 7)) * 16 = (r * 2D + (b ^ (r & 7)) * 16) ^ (kk * 32), and r & 7 = lane & 7 in every
  // ldmatrix below; one base address per operand, one XOR per k-step.
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t raw_addr = SmemAddr(smem_raw);
  const uint32_t smem_addr = (raw_addr + 255u) & ~255u;
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem_raw + (smem_addr - raw_addr));
  __nv_bfloat16* sK = sQ + kBM * D;               // [kTileBufs][kBN * D]
  __nv_bfloat16* sV = sK + kTileBufs * kBN * D;   // [kTileBufs][kBN * D]
  uint8_t* rK = reinterpret_cast<uint8_t*>(sV + kTileBufs * kBN * D);  // FP8: [2][kBN * D]
  uint8_t* rV = rK + (kFp8 ? 2 * kBN * D : 0);                          // FP8: [2][kBN * D]
  int32_t* sPos = reinterpret_cast<int32_t*>(rV + (kFp8 ? 2 * kBN * D : 0));  // [2][kBN]
  __shared__ int sVis[kBM];
  __shared__ int sVisMax[kWarps], sVisMin[kWarps];
  __shared__ int32_t sSlot[3][kBN];  // slots of tiles t, t + 1, t + 2 (ring)
  __shared__ float sFreq[D / 2];
  __shared__ float sScale[2];  // FP8: the kv head's K and V scales

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int num_kv = static_cast<int>(p.num_kv_heads);
  const int kv = blockIdx.y % num_kv, split = blockIdx.y / num_kv, b = blockIdx.z;
  const int q_end = p.q_indptr[b + 1];
  const int q0 = p.q_indptr[b] + static_cast<int>(blockIdx.x) * kQPerTile;
  if (q0 >= q_end) return;  // block-uniform
  const int64_t list_begin = p.kv_indptr[b];
  const int len = static_cast<int>(p.kv_indptr[b + 1] - list_begin);

  // Per-row prefix limits (row = thread) and their block max / min.
  {
    const int i = q0 + tid / G;
    const int v = i < q_end ? min(max(__ldg(p.visible + i), 0), len) : 0;
    sVis[tid] = v;
    const int mx = __reduce_max_sync(0xffffffffu, v);
    const int mn = __reduce_min_sync(0xffffffffu, v);
    if (lane == 0) {
      sVisMax[warp] = mx;
      sVisMin[warp] = mn;
    }
  }

  // This split's range of the list, cut at the largest visible prefix.
  const int per_split = ((len + p.num_splits - 1) / p.num_splits + kBN - 1) / kBN * kBN;
  const int sb = min(len, split * per_split);
  const int se = min(len, sb + per_split);
  const int64_t row_elems = p.num_kv_heads * D;  // elements per cache slot
  const int hc = tid % kHalfChunks;               // the thread's rotate_half chunk
  for (int f = tid; f < D / 2; f += kThreads) sFreq[f] = __ldg(p.inv_freq + f);
  if (kFp8 && tid < 2) sScale[tid] = __ldg((tid == 0 ? p.k_scale : p.v_scale) + kv);
  const float* freq = sFreq + hc * 8;  // shared memory: the registers hold O and S
  __syncthreads();
  int vis_max = sVisMax[0], vis_min = sVisMin[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) {
    vis_max = max(vis_max, sVisMax[w]);
    vis_min = min(vis_min, sVisMin[w]);
  }
  const int ke = min(se, vis_max);
  const int num_tiles = ke > sb ? (ke - sb + kBN - 1) / kBN : 0;
  const int mask_from = min(vis_min, se);  // tiles ending past this need the mask

  // ---- K/V tile copies (cp.async). Tile t's group also brings the slots of tile t + 2 into
  // the shared ring sSlot (tile t + 1's copies are issued before tile t is waited for). ----
  auto issue_tile = [&](int tile) {
    const int buf = tile & 1;
    const int j0 = sb + tile * kBN;
    const int c = tid % kChunks;
    const int32_t* slots = sSlot[tile % 3];
    if constexpr (kGathered) {
      // Consecutive rows, not clamped at ke (one base pointer, immediate offsets): rows past ke
      // are masked, and they exist and are finite (the next request's rows, or the zeroed pad
      // after the last list).
      const int64_t off =
          (kv * (ws.capacity + kBN) + list_begin + j0 + tid / kChunks) * D + c * 8;
      const __nv_bfloat16* gk = ws.gathered_k + off;
      const __nv_bfloat16* gv = ws.gathered_v + off;
      // kKeyStep is a multiple of 8, so a thread's rows share their swizzle: one shared address.
      static_assert(kKeyStep % 8 == 0, "gathered copy: rows of one swizzle phase");
      const uint32_t dst = SmemAddr(sK + buf * kBN * D + Swz<D>(tid / kChunks, c));
      constexpr uint32_t kVBytes = kTileBufs * kBN * D * 2;  // sV - sK
#pragma unroll
      for (int u = 0; u < kCopyItems; ++u) {
        CpAsync16(dst + u * kKeyStep * D * 2, gk + u * kKeyStep * D);
        CpAsync16(dst + kVBytes + u * kKeyStep * D * 2, gv + u * kKeyStep * D);
      }
      return;
    } else if constexpr (kFp8) {
      // 32-bit shared addresses: the kernel is at the register limit, and generic pointers of
      // the raw tiles made it spill.
      const int c8 = tid % kChunks8;
      const uint8_t* k_cache = static_cast<const uint8_t*>(p.k_cache);
      const uint8_t* v_cache = static_cast<const uint8_t*>(p.v_cache);
      const uint32_t dst = SmemAddr(rK) + buf * kBN * D + (tid / kChunks8) * D + c8 * 16;
#pragma unroll
      for (int u = 0; u < kCopyItems8; ++u) {
        const int key = tid / kChunks8 + u * kKeyStep8;
        const int64_t off = static_cast<int64_t>(slots[key]) * row_elems + kv * D + c8 * 16;
        CpAsync16(dst + u * kKeyStep8 * D, k_cache + off);
        CpAsync16(dst + 2 * kBN * D + u * kKeyStep8 * D, v_cache + off);
      }
    } else {
      const __nv_bfloat16* k_cache = static_cast<const __nv_bfloat16*>(p.k_cache);
      const __nv_bfloat16* v_cache = static_cast<const __nv_bfloat16*>(p.v_cache);
#pragma unroll
      for (int u = 0; u < kCopyItems; ++u) {
        const int key = tid / kChunks + u * kKeyStep;
        const int64_t off = static_cast<int64_t>(slots[key]) * row_elems + kv * D + c * 8;
        CpAsync16(sK + buf * kBN * D + Swz<D>(key, c), k_cache + off);
        CpAsync16(sV + buf * kBN * D + Swz<D>(key, c), v_cache + off);
      }
    }
    if (tid < kBN) {
      CpAsync4(sPos + buf * kBN + tid, p.kv_positions + list_begin + min(j0 + tid, ke - 1));
      if (tile + 2 < num_tiles) {
        CpAsync4(&sSlot[(tile + 2) % 3][tid],
                 p.kv_indices + list_begin + min(j0 + 2 * kBN + tid, ke - 1));
      }
    }
  };
  if (num_tiles > 0) {
    if (!kGathered && tid < kBN) {
      sSlot[0][tid] = __ldg(p.kv_indices + list_begin + min(sb + tid, ke - 1));
      sSlot[1][tid] = __ldg(p.kv_indices + list_begin + min(sb + kBN + tid, ke - 1));
    }
    __syncthreads();
    issue_tile(0);
  }
  CpAsyncCommit();

  // ---- Q: rotate, pre-scale, round to bf16 in shared memory (A fragments are re-read from
  // there at every k-step: the registers hold O and S for 32 rows per warp). ----
  {
    const float qmul = p.scale * kLog2e;
    const bool vec = (p.q_row_stride % 8 == 0) && (reinterpret_cast<uintptr_t>(p.q) % 16 == 0);
#pragma unroll
    for (int u = 0; u < kQItems; ++u) {
      const int r = tid / kHalfChunks + u * kRotStep;
      const int i = q0 + r / G;
      float x[8], y[8];
      if (i < q_end) {
        const __nv_bfloat16* src =
            p.q + static_cast<int64_t>(i) * p.q_row_stride + (kv * G + r % G) * D + hc * 8;
        if (vec) {
          kv_internal::Bf16x8ToFloat(*reinterpret_cast<const uint4*>(src), x);
          kv_internal::Bf16x8ToFloat(*reinterpret_cast<const uint4*>(src + D / 2), y);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            x[e] = __bfloat162float(src[e]);
            y[e] = __bfloat162float(src[D / 2 + e]);
          }
        }
        Rotate8(x, y, static_cast<float>(__ldg(p.q_positions + i)), freq, qmul);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = y[e] = 0.0f;
      }
      *reinterpret_cast<uint4*>(sQ + Swz<D>(r, hc)) = Pack8(x);
      *reinterpret_cast<uint4*>(sQ + Swz<D>(r, hc + kHalfChunks)) = Pack8(y);
    }
  }
  __syncthreads();  // sQ complete; every thread is past issue_tile(0)'s reads of sSlot[0]

  // Thread rows: warp * 32 + mt * 16 + hf * 8 + g (mt: m16 tile, hf: C fragment half).
  float o[kMT][kDTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int n = 0; n < kDTiles; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
  }
  float m[kMT][2], l[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.0f;
  }
  const int mi = lane >> 3;
  constexpr uint32_t kRowBytes = D * 2;
  const uint32_t x7 = lane & 7;
  const uint32_t q_addr = smem_addr + (warp * 16 * kMT + x7 + ((mi & 1) << 3)) * kRowBytes +
                          (((mi >> 1) ^ x7) << 4);
  const uint32_t k_off = (x7 + ((mi >> 1) << 3)) * kRowBytes + (((mi & 1) ^ x7) << 4);
  const uint32_t v_off = (x7 + ((mi & 1) << 3)) * kRowBytes + (((mi >> 1) ^ x7) << 4);
  const uint32_t k_tiles = smem_addr + kBM * kRowBytes;
  const uint32_t v_tiles = k_tiles + kTileBufs * kBN * kRowBytes;

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int buf = tile & 1;
    const int tbuf = kFp8 ? 0 : buf;  // the bf16 tiles' buffer
    if (tile + 1 < num_tiles) issue_tile(tile + 1);
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();  // tile landed (and, the first time, sQ is complete)

    __nv_bfloat16* kt = sK + tbuf * kBN * D;
    if constexpr (kFp8) {
      // Dequantize the raw K and V tiles into the bf16 tiles (swizzled), then rotate as bf16.
#pragma unroll 1
      for (int u = 0; u < kVItems; ++u) {
        const int idx = tid + u * kThreads, key = idx / kChunks, c = idx % kChunks;
        const int r = buf * kBN * D + key * D + c * 8, w = Swz<D>(key, c);
        *reinterpret_cast<uint4*>(sK + w) =
            kv_internal::Fp8x8ToBf16x8(*reinterpret_cast<const uint2*>(rK + r), sScale[0]);
        *reinterpret_cast<uint4*>(sV + w) =
            kv_internal::Fp8x8ToBf16x8(*reinterpret_cast<const uint2*>(rV + r), sScale[1]);
      }
      __syncthreads();
    }
    // Rotate the landed K tile in place (gathered keys are rotated already).
    // (Not unrolled: O and S own most registers; the other warps hide the load latency.)
#pragma unroll 1
    for (int u = 0; u < (kGathered ? 0 : kRotItems); ++u) {
      const int key = tid / kHalfChunks + u * kRotStep;
      uint4* lo = reinterpret_cast<uint4*>(kt + Swz<D>(key, hc));
      uint4* hi = reinterpret_cast<uint4*>(kt + Swz<D>(key, hc + kHalfChunks));
      float x[8], y[8];
      kv_internal::Bf16x8ToFloat(*lo, x);
      kv_internal::Bf16x8ToFloat(*hi, y);
      Rotate8(x, y, static_cast<float>(sPos[buf * kBN + key]), freq, 1.0f);
      *lo = Pack8(x);
      *hi = Pack8(y);
    }
    if constexpr (!kGathered) __syncthreads();

    // S = Q K^T for the warp's 32 rows x 64 keys: each K fragment serves both m16 tiles.
    float s[kMT][kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
    }
    const uint32_t k_addr = k_tiles + tbuf * (kBN * kRowBytes) + k_off;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      uint32_t qa[kMT][4];
      const uint32_t qk = q_addr ^ (kk << 5), kkk = k_addr ^ (kk << 5);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) LdMatrixX4(qa[mt], qk + mt * 16 * kRowBytes);
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t kb[4];
        LdMatrixX4(kb, kkk + np * 16 * kRowBytes);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          Mma(s[mt][2 * np], qa[mt], kb[0], kb[1]);
          Mma(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }
    const int j0 = sb + tile * kBN;
    if (j0 + kBN > mask_from) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          // Keys j >= lim are masked: lim relative to the tile's first key j0.
          const int lim = min(sVis[warp * 16 * kMT + mt * 16 + hf * 8 + g], se) - j0 - 2 * t;
#pragma unroll
          for (int n = 0; n < kNTiles; ++n) {
            if (n * 8 >= lim) s[mt][n][2 * hf] = -INFINITY;
            if (n * 8 + 1 >= lim) s[mt][n][2 * hf + 1] = -INFINITY;
          }
        }
      }
    }

    // Online softmax (base 2) per row: C elements 0, 1 are row g, elements 2, 3 row g + 8.
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) mx = fmaxf(mx, fmaxf(s[mt][n][2 * hf], s[mt][n][2 * hf + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m[mt][hf], mx);
        const float base = mn == -INFINITY ? 0.0f : mn;  // rows with nothing visible yet
        const float alpha = FastExp2(m[mt][hf] - base);
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) {
          s[mt][n][2 * hf] = FastExp2(s[mt][n][2 * hf] - base);
          s[mt][n][2 * hf + 1] = FastExp2(s[mt][n][2 * hf + 1] - base);
          sum += s[mt][n][2 * hf] + s[mt][n][2 * hf + 1];
        }
        l[mt][hf] = l[mt][hf] * alpha + sum;
        m[mt][hf] = mn;
#pragma unroll
        for (int n = 0; n < kDTiles; ++n) {
          o[mt][n][2 * hf] *= alpha;
          o[mt][n][2 * hf + 1] *= alpha;
        }
      }
    }

    // O += P V: P's A fragments are the S accumulators, V's B fragments from ldmatrix.trans
    // (each serves both m16 tiles).
    const uint32_t v_addr = v_tiles + tbuf * (kBN * kRowBytes) + v_off;
#pragma unroll
    for (int ks = 0; ks < kBN / 16; ++ks) {
      uint32_t pa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        pa[mt][0] = PackBf16(s[mt][2 * ks][0], s[mt][2 * ks][1]);
        pa[mt][1] = PackBf16(s[mt][2 * ks][2], s[mt][2 * ks][3]);
        pa[mt][2] = PackBf16(s[mt][2 * ks + 1][0], s[mt][2 * ks + 1][1]);
        pa[mt][3] = PackBf16(s[mt][2 * ks + 1][2], s[mt][2 * ks + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kDTiles / 2; ++dp) {
        uint32_t vb[4];
        LdMatrixX4Trans(vb, (v_addr ^ (dp << 5)) + ks * 16 * kRowBytes);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          Mma(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
          Mma(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  CpAsyncWait<0>();

  // Row sums over the quad, then the output.
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float lr = l[mt][hf];
      lr += __shfl_xor_sync(0xffffffffu, lr, 1);
      lr += __shfl_xor_sync(0xffffffffu, lr, 2);
      const int r = warp * 16 * kMT + mt * 16 + hf * 8 + g;
      const int i = q0 + r / G;
      if (i >= q_end) continue;
      const int head = kv * G + r % G;
      const float inv = lr > 0.0f ? 1.0f / lr : 0.0f;
      const int64_t rh = static_cast<int64_t>(i) * p.num_heads + head;
      if (p.num_splits == 1) {
        __nv_bfloat16* dst = p.out + rh * D;
#pragma unroll
        for (int n = 0; n < kDTiles; ++n) {
          *reinterpret_cast<__nv_bfloat162*>(dst + n * 8 + 2 * t) =
              __floats2bfloat162_rn(o[mt][n][2 * hf] * inv, o[mt][n][2 * hf + 1] * inv);
        }
      } else {
        const int64_t slot = rh * p.num_splits + split;
        float* dst = ws.partial_out + slot * D;
#pragma unroll
        for (int n = 0; n < kDTiles; ++n) {
          *reinterpret_cast<float2*>(dst + n * 8 + 2 * t) =
              make_float2(o[mt][n][2 * hf] * inv, o[mt][n][2 * hf + 1] * inv);
        }
        if (t == 0) ws.partial_lse[slot] = lr > 0.0f ? m[mt][hf] + __log2f(lr) : -INFINITY;
      }
    }
  }
}

// One warp per (query row, head): weights 2^(lse_s - max) over the splits.
template <int D>
__global__ void __launch_bounds__(256) PrefillMergeKernel(PrefillAttentionParams p,
                                                          SplitWorkspace ws) {
  constexpr int E = D / 32;
  const int lane = threadIdx.x & 31;
  const int64_t rh = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (rh >= p.total_q * p.num_heads) return;
  const int S = p.num_splits;
  const float* lse = ws.partial_lse + rh * S;
  float m = -INFINITY;
  for (int s = lane; s < S; s += 32) m = fmaxf(m, lse[s]);
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  float acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.0f;
  float sum = 0.0f;
  if (m != -INFINITY) {
    const float* part = ws.partial_out + rh * S * D + lane * E;
    for (int s = 0; s < S; ++s) {
      const float w = exp2f(lse[s] - m);
      if (w > 0.0f) {
        sum += w;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] = fmaf(w, part[static_cast<int64_t>(s) * D + e], acc[e]);
      }
    }
  }
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  __nv_bfloat16* dst = p.out + rh * D + lane * E;
#pragma unroll
  for (int e = 0; e < E; e += 2) {
    *reinterpret_cast<__nv_bfloat162*>(dst + e) =
        __floats2bfloat162_rn(acc[e] * inv, acc[e + 1] * inv);
  }
}

// The kernel's shared-memory opt-in on the current device, once (kernel_attributes.h).
template <int D, int G, KvSource kSrc>
cudaError_t ConfigurePrefill() {
  static std::atomic<uint64_t> done{0};
  return OptInSharedMemoryOnce(PrefillKernel<D, G, kSrc>,
                               PrefillSmemBytes<D, kSrc == KvSource::kFp8Cache>(), &done);
}

template <KvSource kSrc>
cudaError_t ConfigurePrefillKernels() {
  for (cudaError_t e : {ConfigurePrefill<64, 1, kSrc>(), ConfigurePrefill<64, 2, kSrc>(),
                        ConfigurePrefill<64, 4, kSrc>(), ConfigurePrefill<64, 8, kSrc>(),
                        ConfigurePrefill<128, 1, kSrc>(), ConfigurePrefill<128, 2, kSrc>(),
                        ConfigurePrefill<128, 4, kSrc>(), ConfigurePrefill<128, 8, kSrc>()}) {
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// The workspace's parts: the gathered K and V first (when `gathered`: capacity batch x
// max_kv_len rows per KV head + kBN zero rows, 256-byte aligned), then the split partials.
// PrefillAttentionWorkspaceBytes sizes them with the same two helpers.
inline int64_t GatheredBytes(const PrefillAttentionParams& p) {
  const int64_t elems = p.num_kv_heads * (p.batch * p.max_kv_len + kBN) * p.head_dim;
  return (elems * 2 * 2 + 255) / 256 * 256;  // K and V, bf16
}

inline int64_t PartialBytes(const PrefillAttentionParams& p) {
  return p.num_splits > 1 ? p.total_q * p.num_heads * p.num_splits * (p.head_dim + 1) * 4 : 0;
}

inline SplitWorkspace CarveWorkspace(const PrefillAttentionParams& p, bool gathered) {
  SplitWorkspace ws{nullptr, nullptr, nullptr, nullptr, 0};
  char* at = static_cast<char*>(p.workspace);
  if (gathered) {
    ws.capacity = p.batch * p.max_kv_len;
    ws.gathered_k = reinterpret_cast<__nv_bfloat16*>(at);
    ws.gathered_v = ws.gathered_k + p.num_kv_heads * (ws.capacity + kBN) * p.head_dim;
    at += GatheredBytes(p);
  }
  if (p.num_splits > 1) {
    ws.partial_out = reinterpret_cast<float*>(at);
    ws.partial_lse = ws.partial_out + p.total_q * p.num_heads * p.num_splits * p.head_dim;
  }
  return ws;
}

template <int D, int G, KvSource kSrc>
cudaError_t LaunchPrefill(const PrefillAttentionParams& p, const SplitWorkspace& ws,
                          cudaStream_t stream) {
  constexpr size_t kSmem = PrefillSmemBytes<D, kSrc == KvSource::kFp8Cache>();
  TS_CUDA_RETURN_IF_ERROR((ConfigurePrefill<D, G, kSrc>()));
  const int64_t q_tiles = (p.max_q_len * G + kBM - 1) / kBM;
  const dim3 grid(static_cast<unsigned>(q_tiles),
                  static_cast<unsigned>(p.num_kv_heads * p.num_splits),
                  static_cast<unsigned>(p.batch));
  PrefillKernel<D, G, kSrc><<<grid, kThreads, kSmem, stream>>>(p, ws);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (p.num_splits > 1) {
    const int64_t warps = p.total_q * p.num_heads;
    const dim3 merge_grid(static_cast<unsigned>((warps + 7) / 8));
    PrefillMergeKernel<D><<<merge_grid, 256, 0, stream>>>(p, ws);
    TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return cudaSuccess;
}

template <int D, KvSource kSrc>
cudaError_t DispatchPrefillGroup(const PrefillAttentionParams& p, const SplitWorkspace& ws,
                                 int64_t group, cudaStream_t stream) {
  switch (group) {
    case 1: return LaunchPrefill<D, 1, kSrc>(p, ws, stream);
    case 2: return LaunchPrefill<D, 2, kSrc>(p, ws, stream);
    case 4: return LaunchPrefill<D, 4, kSrc>(p, ws, stream);
    case 8: return LaunchPrefill<D, 8, kSrc>(p, ws, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <KvSource kSrc>
cudaError_t DispatchPrefillDim(const PrefillAttentionParams& p, const SplitWorkspace& ws,
                               int64_t group, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: return DispatchPrefillGroup<64, kSrc>(p, ws, group, stream);
    case 128: return DispatchPrefillGroup<128, kSrc>(p, ws, group, stream);
    default: return cudaErrorInvalidValue;
  }
}

// The FP8-cache instantiations (prefill_attention_fp8.cu): DispatchPrefillDim<kFp8Cache>.
cudaError_t PrefillAttentionFp8(const PrefillAttentionParams& p, const SplitWorkspace& ws,
                                int64_t group, cudaStream_t stream);
// ConfigurePrefillKernels<kFp8Cache>, from the same file.
cudaError_t ConfigurePrefillKernelsFp8();
// The gathered-list instantiations (prefill_attention_gathered.cu): DispatchPrefillDim<kGathered>
// and ConfigurePrefillKernels<kGathered>.
cudaError_t PrefillAttentionGathered(const PrefillAttentionParams& p, const SplitWorkspace& ws,
                                     int64_t group, cudaStream_t stream);
cudaError_t ConfigurePrefillKernelsGathered();

}  // namespace tokenselect::kernels::cuda::prefill_internal

#endif  // TOKENSELECT_KERNELS_CUDA_PREFILL_ATTENTION_KERNEL_CUH_
