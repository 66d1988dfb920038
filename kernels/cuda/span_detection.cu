// Span detection on the GPU (span_detection.h, DetectChunkSpans): engine/selection/
// span_detection.cc's DetectSpans, step by step, with the same arithmetic in the same order.
//
//   Threshold*Kernel   the nearest-rank percentile of the causal entries by a 4-pass 8-bit
//                      radix select over their order-preserving bits (a grid-wide histogram and
//                      a one-block digit choice per pass)
//   RowScanKernel      a warp per row: the running row sum of A - tau (double), as the CPU's
//                      TriangleScorer builds it (coalesced loads, the sum sequential)
//   ColumnScanKernel   a thread per column: the 2-D prefix sums P, row after row
//   CandidatesKernel   every span [x, y]: its triangle score from P; a positive score becomes a
//                      sort key (the double's bits, which order positive doubles), others 0;
//                      the value is x * c + y, in (x, y) order
//   CUB radix sort     descending and stable: score desc, then x asc, then y asc (NMS's order)
//   NmsKernel          one block; batches of 1024 sorted spans: each thread checks its span
//                      against the kept list, then the batch's survivors are kept in order,
//                      each new one removing the later ones it overlaps by more than the IoU
//   AssembleKernel     one block: the kept spans in position order (ranks), the gap spans, each
//                      span's score and index-vector count (neighbours: the adjacent kept
//                      spans), the CSR offsets (a block scan)
//   IndexTokensKernel  a block per span: its tokens' column sums within the triangle (double,
//                      rows in order; a thread per column), then one warp picks the count best
//                      (ties: lower token) and writes them ascending
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/span_detection.h"
#include "kernels/cuda/span_scoring_internal.cuh"

namespace tokenselect::kernels::cuda {
namespace {

using span_internal::Carver;

constexpr int kBlock = 1024;       // the one-block kernels
constexpr int kSmemKept = 2048;    // kept spans cached in shared memory by the NMS
constexpr int kIndexWarps = 8;     // warps per block of IndexTokensKernel (a block per span)
constexpr int kIndexBlocks = 264;  // a fixed grid; blocks stride over the spans
constexpr int kMaxChunk = 8192;    // O(c^2) workspace; x * c + y fits in an int32

int64_t NumCandidates(int64_t c) { return c * (c + 1) / 2; }

// The percentile's radix select (ThresholdHistKernel, ThresholdChooseKernel): the current
// pass's histogram, the digits chosen so far and the rank left within them.
struct ThresholdState {
  uint32_t hist[256];
  uint32_t prefix;
  uint32_t mask;
  long long rank;
};

struct Workspace {
  float* tau = nullptr;          // [1]
  ThresholdState* threshold = nullptr;  // the radix select's histogram and digits
  double* rows = nullptr;        // [c, c]: running row sums of A - tau
  double* prefix = nullptr;      // [(c + 1), (c + 1)]
  uint64_t* keys_in = nullptr;   // [m]
  uint64_t* keys_out = nullptr;  // [m]
  int32_t* vals_in = nullptr;    // [m]
  int32_t* vals_out = nullptr;   // [m]
  void* sort_temp = nullptr;
  size_t sort_bytes = 0;
  int32_t* kept = nullptr;         // [m]: x * c + y in keep order
  int32_t* num_kept = nullptr;     // [1]
  int32_t* sorted_kept = nullptr;  // [m]: by position
  int32_t* gaps = nullptr;         // [2 (c + 1)]: begin, end (inclusive) pairs
  int32_t* span_count = nullptr;   // [max spans]: index tokens per final span
  double* colsums = nullptr;       // [kIndexBlocks, c]
};

Workspace Carve(void* base, int64_t c, size_t* total = nullptr) {
  Carver carver(base);
  const int64_t m = NumCandidates(c);
  Workspace w;
  w.tau = carver.Take<float>(1);
  w.threshold = carver.Take<ThresholdState>(1);
  w.rows = carver.Take<double>(c * c);
  w.prefix = carver.Take<double>((c + 1) * (c + 1));
  w.keys_in = carver.Take<uint64_t>(m);
  w.keys_out = carver.Take<uint64_t>(m);
  w.vals_in = carver.Take<int32_t>(m);
  w.vals_out = carver.Take<int32_t>(m);
  size_t sort_bytes = 0;
  cub::DeviceRadixSort::SortPairsDescending(
      nullptr, sort_bytes, static_cast<uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr),
      static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(m));
  w.sort_bytes = sort_bytes;
  w.sort_temp = carver.Take<char>(static_cast<int64_t>(sort_bytes));
  w.kept = carver.Take<int32_t>(m);
  w.num_kept = carver.Take<int32_t>(1);
  w.sorted_kept = carver.Take<int32_t>(m);
  w.gaps = carver.Take<int32_t>(2 * (c + 1));
  w.span_count = carver.Take<int32_t>(SpanDetectMaxSpans(c));
  w.colsums = carver.Take<double>(static_cast<int64_t>(kIndexBlocks) * c);
  if (total != nullptr) *total = carver.used();
  return w;
}

__device__ __forceinline__ uint32_t OrderedBits(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float FromOrderedBits(uint32_t u) {
  return __uint_as_float((u & 0x80000000u) != 0 ? (u & 0x7fffffffu) : ~u);
}

// The rank-th smallest (0-based) of the causal entries map[i, j], j <= i, by four 8-bit radix
// passes over their order-preserving bits, most significant first. Per pass ThresholdHistKernel
// (a grid over the entries, shared-memory histograms added into the global one) counts the
// entries that match the digits chosen so far, and ThresholdChooseKernel (one block) picks the
// digit holding the rank, clears the histogram, and after the last pass writes tau.

__global__ void ThresholdInitKernel(ThresholdState* st, int64_t rank) {
  for (int b = threadIdx.x; b < 256; b += blockDim.x) st->hist[b] = 0;
  if (threadIdx.x == 0) {
    st->prefix = 0;
    st->mask = 0;
    st->rank = rank;
  }
}

__global__ void ThresholdHistKernel(const float* __restrict__ map, int c, ThresholdState* st,
                                    int shift) {
  __shared__ uint32_t hist[256];
  for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
  __syncthreads();
  const uint32_t prefix = st->prefix, mask = st->mask;
  const int64_t total = static_cast<int64_t>(c) * c;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(idx / c),
              j = static_cast<int>(idx - static_cast<int64_t>(i) * c);
    if (j > i) continue;
    const uint32_t u = OrderedBits(map[idx]);
    if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < 256; b += blockDim.x) {
    if (hist[b] != 0) atomicAdd(&st->hist[b], hist[b]);
  }
}

__global__ void ThresholdChooseKernel(ThresholdState* st, int shift, float* __restrict__ tau) {
  if (threadIdx.x == 0) {
    long long below = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      if (below + st->hist[b] > st->rank) {
        st->prefix |= b << shift;
        st->mask |= 255u << shift;
        st->rank -= below;
        break;
      }
      below += st->hist[b];
    }
    if (shift == 0) *tau = FromOrderedBits(st->prefix);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < 256; b += blockDim.x) st->hist[b] = 0;
}

