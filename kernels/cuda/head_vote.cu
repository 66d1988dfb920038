// The hard head vote's steps around TopK (selection.h). All grid-stride over the candidates:
// HeadLogitColumn reads one head's logits (a 4-byte load per 16-byte LogitIndex group),
// AddHeadVotes scatters one head's k picks, HeadVoteRankScores builds a histogram of the vote
// counts (shared memory per block, then global atomics; counts are small integers, so the
// result is exact in any order) and then, in every block, finds c* from it and writes the row.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_length.h"
#include "kernels/cuda/selection.h"

namespace tokenselect::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxVotes = 4096;

unsigned Blocks(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 1024));
}

__global__ void __launch_bounds__(kThreads) HeadColumnKernel(HeadColumnParams p) {
  if (Skipped(p.skip)) return;
  const int64_t n = ResolveLength(p.device_n, p.n);
  for (int64_t j = blockIdx.x * int64_t{kThreads} + threadIdx.x; j < n;
       j += int64_t{gridDim.x} * kThreads) {
    p.column[j] = p.logits[LogitIndex(j, p.head, p.n, p.num_heads)];
  }
}

__global__ void __launch_bounds__(kThreads) AddVotesKernel(HeadVoteCountParams p) {
  if (Skipped(p.skip)) return;
  const int64_t n = ResolveLength(p.device_n, p.n);
  const int64_t picks = p.k < n ? p.k : n;
  // A head's picks are distinct: no two threads add to one count.
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < picks;
       i += int64_t{gridDim.x} * kThreads) {
    p.counts[p.picks[i]] += 1.0f;
  }
}

__global__ void __launch_bounds__(kThreads) VoteHistogramKernel(HeadVoteRankParams p) {
  extern __shared__ int32_t local[];  // [max_votes + 1]
  if (Skipped(p.skip)) return;
  const int64_t n = ResolveLength(p.device_n, p.n);
  for (int64_t c = threadIdx.x; c <= p.max_votes; c += kThreads) local[c] = 0;
  __syncthreads();
  for (int64_t j = blockIdx.x * int64_t{kThreads} + threadIdx.x; j < n;
       j += int64_t{gridDim.x} * kThreads) {
    const int64_t c = static_cast<int64_t>(p.counts[j]);
    atomicAdd(&local[c < 0 ? 0 : (c > p.max_votes ? p.max_votes : c)], 1);
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c <= p.max_votes; c += kThreads) {
    if (local[c] != 0) atomicAdd(&p.histogram[c], local[c]);
  }
}

__global__ void __launch_bounds__(kThreads) RankKernel(HeadVoteRankParams p) {
  __shared__ int64_t threshold;
  if (Skipped(p.skip)) return;
  const int64_t n = ResolveLength(p.device_n, p.n);
  if (threadIdx.x == 0) {
    // The largest count that at least min(k, n) candidates reach.
    const int64_t want = p.k < n ? p.k : n;
    int64_t at_least = 0, c = p.max_votes;
    for (; c > 0; --c) {
      at_least += p.histogram[c];
      if (at_least >= want) break;
    }
    threshold = c;
  }
  __syncthreads();
  const float c_star = static_cast<float>(threshold);
  for (int64_t j = blockIdx.x * int64_t{kThreads} + threadIdx.x; j < n;
       j += int64_t{gridDim.x} * kThreads) {
    const float count = p.counts[j];
    p.ranked[j] = count > c_star ? INFINITY : (count == c_star ? p.summed[j] : -INFINITY);
  }
}

}  // namespace

cudaError_t HeadLogitColumn(const HeadColumnParams& p, cudaStream_t stream) {
  if (p.column == nullptr || p.logits == nullptr || p.n < 0 || p.head < 0 ||
      p.head >= p.num_heads) {
    return cudaErrorInvalidValue;
  }
  if (p.n == 0) return cudaSuccess;
  HeadColumnKernel<<<Blocks(p.n), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t AddHeadVotes(const HeadVoteCountParams& p, cudaStream_t stream) {
  if (p.counts == nullptr || p.picks == nullptr || p.n < 0 || p.k < 0) {
    return cudaErrorInvalidValue;
  }
  if (p.n == 0 || p.k == 0) return cudaSuccess;
  AddVotesKernel<<<Blocks(std::min(p.k, p.n)), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t HeadVoteRankScores(const HeadVoteRankParams& p, cudaStream_t stream) {
  if (p.ranked == nullptr || p.histogram == nullptr || p.counts == nullptr || p.summed == nullptr ||
      p.n < 0 || p.k < 0 || p.max_votes < 1 || p.max_votes > kMaxVotes) {
    return cudaErrorInvalidValue;
  }
  if (p.n == 0) return cudaSuccess;
  cudaError_t err =
      cudaMemsetAsync(p.histogram, 0, static_cast<size_t>(p.max_votes + 1) * 4, stream);
  if (err != cudaSuccess) return err;
  const size_t shared = static_cast<size_t>(p.max_votes + 1) * 4;
  VoteHistogramKernel<<<Blocks(p.n), kThreads, shared, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  RankKernel<<<Blocks(p.n), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace tokenselect::kernels::cuda
