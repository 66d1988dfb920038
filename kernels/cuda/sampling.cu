// Greedy and random token choice (sampling.h).
//
// ArgmaxKernel: block (512 threads) per row; each thread scans a strided slice keeping
// (value, id) under "greater value, then lower id" (NaN never wins), then a shuffle tree and a
// shared-memory tree under the same rule; optionally, in the same pass, whether the row holds a
// value the CPU sampler refuses (a block-wide OR).
//
// SampleKernel: block (512 threads) per row. A kept set is described by a cut (key, id) on the
// total order "more likely first": token i is kept iff key_i > key or (key_i == key and i <= id),
// key_i being the order-preserving 32-bit image of the logit (-0 and +0 share one key). Steps,
// each one or a few passes over the row's logits (L2 hits after the first):
//   1. max logit (block max); min_p threshold in double on thread 0, exactly as the CPU does.
//   2. top_k: count survivors; if more than k, a radix select (4 passes of 8-bit digits, 256-bin
//      integer histograms in shared memory, 8 copies for 8 groups of warps; the lanes of a warp
//      that fall in one bin combine their counts with __match_any_sync / __reduce_add_sync
//      first, so one shared atomic per bin and warp) finds the key of the k-th most likely, then an
//      ordered scan (thread t owns ids [t C, (t + 1) C), exclusive block scan of per-thread counts)
//      finds the id cut among the tokens of that key.
//   3. top_p: the same two steps over weights in 2^-40 fixed point (integer sums are exact, so the
//      cut is deterministic): the shortest prefix whose mass reaches ceil(top_p * total).
//   4. pick: per-thread weight sums in id order (double), exclusive block scan, and the thread
//      whose range holds u * total walks its ids. Rounding can leave no thread: the last kept id.
// No floating-point atomics anywhere, so a row's result depends only on its inputs.
#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/sampling.h"

namespace tokenselect::kernels::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr double kFixedScale = 1099511627776.0;  // 2^40
constexpr int kReplicas = 8;

// -0 maps to +0's key: the two zeros are equal logits (the CPU's comparison), so a tie between
// them goes to the lower id. (Without this, a fresh-seed run of the sampling test kept ids 4 and
// 6 (logit +0) over 1 and 3 (logit -0) at a top_k cut, where the CPU keeps 1 and 3.)
__device__ __forceinline__ uint32_t OrderedKey(float x) {
  const uint32_t u = x == 0.0f ? 0u : __float_as_uint(x);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

struct Cut {
  uint32_t key;
  int32_t id;
};
__device__ __forceinline__ bool Keeps(Cut c, uint32_t key, int32_t i) {
  return key > c.key || (key == c.key && i <= c.id);
}

__device__ __forceinline__ bool Better(float v, int32_t i, float bv, int32_t bi) {
  return v > bv || (v == bv && i < bi);
}

// Block-wide argmax under Better; thread 0 returns the result.
// *refused (when not null, thread 0's): whether the row holds a NaN or +inf, or only -inf - the
// rows the CPU sampler refuses (engine/sampling/sampler.cc), checked in the same pass.
__device__ int32_t BlockArgmax(const float* x, int32_t vocab, float* sv, int32_t* si,
                               bool* refused = nullptr) {
  float best = -INFINITY;
  int32_t best_id = INT_MAX;
  bool bad = false;
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = x[i];
    bad |= !(v < INFINITY);
    if (Better(v, i, best, best_id)) best = v, best_id = i;
  }
  if (refused != nullptr) bad = __syncthreads_or(bad) != 0;
  for (int offset = 16; offset > 0; offset /= 2) {
    const float v = __shfl_xor_sync(0xffffffffu, best, offset);
    const int32_t i = __shfl_xor_sync(0xffffffffu, best_id, offset);
    if (Better(v, i, best, best_id)) best = v, best_id = i;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sv[warp] = best, si[warp] = best_id;
  __syncthreads();
  if (warp == 0) {
    best = lane < kWarps ? sv[lane] : -INFINITY;
    best_id = lane < kWarps ? si[lane] : INT_MAX;
    for (int offset = 16; offset > 0; offset /= 2) {
      const float v = __shfl_xor_sync(0xffffffffu, best, offset);
      const int32_t i = __shfl_xor_sync(0xffffffffu, best_id, offset);
      if (Better(v, i, best, best_id)) best = v, best_id = i;
    }
  }
  __syncthreads();
  if (refused != nullptr) *refused = bad || best_id == INT_MAX || best == -INFINITY;
  return best_id == INT_MAX ? -1 : best_id;
}

// Exclusive prefix sum over the block in thread order (fixed order: deterministic for doubles);
// *total gets the sum. smem: kWarps + 1 values.
template <typename T>
__device__ T BlockExclusiveSum(T v, T* smem, T* total) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  T inclusive = v;
  for (int offset = 1; offset < 32; offset *= 2) {
    const T up = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += up;
  }
  T exclusive = __shfl_up_sync(0xffffffffu, inclusive, 1);
  if (lane == 0) exclusive = T(0);
  if (lane == 31) smem[warp] = inclusive;
  __syncthreads();
  if (threadIdx.x == 0) {
    T running = T(0);
    for (int w = 0; w < kWarps; ++w) {
      const T s = smem[w];
      smem[w] = running;
      running += s;
    }
    smem[kWarps] = running;
  }
  __syncthreads();
  const T result = smem[warp] + exclusive;
  *total = smem[kWarps];
  __syncthreads();
  return result;
}