// The column scan and the index tokens' column sums issue their loads kBatch at a time ahead of
// the sums (which stay sequential: the CPU's order).
constexpr int kBatch = 8;

// A warp per row: lane l loads column col0 + l (coalesced), and every lane runs the row's
// sequential sum over the 32 (broadcast by shuffles), keeping the value at its own column.
__global__ void RowScanKernel(const float* __restrict__ map, int c, const float* __restrict__ tau,
                              double* __restrict__ rows) {
  const int r =
      static_cast<int>((static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32);
  const int lane = threadIdx.x % 32;
  if (r >= c) return;  // warp-uniform
  const double t = static_cast<double>(*tau);
  const int64_t base = static_cast<int64_t>(r) * c;
  double row = 0.0;
  for (int col0 = 0; col0 < c; col0 += 32) {
    const int col = col0 + lane;
    const float v = col < c && col <= r ? map[base + col] : 0.0f;
    double mine = 0.0;
    const int n = c - col0 < 32 ? c - col0 : 32;
    for (int k = 0; k < n; ++k) {
      const float vk = __shfl_sync(0xffffffffu, v, k);
      if (col0 + k <= r) row += static_cast<double>(vk) - t;
      if (k == lane) mine = row;
    }
    if (col < c) rows[base + col] = mine;
  }
}

// prefix[R][C] = sum of B[r][col] over r < R, col < C; row 0 and column 0 are zero.
__global__ void ColumnScanKernel(const double* __restrict__ rows, int c,
                                 double* __restrict__ prefix) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t w = c + 1;
  if (col > c) return;
  if (col == c) {  // column 0
    for (int r = 0; r <= c; ++r) prefix[r * w] = 0.0;
    return;
  }
  double acc = 0.0;
  prefix[col + 1] = 0.0;
  for (int r0 = 0; r0 < c; r0 += kBatch) {
    double v[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      v[k] = r0 + k < c ? rows[static_cast<int64_t>(r0 + k) * c + col] : 0.0;
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      if (r0 + k >= c) break;
      acc = acc + v[k];
      prefix[(r0 + k + 1) * w + col + 1] = acc;
    }
  }
}

