// Chunked-prefill attention over token-index lists (prefill_attention.h): a flash-attention-2
// style tensor-core kernel, its split-KV merge, the generic CUDA-core fallback and the selection
// query of a chunk.
//
// PrefillKernel<D, G>: block (query tile, kv head x split, request), 4 warps, mma.sync m16n8k16
// (bf16 in, fp32 accumulate; sm_80+), the flash-attention-2 layout: 128 rows per block, 32 per
// warp (two m16 tiles, so every K and V fragment read from shared memory feeds two mma), 64-entry
// key tiles.
//   M packing (GQA): row r = query q0 + r / G, head kv * G + r % G, so the G query heads of a kv
//     head share every key and value read (and every RoPE rotation of a key): a 512-query chunk
//     at g = 4 is 16 query tiles per kv head, 128 blocks at the Llama-3-8B shape; PlanPrefillSplits
//     adds KV splits up to about one wave of 2 blocks per SM.
//   Q: the tile's rows are rotated at q_positions (fp32 RoPE, HF rotate_half), pre-scaled by
//     scale * log2(e) and rounded to bf16 into shared memory once; the A fragments are re-read
//     with ldmatrix at every k-step (the registers hold O: 32 x d and S: 32 x 64 per warp).
//   K/V: tiles gathered by slot with cp.async (16 B per copy) into double-buffered, XOR-swizzled
//     shared memory (16 B chunk c of row r at c ^ (r & 7): conflict-free ldmatrix, and the
//     k-step's chunk is one XOR of a per-thread base address); slots come two tiles ahead through
//     a shared ring, positions with the tile. Once a K tile lands, the block rotates it in place
//     (fp32 cos/sin of float(position) * inv_freq with the two-part 2*pi reduction of
//     decode_attention_internal.h, rounded to bf16): each key is rotated once per 128 rows.
//   S = Q K^T, masked by the per-row prefix limit min(visible, split end) only on tiles that reach
//     past the smallest limit of the block; tiles past the largest visible prefix are never
//     loaded. Online softmax (base 2) on the C fragments, rows reduced over the quad; P becomes
//     the A fragments of O += P V in registers (bf16), V's B fragments come from ldmatrix.trans.
//   One split: the block writes bf16 O / l directly (zeros for rows with nothing visible).
//   num_splits > 1: each split covers a 64-aligned range of the request's list and writes its
//     normalised fp32 partial output and log2-sum-exp; PrefillMergeKernel (one warp per (query,
//     head)) combines them.
//   Registers: 255 at d = 128 with no spill (sm_80 and sm_90, nvcc 13.0): the rotate loop is
//     not unrolled and inv_freq lives in shared memory to stay there.
// Precision: rotated q and k are rounded to bf16 before the dot product (as flash attention with
// fused RoPE does), scores and softmax in fp32, P in bf16 for the P V product, fp32 accumulation.
//
// SimplePrefillKernel: block (query row, head), 256 threads, the SimpleDecodeKernel scheme
// (simple_attention.cu) over the visible prefix of the request's list.
//
// SelectionQueryKernel: block per head, threads (query sub-group, rotate_half pair).
//
// Measured on H200 (bench/prefill_cuda_bench.cu, Llama-3-8B shape, chunk 512, 2 splits):
// dense chunk over 1M cached tokens + the chunk 33.1 ms (266 TFLOP/s; 1 split: 48.8 ms; PyTorch
// flash attention on contiguous pre-rotated K/V, same run: 30.2 ms); TokenSelect list of 2688
// selected + 512 chunk entries 0.120 ms; the whole TokenSelect chunk step at 1M 0.880 ms.
#include "kernels/cuda/prefill_attention.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/decode_attention_internal.h"

namespace tokenselect::kernels::cuda {
namespace {

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

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(SmemAddr(smem)), "l"(gmem));
}

__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(SmemAddr(smem)), "l"(gmem));
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
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

__device__ __forceinline__ void Unpack8(const uint4& raw, float* out) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
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

template <int D>
constexpr size_t PrefillSmemBytes() {
  // + 256: the tiles start at a 256-byte boundary (see the ldmatrix addressing).
  return static_cast<size_t>(kBM * D + 4 * kBN * D) * 2 + 2 * kBN * sizeof(int32_t) + 256;
}

