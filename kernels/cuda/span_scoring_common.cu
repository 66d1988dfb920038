// What the selection launchers of span_scoring.h share (span_scoring_internal.cuh): launch
// sizing, problem checks, SelectionCapacity and the output kernels.
//
// AssembleKernel writes [0, n_init) + the picked units' tokens + [N - n_local, N): units are
// ascending and only the last can be short, so entry p maps to a unit by division.
// SelectAllKernel writes [0, N) for a covering budget (no key read). Both are grid-stride loops of
// 256 threads, at most 1024 blocks. CachedSelectionKernel (one block) is ApplySelectionCache.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/span_scoring.h"
#include "kernels/cuda/span_scoring_internal.cuh"

namespace tokenselect::kernels::cuda {
namespace span_internal {
namespace {

__global__ void AssembleKernel(AssembleArgs a) {
  if (Skipped(a.skip)) return;
  const int64_t np = a.num_picks_dev != nullptr ? *a.num_picks_dev : a.num_picks_host;
  auto unit_of = [&](int64_t i) -> int64_t {
    const int64_t pick = a.picks[i];
    return a.map != nullptr ? a.map[pick] : pick;
  };
  int64_t picked = 0;
  if (np > 0) {
    const int64_t last = unit_of(np - 1);
    const int64_t first = a.begin + last * a.unit;
    picked = (np - 1) * a.unit + (min(a.end, first + a.unit) - first);
  }
  const int64_t local_begin = a.num_tokens - a.n_local;
  const int64_t total = a.n_init + picked + a.n_local;
  if (blockIdx.x == 0 && threadIdx.x == 0) *a.count = static_cast<int32_t>(total);
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < total;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t v;
    if (p < a.n_init) {
      v = p;
    } else if (p < a.n_init + picked) {
      const int64_t o = p - a.n_init;
      v = a.begin + unit_of(o / a.unit) * a.unit + o % a.unit;
    } else {
      v = local_begin + (p - a.n_init - picked);
    }
    a.out[p] = static_cast<int32_t>(v);
  }
}

// The covering budget: every token, no key read.
__global__ void SelectAllKernel(int32_t* out, int32_t* count, int64_t n) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *count = static_cast<int32_t>(n);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = static_cast<int32_t>(i);
  }
}

}  // namespace

int NumSms() {
  static std::atomic<int> cached{0};  // rank threads call this concurrently
  int num_sms = cached.load(std::memory_order_relaxed);
  if (num_sms == 0) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      num_sms = 132;
    }
    cached.store(num_sms, std::memory_order_relaxed);
  }
  return num_sms;
}

int GridFor(int64_t items, int64_t per_block, int64_t max_blocks) {
  const int64_t blocks = (items + per_block - 1) / per_block;
  return static_cast<int>(std::max<int64_t>(1, std::min(blocks, max_blocks)));
}

bool ValidProblem(const SelectionProblem& p) {
  if (p.num_tokens < 0 || p.num_tokens > INT32_MAX || p.num_heads <= 0 || p.num_kv_heads <= 0 ||
      p.num_heads % p.num_kv_heads != 0 || p.n_init < 0 || p.k < 0 || p.n_local < 0 ||
      p.n_init + p.k + p.n_local > INT32_MAX || !std::isfinite(p.scale)) {
    return false;
  }
  const int64_t group = p.num_heads / p.num_kv_heads;
  return (p.head_dim == 64 || p.head_dim == 128) &&
         (group == 1 || group == 2 || group == 4 || group == 8) &&
         p.num_heads * p.head_dim <= kMaxQueryFloats;
}

bool Covers(const SelectionProblem& p) { return p.n_init + p.k + p.n_local >= p.num_tokens; }

int64_t NumUnits(const SelectionProblem& p, int64_t unit) {
  if (unit <= 0) return 0;
  const int64_t c = p.num_tokens - p.n_local - p.n_init;
  return c > 0 ? (c + unit - 1) / unit : 0;
}

cudaError_t LaunchAssemble(const AssembleArgs& a, int64_t capacity, cudaStream_t stream) {
  AssembleKernel<<<GridFor(capacity, 256, 1024), 256, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchSelectAll(const SelectionOutput& out, int64_t n, cudaStream_t stream) {
  SelectAllKernel<<<GridFor(n, 256, 1024), 256, 0, stream>>>(out.tokens, out.num_selected, n);
  return cudaGetLastError();
}

AssembleArgs BaseAssemble(const SelectionOutput& out, const SelectionProblem& p) {
  AssembleArgs a;
  a.out = out.tokens;
  a.count = out.num_selected;
  a.begin = p.n_init;
  a.end = p.num_tokens - p.n_local;
  a.n_init = p.n_init;
  a.num_tokens = p.num_tokens;
  a.n_local = p.n_local;
  return a;
}

}  // namespace span_internal

namespace {

constexpr int kCacheThreads = 1024;

// One block. A miss copies the selected set's middle (its picks) into the entry; a hit counts the
// entry's picks below the local window (they are ascending) and writes the set around them.
__global__ void __launch_bounds__(kCacheThreads) CachedSelectionKernel(CachedSelectionParams p) {
  __shared__ int s_kept;
  const int64_t n_init = p.problem.n_init, n_local = p.problem.n_local;
  const int64_t local_begin = p.problem.num_tokens - n_local;
  const bool hit = *p.hit != 0;
  if (threadIdx.x == 0 && p.counters != nullptr) ++p.counters[hit ? 0 : 1];
  if (!hit) {
    const int64_t np = *p.out.num_selected - n_init - n_local;
    if (threadIdx.x == 0) *p.num_picks = static_cast<int32_t>(np);
    for (int64_t i = threadIdx.x; i < np; i += blockDim.x) {
      p.picks[i] = p.out.tokens[n_init + i] - static_cast<int32_t>(n_init);
    }
    return;
  }
  const int np = *p.num_picks;
  const int64_t window = local_begin - n_init;  // the window's first token as an offset
  if (threadIdx.x == 0) s_kept = 0;
  __syncthreads();
  // The first pick at or past the window: the one whose predecessor is below it.
  for (int i = threadIdx.x; i < np; i += blockDim.x) {
    if (p.picks[i] >= window && (i == 0 || p.picks[i - 1] < window)) s_kept = i + 1;
  }
  __syncthreads();
  const int64_t kept = s_kept == 0 ? np : s_kept - 1;
  const int64_t total = n_init + kept + n_local;
  if (threadIdx.x == 0) *p.out.num_selected = static_cast<int32_t>(total);
  for (int64_t j = threadIdx.x; j < total; j += blockDim.x) {
    int64_t v;
    if (j < n_init) {
      v = j;
    } else if (j < n_init + kept) {
      v = n_init + p.picks[j - n_init];
    } else {
      v = local_begin + (j - n_init - kept);
    }
    p.out.tokens[j] = static_cast<int32_t>(v);
  }
}

}  // namespace

cudaError_t ApplySelectionCache(const CachedSelectionParams& p, cudaStream_t stream) {
  if (p.out.tokens == nullptr || p.out.num_selected == nullptr || p.picks == nullptr ||
      p.num_picks == nullptr || p.hit == nullptr || p.problem.n_init < 0 || p.problem.k < 0 ||
      p.problem.n_local < 0 || span_internal::Covers(p.problem)) {
    return cudaErrorInvalidValue;
  }
  CachedSelectionKernel<<<1, kCacheThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

int64_t SelectionCapacity(const SelectionProblem& p) {
  return std::min(p.num_tokens, p.n_init + p.k + p.n_local);
}

}  // namespace tokenselect::kernels::cuda