// The CPU's TriangleScorer::Score, the same four terms in the same order.
__device__ __forceinline__ double TriangleScore(const double* __restrict__ prefix, int c, int x,
                                                int y) {
  const int64_t w = c + 1;
  return prefix[(y + 1) * w + y + 1] - prefix[x * w + y + 1] - prefix[(y + 1) * w + x] +
         prefix[x * w + x];
}

// grid (ceil(c / 256), c): x = blockIdx.y, y = x + thread.
__global__ void CandidatesKernel(const double* __restrict__ prefix, int c,
                                 uint64_t* __restrict__ keys, int32_t* __restrict__ vals) {
  const int x = blockIdx.y;
  const int y = x + blockIdx.x * blockDim.x + threadIdx.x;
  if (y >= c) return;
  const int64_t t = static_cast<int64_t>(x) * c - static_cast<int64_t>(x) * (x - 1) / 2 + (y - x);
  const double s = TriangleScore(prefix, c, x, y);
  keys[t] = s > 0.0 ? static_cast<uint64_t>(__double_as_longlong(s)) : 0ull;
  vals[t] = x * c + y;
}

// IntervalIoU(x1, y1, x2, y2) > iou, as the CPU computes it.
__device__ __forceinline__ bool Overlaps(int x1, int y1, int x2, int y2, double iou) {
  const int inter = min(y1, y2) - max(x1, x2) + 1;
  if (inter <= 0) return false;
  const int uni = (y1 - x1 + 1) + (y2 - x2 + 1) - inter;
  return static_cast<double>(inter) / static_cast<double>(uni) > iou;
}