struct SplitWorkspace {
  float* partial_out;  // [total_q * num_heads][num_splits][head_dim]
  float* partial_lse;  // [total_q * num_heads][num_splits], log2 domain
};

template <int D, int G>
__global__ void __launch_bounds__(kThreads, 2)
    PrefillKernel(PrefillAttentionParams p, SplitWorkspace ws) {
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

  // Tiles start at a 256-byte boundary, so that the swizzled chunk bits of an ldmatrix address
  // can be flipped with an XOR: chunk 2 kk + b of row r sits at byte r * 2D + ((2 kk + b) ^
  // (r & 7)) * 16 = (r * 2D + (b ^ (r & 7)) * 16) ^ (kk * 32), and r & 7 = lane & 7 in every
  // ldmatrix below; one base address per operand, one XOR per k-step.
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t raw_addr = SmemAddr(smem_raw);
  const uint32_t smem_addr = (raw_addr + 255u) & ~255u;
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem_raw + (smem_addr - raw_addr));
  __nv_bfloat16* sK = sQ + kBM * D;       // [2][kBN * D]
  __nv_bfloat16* sV = sK + 2 * kBN * D;   // [2][kBN * D]
  int32_t* sPos = reinterpret_cast<int32_t*>(sV + 2 * kBN * D);  // [2][kBN]
  __shared__ int sVis[kBM];
  __shared__ int sVisMax[kWarps], sVisMin[kWarps];
  __shared__ int32_t sSlot[3][kBN];  // slots of tiles t, t + 1, t + 2 (ring)
  __shared__ float sFreq[D / 2];

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
#pragma unroll
    for (int u = 0; u < kCopyItems; ++u) {
      const int key = tid / kChunks + u * kKeyStep;
      const int64_t off = static_cast<int64_t>(slots[key]) * row_elems + kv * D + c * 8;
      CpAsync16(sK + buf * kBN * D + Swz<D>(key, c), p.k_cache + off);
      CpAsync16(sV + buf * kBN * D + Swz<D>(key, c), p.v_cache + off);
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
    if (tid < kBN) {
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
          Unpack8(*reinterpret_cast<const uint4*>(src), x);
          Unpack8(*reinterpret_cast<const uint4*>(src + D / 2), y);
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
  const uint32_t v_tiles = k_tiles + 2 * kBN * kRowBytes;

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int buf = tile & 1;
    if (tile + 1 < num_tiles) issue_tile(tile + 1);
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();  // tile landed (and, the first time, sQ is complete)

    // Rotate the landed K tile in place.
    // (Not unrolled: O and S own most registers; the other warps hide the load latency.)
    __nv_bfloat16* kt = sK + buf * kBN * D;
#pragma unroll 1
    for (int u = 0; u < kRotItems; ++u) {
      const int key = tid / kHalfChunks + u * kRotStep;
      uint4* lo = reinterpret_cast<uint4*>(kt + Swz<D>(key, hc));
      uint4* hi = reinterpret_cast<uint4*>(kt + Swz<D>(key, hc + kHalfChunks));
      float x[8], y[8];
      Unpack8(*lo, x);
      Unpack8(*hi, y);
      Rotate8(x, y, static_cast<float>(sPos[buf * kBN + key]), freq, 1.0f);
      *lo = Pack8(x);
      *hi = Pack8(y);
    }
    __syncthreads();

    // S = Q K^T for the warp's 32 rows x 64 keys: each K fragment serves both m16 tiles.
    float s[kMT][kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
    }
    const uint32_t k_addr = k_tiles + buf * (kBN * kRowBytes) + k_off;
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
    const uint32_t v_addr = v_tiles + buf * (kBN * kRowBytes) + v_off;
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

template <int D, int G>
cudaError_t LaunchPrefill(const PrefillAttentionParams& p, cudaStream_t stream) {
  SplitWorkspace ws{nullptr, nullptr};
  if (p.num_splits > 1) {
    ws.partial_out = static_cast<float*>(p.workspace);
    ws.partial_lse = ws.partial_out + p.total_q * p.num_heads * p.num_splits * D;
  }
  constexpr size_t kSmem = PrefillSmemBytes<D>();
  TS_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      PrefillKernel<D, G>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem)));
  const int64_t q_tiles = (p.max_q_len * G + kBM - 1) / kBM;
  const dim3 grid(static_cast<unsigned>(q_tiles),
                  static_cast<unsigned>(p.num_kv_heads * p.num_splits),
                  static_cast<unsigned>(p.batch));
  PrefillKernel<D, G><<<grid, kThreads, kSmem, stream>>>(p, ws);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (p.num_splits > 1) {
    const int64_t warps = p.total_q * p.num_heads;
    const dim3 merge_grid(static_cast<unsigned>((warps + 7) / 8));
    PrefillMergeKernel<D><<<merge_grid, 256, 0, stream>>>(p, ws);
    TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return cudaSuccess;
}

