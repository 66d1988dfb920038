// Glue kernels between selection and attention (selection_list.h).
//
// BuildSelectedList: a block of 1024 threads per 1024 entries of the longest list. Every block
//   counts the picks that lie before the window (picks are ascending, so the valid ones are a
//   prefix; the count, an integer sum, is the same in every block and keeps the length decision
//   on the device), then each thread writes one entry: a sink, a pick, the window or a new token.
//   (One block with thread 0 binary-searching the picks took 6.2 us per layer at 2048 picks: 11
//   dependent loads, then four dependent pairs of loads per thread; this is ~3 latencies.)
// ListFromTokens: one block copies the selected set's slots (count read on the device) and
//   appends the new tokens.
// FillDenseList / FillIota: plain grid-stride writes.
#include "kernels/cuda/selection_list.h"

#include <algorithm>

namespace tokenselect::kernels::cuda {
namespace {

constexpr int kListThreads = 1024;

__global__ void __launch_bounds__(kListThreads) SelectedListKernel(SelectedListParams p) {
  __shared__ int32_t warp_valid[kListThreads / 32];
  const int64_t num_cached = ResolveLength(p.device_num_cached, p.num_cached);
  const int64_t window_begin = num_cached - p.n_local;
  // Picks p are valid while n_init + p < window_begin: count them, every thread a strided share
  // (its loads issued together).
  const int64_t limit = window_begin - p.n_init;
  int valid = 0;
  if (p.picks != nullptr) {
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < p.num_picks; j += kListThreads) {
      valid += p.picks[j] < limit ? 1 : 0;
    }
  }
  valid = __reduce_add_sync(0xffffffffu, valid);
  if ((threadIdx.x & 31) == 0) warp_valid[threadIdx.x >> 5] = valid;
  __syncthreads();
  int64_t num_valid = 0;
#pragma unroll
  for (int w = 0; w < kListThreads / 32; ++w) num_valid += warp_valid[w];
  const int64_t selected = p.n_init + num_valid + p.n_local;
  const int64_t total = selected + p.num_new;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    p.kv_indptr[0] = 0;
    p.kv_indptr[1] = static_cast<int32_t>(total);
    if (p.counters != nullptr && p.hit != nullptr) {
      const int32_t hit = *p.hit != 0 ? 1 : 0;
      p.counters[0] += hit;
      p.counters[1] += 1 - hit;
    }
  }
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kListThreads;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kListThreads + threadIdx.x;
  for (int64_t j = first; j < total; j += stride) {
    int64_t token;
    if (j < p.n_init) {
      token = j;
    } else if (j < p.n_init + num_valid) {
      token = p.n_init + p.picks[j - p.n_init];
    } else if (j < selected) {
      token = window_begin + (j - p.n_init - num_valid);
    } else {
      token = num_cached + (j - selected);
    }
    p.kv_indices[j] = p.token_slots[token];
    p.kv_positions[j] = static_cast<int32_t>(j);
  }
  for (int64_t i = first; i < p.num_new; i += stride) {
    p.q_positions[i] = static_cast<int32_t>(selected + i);
    p.visible[i] = static_cast<int32_t>(selected + i + 1);
  }
}

__global__ void TokensListKernel(TokensListParams p) {
  const int64_t count = min(static_cast<int64_t>(*p.count), p.capacity);
  const int64_t total = count + p.num_new;
  if (threadIdx.x == 0) {
    p.kv_indptr[0] = 0;
    p.kv_indptr[1] = static_cast<int32_t>(total);
  }
  for (int64_t j = threadIdx.x; j < total; j += blockDim.x) {
    const int64_t token = j < count ? p.tokens[j] : p.num_cached + (j - count);
    p.kv_indices[j] = p.token_slots[token];
    p.kv_positions[j] = static_cast<int32_t>(j);
  }
  for (int64_t i = threadIdx.x; i < p.num_new; i += blockDim.x) {
    p.q_positions[i] = static_cast<int32_t>(count + i);
    p.visible[i] = static_cast<int32_t>(count + i + 1);
  }
}

__global__ void DenseListKernel(DenseListParams p) {
  const int64_t num_cached = ResolveLength(p.device_num_cached, p.num_cached);
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i == 0) {
    p.kv_indptr[0] = 0;
    p.kv_indptr[1] = static_cast<int32_t>(num_cached + p.num_new);
  }
  if (i < p.num_new) {
    p.q_positions[i] = static_cast<int32_t>(num_cached + i);
    p.visible[i] = static_cast<int32_t>(num_cached + i + 1);
  }
}

__global__ void IotaKernel(int32_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = static_cast<int32_t>(i);
  }
}

}  // namespace

cudaError_t BuildSelectedList(const SelectedListParams& p, cudaStream_t stream) {
  if (p.kv_indptr == nullptr || p.kv_indices == nullptr || p.kv_positions == nullptr ||
      p.token_slots == nullptr || (p.num_new > 0 && (p.q_positions == nullptr ||
                                                      p.visible == nullptr)) ||
      p.num_picks < 0 || p.num_cached < 0 || p.num_new < 0 || p.n_init < 0 || p.n_local < 0 ||
      p.n_init + p.n_local > p.num_cached || (p.num_picks > 0 && p.picks == nullptr) ||
      p.n_init + p.num_picks + p.n_local + p.num_new > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  const int64_t entries = p.n_init + p.num_picks + p.n_local + p.num_new;
  const int64_t blocks = std::max<int64_t>(1, (entries + kListThreads - 1) / kListThreads);
  SelectedListKernel<<<static_cast<unsigned>(blocks), kListThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t ListFromTokens(const TokensListParams& p, cudaStream_t stream) {
  if (p.kv_indptr == nullptr || p.kv_indices == nullptr || p.kv_positions == nullptr ||
      p.token_slots == nullptr || p.tokens == nullptr || p.count == nullptr || p.capacity < 0 ||
      p.num_cached < 0 || p.num_new < 0 ||
      (p.num_new > 0 && (p.q_positions == nullptr || p.visible == nullptr)) ||
      p.capacity + p.num_new > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  TokensListKernel<<<1, 1024, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t FillDenseList(const DenseListParams& p, cudaStream_t stream) {
  if (p.kv_indptr == nullptr || p.num_cached < 0 || p.num_new < 0 ||
      (p.num_new > 0 && (p.q_positions == nullptr || p.visible == nullptr)) ||
      p.num_cached + p.num_new > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  const int64_t n = p.num_new > 1 ? p.num_new : 1;
  DenseListKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t FillIota(int32_t* out, int64_t n, cudaStream_t stream) {
  if (n < 0 || (n > 0 && out == nullptr)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096;
  IotaKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(out, n);
  return cudaGetLastError();
}

}  // namespace tokenselect::kernels::cuda