__global__ void __launch_bounds__(kBlock)
    NmsKernel(const uint64_t* __restrict__ keys, const int32_t* __restrict__ vals, int64_t m, int c,
              double iou, int32_t* __restrict__ kept, int32_t* __restrict__ num_kept) {
  __shared__ int2 s_kept[kSmemKept];
  __shared__ int s_n, s_first;
  __shared__ int2 s_new;
  if (threadIdx.x == 0) s_n = 0;
  __syncthreads();
  for (int64_t base = 0; base < m; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const bool valid = i < m && keys[i] != 0;
    if (!__syncthreads_or(valid)) break;  // the positive spans are a prefix of the order
    int x = 0, y = 0;
    if (valid) {
      x = vals[i] / c;
      y = vals[i] - x * c;
    }
    const int n0 = s_n;
    bool alive = valid;
    for (int j = 0; alive && j < n0; ++j) {
      const int2 k = j < kSmemKept ? s_kept[j] : make_int2(kept[j] / c, kept[j] % c);
      if (Overlaps(x, y, k.x, k.y, iou)) alive = false;
    }
    // The batch's survivors in order: the first is kept and removes the later ones it overlaps.
    while (true) {
      __syncthreads();
      if (threadIdx.x == 0) s_first = INT_MAX;
      __syncthreads();
      if (alive) atomicMin(&s_first, static_cast<int>(threadIdx.x));
      __syncthreads();
      const int first = s_first;
      if (first == INT_MAX) break;
      if (static_cast<int>(threadIdx.x) == first) {
        const int n = s_n;
        if (n < kSmemKept) s_kept[n] = make_int2(x, y);
        kept[n] = x * c + y;
        s_n = n + 1;
        s_new = make_int2(x, y);
        alive = false;
      }
      __syncthreads();
      if (alive && Overlaps(x, y, s_new.x, s_new.y, iou)) alive = false;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) *num_kept = s_n;
}

// The CPU's IndexVectorCount.
__device__ int64_t VectorCount(double score, double neighbour, bool has_neighbour, double lambda,
                               int64_t min_vectors, int64_t max_vectors, int64_t length) {
  double ra = 1.0;
  if (has_neighbour && neighbour > 0.0) ra = fmin(fmax(score / neighbour, 0.0), 1.0);
  const double rv = exp(-lambda * (1.0 - ra));
  const int64_t upper = max(static_cast<int64_t>(1), min(max_vectors, length));
  const int64_t count = min_vectors + llround(static_cast<double>(max_vectors - min_vectors) * rv);
  return min(max(count, min(min_vectors, upper)), upper);
}

// How many of n entries sorted by begin satisfy `before` (begin before some token), which holds
// for a prefix of them: a binary search.
template <typename Before>
__device__ int CountBefore(int n, Before before) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (before(mid)) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

struct AssembleArgs {
  SpanDetectOutput out;
  Workspace w;
  const double* prefix;
  int c;
  SpanDetectOptions options;
};

__global__ void __launch_bounds__(kBlock) AssembleKernel(AssembleArgs a) {
  using BlockScan = cub::BlockScan<int32_t, kBlock>;
  __shared__ typename BlockScan::TempStorage scan;
  __shared__ int s_gaps, s_carry;
  extern __shared__ unsigned char covered[];  // [c]
  const int c = a.c, K = *a.w.num_kept;
  const int32_t* kept = a.w.kept;
  int32_t* sorted = a.w.sorted_kept;
  // The kept spans in (x, y) order: x * c + y is unique, so a rank is a position.
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    const int32_t key = kept[i];
    int rank = 0;
    for (int j = 0; j < K; ++j) rank += kept[j] < key ? 1 : 0;
    sorted[rank] = key;
  }
  for (int t = threadIdx.x; t < c; t += blockDim.x) covered[t] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    const int x = kept[i] / c, y = kept[i] % c;
    for (int t = x; t <= y; ++t) covered[t] = 1;
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // maximal uncovered runs, in order
    int g = 0;
    for (int t = 0; t < c;) {
      if (covered[t]) {
        ++t;
        continue;
      }
      int end = t;
      while (end + 1 < c && !covered[end + 1]) ++end;
      a.w.gaps[2 * g] = t;
      a.w.gaps[2 * g + 1] = end;
      ++g;
      t = end + 1;
    }
    s_gaps = g;
  }
  __syncthreads();
  const int G = s_gaps, S = K + G;
  // Each span's place: kept and gap spans share no token, so the order is by begin.
  for (int i = threadIdx.x; i < S; i += blockDim.x) {
    int x, y, pos, gap;
    double score;
    int64_t count;
    if (i < K) {
      x = sorted[i] / c;
      y = sorted[i] % c;
      pos = i + CountBefore(G, [&](int g) { return a.w.gaps[2 * g] < x; });
      gap = 0;
      score = TriangleScore(a.prefix, c, x, y);
      double neighbour = 0.0;
      int n = 0;
      if (i > 0) {
        neighbour += TriangleScore(a.prefix, c, sorted[i - 1] / c, sorted[i - 1] % c);
        ++n;
      }
      if (i + 1 < K) {
        neighbour += TriangleScore(a.prefix, c, sorted[i + 1] / c, sorted[i + 1] % c);
        ++n;
      }
      if (n > 0) neighbour /= n;
      count = VectorCount(score, neighbour, n > 0, a.options.lambda, a.options.min_vectors,
                          a.options.max_vectors, y - x + 1);
    } else {
      const int g = i - K;
      x = a.w.gaps[2 * g];
      y = a.w.gaps[2 * g + 1];
      pos = g + CountBefore(K, [&](int k) { return sorted[k] / c < x; });
      gap = 1;
      score = TriangleScore(a.prefix, c, x, y);
      count = min(a.options.min_vectors, static_cast<int64_t>(y - x + 1));
    }
    a.out.span_x[pos] = x;
    a.out.span_y[pos] = y;
    a.out.span_gap[pos] = gap;
    a.out.span_score[pos] = score;
    a.w.span_count[pos] = static_cast<int32_t>(count);
  }
  __syncthreads();
  // CSR offsets.
  if (threadIdx.x == 0) s_carry = 0;
  __syncthreads();
  for (int base = 0; base < S; base += blockDim.x) {
    const int i = base + threadIdx.x;
    const int32_t v = i < S ? a.w.span_count[i] : 0;
    int32_t offset, total;
    BlockScan(scan).ExclusiveSum(v, offset, total);
    if (i < S) a.out.indptr[i] = s_carry + offset;
    __syncthreads();
    if (threadIdx.x == 0) s_carry += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    a.out.indptr[S] = s_carry;
    a.out.counts[0] = S;
    a.out.counts[1] = s_carry;
  }
}

struct IndexArgs {
  SpanDetectOutput out;
  const float* map;
  double* colsums;
  const int32_t* span_count;
  int c;
};