template <int D>
cudaError_t DispatchPrefillGroup(const PrefillAttentionParams& p, int64_t group,
                                 cudaStream_t stream) {
  switch (group) {
    case 1: return LaunchPrefill<D, 1>(p, stream);
    case 2: return LaunchPrefill<D, 2>(p, stream);
    case 4: return LaunchPrefill<D, 4>(p, stream);
    case 8: return LaunchPrefill<D, 8>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

bool HasListPointers(const PrefillAttentionParams& p) {
  return p.out != nullptr && p.q != nullptr && p.q_positions != nullptr &&
         p.q_indptr != nullptr && p.visible != nullptr && p.k_cache != nullptr &&
         p.v_cache != nullptr && p.kv_indptr != nullptr && p.kv_indices != nullptr &&
         p.kv_positions != nullptr && p.inv_freq != nullptr;
}

// ---- Generic fallback. ----

constexpr int kSimpleThreads = 256;
constexpr int kSimpleMaxDim = 256;

__global__ void __launch_bounds__(kSimpleThreads) SimplePrefillKernel(PrefillAttentionParams p) {
  __shared__ float q[kSimpleMaxDim];
  __shared__ float scores[kSimpleThreads];
  __shared__ float tile_max_sm, tile_sum_sm;
  const int64_t i = blockIdx.x;  // query row
  const int head = blockIdx.y;
  const int d = static_cast<int>(p.head_dim), half = d / 2;
  const int group = static_cast<int>(p.num_heads / p.num_kv_heads);
  const int kv_head = head / group;
  // Request of row i: the last b with q_indptr[b] <= i (empty requests skipped).
  int lo = 0, hi = static_cast<int>(p.batch) - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.q_indptr[mid] <= i) lo = mid; else hi = mid - 1;
  }
  const int b = lo;
  const int64_t list_begin = p.kv_indptr[b];
  const int len = static_cast<int>(p.kv_indptr[b + 1] - list_begin);
  const int vis = min(max(p.visible[i], 0), len);
  const int64_t q_off = i * p.q_row_stride + static_cast<int64_t>(head) * d;
  const float q_pos = static_cast<float>(p.q_positions[i]);
  for (int e = threadIdx.x; e < d; e += kSimpleThreads) {
    const int f = e < half ? e : e - half;
    float s, c;
    sincosf(q_pos * p.inv_freq[f], &s, &c);
    const float x = __bfloat162float(p.q[q_off + e]);
    const float partner = __bfloat162float(p.q[q_off + (e < half ? e + half : e - half)]);
    q[e] = (e < half ? x * c - partner * s : x * c + partner * s) * p.scale;
  }
  __syncthreads();
  const int64_t row = p.num_kv_heads * d;
  const int32_t* indices = p.kv_indices + list_begin;
  const int32_t* positions = p.kv_positions + list_begin;
  float m = -INFINITY, l = 0.0f, acc = 0.0f;  // acc: dim threadIdx.x
  for (int tile = 0; tile < vis; tile += kSimpleThreads) {
    const int e = tile + static_cast<int>(threadIdx.x);
    float score = -INFINITY;
    if (e < vis) {
      const __nv_bfloat16* k = p.k_cache + indices[e] * row + kv_head * d;
      const float pos = static_cast<float>(positions[e]);
      score = 0.0f;
      for (int f = 0; f < half; ++f) {
        float s, c;
        sincosf(pos * p.inv_freq[f], &s, &c);
        const float x1 = __bfloat162float(k[f]), x2 = __bfloat162float(k[f + half]);
        score = fmaf(q[f], x1 * c - x2 * s, score);
        score = fmaf(q[f + half], x2 * c + x1 * s, score);
      }
    }
    scores[threadIdx.x] = score;
    __syncthreads();
    const int count = min(kSimpleThreads, vis - tile);
    if (threadIdx.x == 0) {
      float tile_max = -INFINITY;
      for (int u = 0; u < count; ++u) tile_max = fmaxf(tile_max, scores[u]);
      tile_max_sm = tile_max;
    }
    __syncthreads();
    const float new_m = fmaxf(m, tile_max_sm);
    const float correction = expf(m - new_m);  // 0 on the first tile (m = -inf)
    __syncthreads();
    scores[threadIdx.x] = static_cast<int>(threadIdx.x) < count
                              ? expf(scores[threadIdx.x] - new_m) : 0.0f;
    __syncthreads();
    if (threadIdx.x == 0) {
      float sum = 0.0f;
      for (int u = 0; u < count; ++u) sum += scores[u];
      tile_sum_sm = sum;
    }
    __syncthreads();
    l = l * correction + tile_sum_sm;
    if (static_cast<int>(threadIdx.x) < d) {
      float a = acc * correction;
      for (int u = 0; u < count; ++u) {
        const __nv_bfloat16* v = p.v_cache + indices[tile + u] * row + kv_head * d;
        a = fmaf(scores[u], __bfloat162float(v[threadIdx.x]), a);
      }
      acc = a;
    }
    m = new_m;
    __syncthreads();
  }
  if (static_cast<int>(threadIdx.x) < d) {
    p.out[(i * p.num_heads + head) * d + threadIdx.x] =
        __float2bfloat16_rn(l > 0.0f ? acc / l : 0.0f);
  }
}