struct SampleShared {
  unsigned long long hist[kReplicas][256];  // per-warp-group histograms (less atomic contention)
  unsigned long long u64[kWarps + 1];
  double f64[kWarps + 1];
  float fv[kWarps];
  int32_t iv[kWarps];
  float max_logit;
  float min_logit;
  uint32_t key;
  unsigned long long above;
  int32_t id;
};

// The cut (key, id) at which the running metric, walking the candidates most likely first,
// first reaches `need`: metric(more likely than the cut) < need <= metric(up to the cut).
// metric(i, x) returns 0 for non-candidates. Requires need >= 1 and total metric >= need.
template <typename Metric>
__device__ Cut FindCut(const float* x, int32_t vocab, Metric metric, unsigned long long need,
                       SampleShared& s) {
  uint32_t prefix = 0, mask = 0;
  unsigned long long above = 0;
  const int lane = threadIdx.x % 32;
  unsigned long long(&mine_hist)[256] = s.hist[(threadIdx.x / 32) % kReplicas];
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kReplicas * 256; b += kThreads) s.hist[b / 256][b % 256] = 0;
    __syncthreads();
    // Every lane runs the same number of iterations, so the warp intrinsics see full warps.
    for (int32_t base = 0; base < vocab; base += kThreads) {
      const int32_t i = base + static_cast<int32_t>(threadIdx.x);
      int bin = -1;
      unsigned long long m = 0;
      if (i < vocab) {
        const float v = x[i];
        const uint32_t key = OrderedKey(v);
        if ((key & mask) == prefix) {
          m = metric(i, v);
          if (m != 0) bin = static_cast<int>((key >> shift) & 255u);
        }
      }
      if (__ballot_sync(0xffffffffu, bin >= 0) == 0) continue;
      // Lanes of one bin add their metric (<= 2^40: two 20-bit halves, so the 32-bit warp
      // sums cannot overflow) and the lowest of them does one shared atomic.
      const unsigned peers = __match_any_sync(0xffffffffu, bin);
      const unsigned lo = __reduce_add_sync(peers, static_cast<unsigned>(m & 0xfffffu));
      const unsigned hi = __reduce_add_sync(peers, static_cast<unsigned>(m >> 20));
      if (bin >= 0 && lane == __ffs(peers) - 1) {
        atomicAdd(&mine_hist[bin], (static_cast<unsigned long long>(hi) << 20) + lo);
      }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += kThreads) {
      for (int r = 1; r < kReplicas; ++r) s.hist[0][b] += s.hist[r][b];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int chosen = 0;
      for (int b = 255; b >= 0; --b) {
        if (s.hist[0][b] != 0 && above + s.hist[0][b] >= need) {
          chosen = b;
          break;
        }
        above += s.hist[0][b];
      }
      s.key = prefix | (static_cast<uint32_t>(chosen) << shift);
      s.above = above;
    }
    __syncthreads();
    prefix = s.key;
    above = s.above;
    mask |= 255u << shift;
    __syncthreads();
  }
  // Ordered scan over the tokens of key `prefix`: the id where the metric reaches need.
  const int32_t chunk = (vocab + kThreads - 1) / kThreads;
  const int32_t lo = min(vocab, static_cast<int32_t>(threadIdx.x) * chunk);
  const int32_t hi = min(vocab, lo + chunk);
  unsigned long long mine = 0;
  for (int32_t i = lo; i < hi; ++i) {
    const float v = x[i];
    if (OrderedKey(v) == prefix) mine += metric(i, v);
  }
  if (threadIdx.x == 0) s.id = vocab - 1;
  unsigned long long total;
  const unsigned long long before = above + BlockExclusiveSum(mine, s.u64, &total);
  if (before < need && need <= before + mine) {
    unsigned long long running = before;
    for (int32_t i = lo; i < hi; ++i) {
      const float v = x[i];
      if (OrderedKey(v) != prefix) continue;
      running += metric(i, v);
      if (running >= need) {
        s.id = i;
        break;
      }
    }
  }
  __syncthreads();
  const Cut cut{prefix, s.id};
  __syncthreads();
  return cut;
}