__global__ void __launch_bounds__(kIndexWarps * 32) IndexTokensKernel(IndexArgs a) {
  const int lane = threadIdx.x % 32;
  const int c = a.c, S = a.out.counts[0];
  double* sums = a.colsums + static_cast<int64_t>(blockIdx.x) * c;
  for (int s = blockIdx.x; s < S; s += gridDim.x) {
    const int x = a.out.span_x[s], y = a.out.span_y[s];
    const int count = a.span_count[s];
    // The span's column sums, a thread per column (rows in order).
    for (int j = x + static_cast<int>(threadIdx.x); j <= y; j += blockDim.x) {
      double sum = 0.0;
      for (int r0 = j; r0 <= y; r0 += kBatch) {
        float v[kBatch];
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
          v[k] = r0 + k <= y ? a.map[static_cast<int64_t>(r0 + k) * c + j] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
          if (r0 + k <= y) sum += v[k];
        }
      }
      sums[j - x] = sum;
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // warp 0 picks the tokens
      // count rounds of the best remaining (higher sum, then lower token); picked ones become -1
      // (column sums are >= 0).
      for (int round = 0; round < count; ++round) {
        double best = -1.0;
        int best_j = INT_MAX;
        for (int j = x + lane; j <= y; j += 32) {
          const double v = sums[j - x];
          if (v > best) {  // lanes visit their tokens ascending: ties keep the lower
            best = v;
            best_j = j;
          }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
          const double ov = __shfl_xor_sync(0xffffffffu, best, off);
          const int oj = __shfl_xor_sync(0xffffffffu, best_j, off);
          if (ov > best || (ov == best && oj < best_j)) {
            best = ov;
            best_j = oj;
          }
        }
        if (best_j == INT_MAX) break;  // not reached: counts are at most the span's length
        if (lane == 0) sums[best_j - x] = -1.0;
        __syncwarp();
      }
      // The picked tokens, ascending.
      int written = a.out.indptr[s];
      for (int base = x; base <= y; base += 32) {
        const int j = base + lane;
        const bool picked = j <= y && sums[j - x] == -1.0;
        const unsigned ballot = __ballot_sync(0xffffffffu, picked);
        if (picked) a.out.index_tokens[written + __popc(ballot & ((1u << lane) - 1u))] = j;
        written += __popc(ballot);
      }
    }
    __syncthreads();  // the sums are consumed before the next span's
  }
}

__global__ void AppendDetectedKernel(SpanDetectOutput d, SpanIndexArrays ix, int32_t num_spans,
                                     int32_t num_vectors, int32_t first_token) {
  const int S = d.counts[0], V = d.counts[1];
  const int stride = gridDim.x * blockDim.x;
  const int t0 = blockIdx.x * blockDim.x + threadIdx.x;
  if (t0 == 0 && num_spans == 0) ix.vector_indptr[0] = 0;
  for (int s = t0; s < S; s += stride) {
    ix.span_begin[num_spans + s] = first_token + d.span_x[s];
    ix.span_end[num_spans + s] = first_token + d.span_y[s] + 1;
    ix.vector_indptr[num_spans + s + 1] = num_vectors + d.indptr[s + 1];
  }
  for (int v = t0; v < V; v += stride) {
    ix.vector_tokens[num_vectors + v] = first_token + d.index_tokens[v];
  }
}

__global__ void AppendOneKernel(SpanIndexArrays ix, int32_t num_spans, int32_t num_vectors,
                                int32_t begin, int32_t end, int32_t token) {
  if (num_spans == 0) ix.vector_indptr[0] = 0;
  ix.span_begin[num_spans] = begin;
  ix.span_end[num_spans] = end;
  ix.vector_indptr[num_spans + 1] = num_vectors + 1;
  ix.vector_tokens[num_vectors] = token;
}

bool ValidArrays(const SpanIndexArrays& ix, int64_t num_spans, int64_t num_vectors) {
  return ix.span_begin != nullptr && ix.span_end != nullptr && ix.vector_indptr != nullptr &&
         ix.vector_tokens != nullptr && num_spans >= 0 && num_vectors >= 0 &&
         num_spans < INT32_MAX / 2 && num_vectors < INT32_MAX / 2;
}

}  // namespace

int64_t SpanDetectMaxSpans(int64_t c) { return NumCandidates(std::max<int64_t>(c, 1)) + c + 1; }

int64_t SpanDetectMaxTokens(int64_t c, int64_t max_vectors) {
  return SpanDetectMaxSpans(c) * std::max<int64_t>(1, std::min(c, max_vectors));
}