// ---- Selection query. ----

constexpr int kSelThreads = 1024;

// Block per head: thread (sub, pair) sums the rotated pair over queries sub, sub + subs, ...
// (subs = 1024 / (head_dim / 2), 16 at d = 128), then the subs meet in shared memory.
__global__ void __launch_bounds__(kSelThreads)
    SelectionQueryKernel(float* out, const __nv_bfloat16* q, int64_t q_row_stride, int num_q,
                         int head_dim, int n_local, const float* inv_freq) {
  __shared__ float2 red[kSelThreads];
  const int head = blockIdx.x;
  const int half = head_dim / 2;  // <= 256
  const int subs = kSelThreads / half;
  const int pair = static_cast<int>(threadIdx.x) % half;
  const int sub = static_cast<int>(threadIdx.x) / half;
  float ax = 0.0f, ay = 0.0f;
  if (sub < subs) {
    const float f = inv_freq[pair];
    const __nv_bfloat16* base = q + static_cast<int64_t>(head) * head_dim + pair;
#pragma unroll 4
    for (int i = sub; i < num_q; i += subs) {
      const __nv_bfloat16* row = base + static_cast<int64_t>(i) * q_row_stride;
      const float x = __bfloat162float(row[0]), y = __bfloat162float(row[half]);
      float sn, cs;
      RopeSinCos(static_cast<float>(n_local + i) * f, &sn, &cs);
      ax += x * cs - y * sn;
      ay += y * cs + x * sn;
    }
  }
  red[threadIdx.x] = make_float2(ax, ay);
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < half) {
    float sx = 0.0f, sy = 0.0f;
    for (int s = 0; s < subs; ++s) {
      const float2 v = red[s * half + threadIdx.x];
      sx += v.x;
      sy += v.y;
    }
    const float inv = 1.0f / static_cast<float>(num_q);
    out[static_cast<int64_t>(head) * head_dim + threadIdx.x] = sx * inv;
    out[static_cast<int64_t>(head) * head_dim + threadIdx.x + half] = sy * inv;
  }
}

}  // namespace