__global__ void __launch_bounds__(kThreads)
    ArgmaxKernel(int32_t* out, const float* logits, int32_t vocab, int32_t* refused) {
  __shared__ float sv[kWarps];
  __shared__ int32_t si[kWarps];
  bool bad = false;
  const int32_t id = BlockArgmax(logits + static_cast<int64_t>(blockIdx.x) * vocab, vocab, sv, si,
                                 refused != nullptr ? &bad : nullptr);
  if (threadIdx.x == 0) {
    out[blockIdx.x] = id;
    if (refused != nullptr) refused[blockIdx.x] = bad ? 1 : 0;
  }
}

__global__ void __launch_bounds__(kThreads) SampleKernel(SampleParams p) {
  __shared__ SampleShared s;
  const int64_t row = blockIdx.x;
  const int32_t vocab = static_cast<int32_t>(p.vocab);
  const float* x = p.logits + row * p.vocab;
  const float temperature = p.temperature[row];
  if (!(temperature > 0.0f)) {
    const int32_t id = BlockArgmax(x, vocab, s.fv, s.iv);
    if (threadIdx.x == 0) p.out[row] = id;
    return;
  }
  // 1. Max logit and the min_p / underflow threshold (token_distribution.cc's formulas).
  float m = -INFINITY;
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) m = fmaxf(m, x[i]);
  for (int offset = 16; offset > 0; offset /= 2)
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  if (threadIdx.x % 32 == 0) s.fv[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float max_logit = -INFINITY;
    for (int w = 0; w < kWarps; ++w) max_logit = fmaxf(max_logit, s.fv[w]);
    s.max_logit = max_logit;
    const double min_p = p.min_p != nullptr ? static_cast<double>(p.min_p[row]) : 0.0;
    const double min_scaled = min_p > 0.0 ? fmax(log(static_cast<double>(FLT_MIN)), log(min_p))
                                          : log(static_cast<double>(FLT_MIN));
    const double threshold = fmax(max_logit + static_cast<double>(temperature) * min_scaled,
                                  static_cast<double>(-FLT_MAX));
    float min_logit = static_cast<float>(threshold);
    if (static_cast<double>(min_logit) < threshold) min_logit = nextafterf(min_logit, INFINITY);
    s.min_logit = min_logit;
  }
  __syncthreads();
  const float max_logit = s.max_logit;
  const float min_logit = s.min_logit;
  if (!(max_logit > -INFINITY)) {
    if (threadIdx.x == 0) p.out[row] = -1;
    return;
  }
  const double inv_temperature = 1.0 / static_cast<double>(temperature);
  auto weight = [&](float v) {
    return expf(static_cast<float>((static_cast<double>(v) - max_logit) * inv_temperature));
  };

  // 2. top_k over the survivors of min_p.
  Cut kcut{0u, vocab};  // keeps everything (key 0 is a NaN, never a survivor)
  const int64_t top_k = p.top_k != nullptr ? p.top_k[row] : 0;
  if (top_k > 0 && top_k < vocab) {
    unsigned long long count = 0;
    for (int32_t i = threadIdx.x; i < vocab; i += kThreads) count += x[i] >= min_logit ? 1 : 0;
    unsigned long long survivors;
    BlockExclusiveSum(count, s.u64, &survivors);
    if (survivors > static_cast<unsigned long long>(top_k)) {
      auto one = [min_logit](int32_t, float v) -> unsigned long long { return v >= min_logit; };
      kcut = FindCut(x, vocab, one, static_cast<unsigned long long>(top_k), s);
    }
  }
  auto kept1 = [&](int32_t i, float v) { return v >= min_logit && Keeps(kcut, OrderedKey(v), i); };

  // 3. top_p in fixed point.
  Cut pcut{0u, vocab};
  const float top_p = p.top_p != nullptr ? p.top_p[row] : 1.0f;
  if (top_p < 1.0f) {
    auto fixed = [&](int32_t i, float v) -> unsigned long long {
      return kept1(i, v) ? static_cast<unsigned long long>(
                               __double2ll_rn(static_cast<double>(weight(v)) * kFixedScale))
                         : 0ull;
    };
    unsigned long long mine = 0;
    for (int32_t i = threadIdx.x; i < vocab; i += kThreads) mine += fixed(i, x[i]);
    unsigned long long total;
    BlockExclusiveSum(mine, s.u64, &total);
    unsigned long long need = static_cast<unsigned long long>(
        ceil(static_cast<double>(fmaxf(top_p, 0.0f)) * static_cast<double>(total)));
    need = need < 1 ? 1 : (need > total ? total : need);
    pcut = FindCut(x, vocab, fixed, need, s);
  }
  auto kept = [&](int32_t i, float v) { return kept1(i, v) && Keeps(pcut, OrderedKey(v), i); };

  // 4. Inverse-CDF pick in ascending id order.
  const int32_t chunk = (vocab + kThreads - 1) / kThreads;
  const int32_t lo = min(vocab, static_cast<int32_t>(threadIdx.x) * chunk);
  const int32_t hi = min(vocab, lo + chunk);
  double mine = 0.0;
  int32_t last_kept = -1;
  for (int32_t i = lo; i < hi; ++i) {
    const float v = x[i];
    if (kept(i, v)) {
      mine += static_cast<double>(weight(v));
      last_kept = i;
    }
  }
  if (threadIdx.x == 0) s.id = INT_MAX;
  double total;
  const double before = BlockExclusiveSum(mine, s.f64, &total);
  const double local_target = p.uniforms[row] * total - before;
  if (local_target >= 0.0 && local_target < mine) {
    double running = 0.0;
    for (int32_t i = lo; i < hi; ++i) {
      const float v = x[i];
      if (!kept(i, v)) continue;
      running += static_cast<double>(weight(v));
      if (running > local_target) {
        atomicMin(&s.id, i);
        break;
      }
    }
  }
  // Fallback (rounding with u near 1): the last kept token.
  for (int offset = 16; offset > 0; offset /= 2) {
    last_kept = max(last_kept, __shfl_xor_sync(0xffffffffu, last_kept, offset));
  }
  if (threadIdx.x % 32 == 0) s.iv[threadIdx.x / 32] = last_kept;
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t id = s.id;
    if (id == INT_MAX) {
      for (int w = 0; w < kWarps; ++w) id = id == INT_MAX || s.iv[w] > id ? s.iv[w] : id;
    }
    p.out[row] = id;
  }
}

}  // namespace

cudaError_t Argmax(int32_t* out, const float* logits, int64_t rows, int64_t vocab,
                   cudaStream_t stream, int32_t* refused) {
  if (rows < 0 || vocab < 0 || rows > INT32_MAX || vocab > INT32_MAX) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (out == nullptr || (vocab > 0 && logits == nullptr)) return cudaErrorInvalidValue;
  ArgmaxKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      out, logits, static_cast<int32_t>(vocab), refused);
  return cudaGetLastError();
}

cudaError_t Sample(const SampleParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.vocab <= 0 || p.rows > INT32_MAX || p.vocab > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  if (p.out == nullptr || p.logits == nullptr || p.temperature == nullptr ||
      p.uniforms == nullptr) {
    return cudaErrorInvalidValue;
  }
  SampleKernel<<<static_cast<unsigned>(p.rows), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace tokenselect::kernels::cuda