size_t SpanDetectWorkspaceBytes(int64_t max_c) {
  size_t total = 0;
  Carve(nullptr, std::clamp<int64_t>(max_c, 1, kMaxChunk), &total);
  return total;
}

cudaError_t DetectChunkSpans(const SpanDetectParams& p, cudaStream_t stream) {
  const SpanDetectOptions& o = p.options;
  const SpanDetectOutput& out = p.out;
  if (p.map == nullptr || p.workspace == nullptr || out.counts == nullptr ||
      out.span_x == nullptr || out.span_y == nullptr || out.span_gap == nullptr ||
      out.indptr == nullptr || out.span_score == nullptr || out.index_tokens == nullptr ||
      p.c < 1 || p.c > kMaxChunk || !(o.threshold_percentile >= 0.0) ||
      !(o.threshold_percentile <= 100.0) || !(o.nms_iou >= 0.0) || o.min_vectors < 1 ||
      o.max_vectors < o.min_vectors || !std::isfinite(o.lambda)) {
    return cudaErrorInvalidValue;
  }
  const int c = static_cast<int>(p.c);
  const int64_t m = NumCandidates(p.c);
  const Workspace w = Carve(p.workspace, p.c);
  // The CPU's nearest rank: floor(p / 100 * (m - 1)).
  const int64_t rank =
      static_cast<int64_t>(std::floor(o.threshold_percentile / 100.0 * static_cast<double>(m - 1)));
  ThresholdInitKernel<<<1, 256, 0, stream>>>(w.threshold, rank);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  const int hist_blocks = static_cast<int>(std::min<int64_t>((p.c * p.c + 1023) / 1024, 264));
  for (int shift = 24; shift >= 0; shift -= 8) {
    ThresholdHistKernel<<<hist_blocks, 256, 0, stream>>>(p.map, c, w.threshold, shift);
    TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    ThresholdChooseKernel<<<1, 256, 0, stream>>>(w.threshold, shift, w.tau);
    TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  RowScanKernel<<<(c + 3) / 4, 128, 0, stream>>>(p.map, c, w.tau, w.rows);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  ColumnScanKernel<<<(c + 1 + 127) / 128, 128, 0, stream>>>(w.rows, c, w.prefix);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  CandidatesKernel<<<dim3((c + 255) / 256, c), 256, 0, stream>>>(w.prefix, c, w.keys_in, w.vals_in);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  size_t sort_bytes = w.sort_bytes;
  TS_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairsDescending(
      w.sort_temp, sort_bytes, w.keys_in, w.keys_out, w.vals_in, w.vals_out, static_cast<int>(m), 0,
      64, stream));
  NmsKernel<<<1, kBlock, 0, stream>>>(w.keys_out, w.vals_out, m, c, o.nms_iou, w.kept, w.num_kept);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  AssembleArgs aa{out, w, w.prefix, c, o};
  AssembleKernel<<<1, kBlock, static_cast<size_t>(c), stream>>>(aa);
  TS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  IndexArgs ia{out, p.map, w.colsums, w.span_count, c};
  IndexTokensKernel<<<kIndexBlocks, kIndexWarps * 32, 0, stream>>>(ia);
  return cudaGetLastError();
}

cudaError_t AppendDetectedSpans(const SpanDetectOutput& detected, const SpanIndexArrays& index,
                                int64_t num_spans, int64_t num_vectors, int64_t first_token,
                                cudaStream_t stream) {
  if (!ValidArrays(index, num_spans, num_vectors) || detected.counts == nullptr ||
      first_token < 0 || first_token > INT32_MAX / 2) {
    return cudaErrorInvalidValue;
  }
  AppendDetectedKernel<<<32, 256, 0, stream>>>(detected, index, static_cast<int32_t>(num_spans),
                                               static_cast<int32_t>(num_vectors),
                                               static_cast<int32_t>(first_token));
  return cudaGetLastError();
}

cudaError_t AppendOneSpan(const SpanIndexArrays& index, int64_t num_spans, int64_t num_vectors,
                          int32_t begin, int32_t end, int32_t token, cudaStream_t stream) {
  if (!ValidArrays(index, num_spans, num_vectors) || begin < 0 || end <= begin) {
    return cudaErrorInvalidValue;
  }
  AppendOneKernel<<<1, 1, 0, stream>>>(index, static_cast<int32_t>(num_spans),
                                       static_cast<int32_t>(num_vectors), begin, end, token);
  return cudaGetLastError();
}

}  // namespace tokenselect::kernels::cuda