int PlanPrefillSplits(int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t max_q_len,
                      int64_t max_kv_len, int num_sms) {
  if (batch <= 0 || num_heads <= 0 || num_kv_heads <= 0 || max_q_len <= 0 || max_kv_len <= 0) {
    return 1;
  }
  const int64_t group = std::max<int64_t>(1, num_heads / num_kv_heads);
  const int64_t q_tiles = (max_q_len * group + kBM - 1) / kBM;
  const int64_t units = batch * num_kv_heads * q_tiles;
  // About one wave of 2 blocks per multiprocessor; each range at least kMinSplitTiles key
  // tiles. Measured on H200 (512-query chunk, Llama-3-8B shape, 128 blocks unsplit): 2 splits
  // 265 TFLOP/s against 180 for 1 split (one block per SM hides too little latency).
  const int64_t slots = 2 * static_cast<int64_t>(std::max(1, num_sms));
  const int64_t want = (slots + units / 2) / units;
  const int64_t most = std::max<int64_t>(1, max_kv_len / (kMinSplitTiles * kBN));
  const int64_t cap = std::min<int64_t>(kMaxSplits, 65535 / num_kv_heads);
  return static_cast<int>(std::clamp<int64_t>(std::min(want, most), 1, std::max<int64_t>(1, cap)));
}

size_t PrefillAttentionWorkspaceBytes(int64_t total_q, int64_t num_heads, int64_t head_dim,
                                      int num_splits) {
  if (num_splits <= 1) return 0;
  return static_cast<size_t>(total_q * num_heads * num_splits * (head_dim + 1)) * sizeof(float);
}

cudaError_t PrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream) {
  if (p.batch < 0 || p.total_q < 0 || p.batch > 65535 || p.total_q > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (p.num_heads <= 0 || p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  if (p.head_dim != 64 && p.head_dim != 128) return cudaErrorInvalidValue;
  const int64_t group = p.num_heads / p.num_kv_heads;
  if (group != 1 && group != 2 && group != 4 && group != 8) return cudaErrorInvalidValue;
  if (p.num_splits < 1 || p.num_splits > kMaxSplits ||
      p.num_kv_heads * p.num_splits > 65535) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0 || p.total_q == 0) return cudaSuccess;
  if (!HasListPointers(p) || (p.num_splits > 1 && p.workspace == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (p.q_row_stride < p.num_heads * p.head_dim || p.max_q_len < 1 ||
      p.max_q_len * group > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  switch (p.head_dim) {
    case 64: return DispatchPrefillGroup<64>(p, group, stream);
    case 128: return DispatchPrefillGroup<128>(p, group, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t SimplePrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream) {
  if (p.batch < 0 || p.total_q < 0 || p.total_q > INT32_MAX || p.head_dim <= 0 ||
      p.head_dim > kSimpleMaxDim || p.head_dim % 2 != 0 || p.num_kv_heads <= 0 ||
      p.num_heads <= 0 || p.num_heads % p.num_kv_heads != 0 || p.num_heads > 65535) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0 || p.total_q == 0) return cudaSuccess;
  if (!HasListPointers(p) || p.q_row_stride < p.num_heads * p.head_dim) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(p.total_q), static_cast<unsigned>(p.num_heads));
  SimplePrefillKernel<<<grid, kSimpleThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t BuildSelectionQuery(float* out, const __nv_bfloat16* q, int64_t q_row_stride,
                                int64_t num_q, int64_t num_heads, int64_t head_dim,
                                int64_t n_local, const float* inv_freq, cudaStream_t stream) {
  if (out == nullptr || q == nullptr || inv_freq == nullptr || num_q < 1 || num_heads < 1 ||
      num_heads > INT32_MAX || head_dim < 2 || head_dim > 512 || head_dim % 2 != 0 ||
      q_row_stride < num_heads * head_dim || n_local < 0 || n_local + num_q - 1 > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  SelectionQueryKernel<<<static_cast<unsigned>(num_heads), kSelThreads, 0, stream>>>(
      out, q, q_row_stride, static_cast<int>(num_q), static_cast<int>(head_dim),
      static_cast<int>(n_local), inv_freq);
  return cudaGetLastError();
}

}  // namespace tokenselect::kernels::cuda
