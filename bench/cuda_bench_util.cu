// Implementation of bench/cuda_bench_util.h. Timing records events on the caller's stream only;
// the random fill is a grid-stride kernel, so its values do not depend on the launch shape.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iterator>
#include <numeric>

#include "bench/cuda_bench_util.h"

namespace tokenselect::bench {
namespace {

__global__ void FillRandomBf16Kernel(uint16_t* out, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9e3779b9u ^ seed * 0x85ebca6bu ^
                 static_cast<uint32_t>(i >> 32);
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    const float x = 4.0f * ((h >> 8) * (1.0f / 16777216.0f)) - 2.0f;  // [-2, 2)
    uint32_t bits;
    memcpy(&bits, &x, 4);
    out[i] = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  }
}

__global__ void FillRandomFp8Kernel(uint8_t* out, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    // Codes of magnitude up to ~2^3 (exponent field <= 10), both signs, never NaN.
    out[i] = static_cast<uint8_t>((h & 0x80u) | (h % 80u));
  }
}

}  // namespace

std::vector<double> EventTimesMs(cudaStream_t stream, const std::function<void(int)>& fn,
                                 const TimingOptions& opt) {
  for (int i = 0; i < opt.warmup; ++i) fn(i);
  std::vector<cudaEvent_t> start(opt.reps), stop(opt.reps);
  for (int i = 0; i < opt.reps; ++i) {
    TS_CUDA_CHECK(cudaEventCreate(&start[i]));
    TS_CUDA_CHECK(cudaEventCreate(&stop[i]));
  }
  for (int i = 0; i < opt.reps; ++i) {
    if (opt.l2_flush != nullptr) {
      TS_CUDA_CHECK(cudaMemsetAsync(opt.l2_flush->get(), i & 0xff, opt.l2_flush->size(), stream));
    }
    TS_CUDA_CHECK(cudaEventRecord(start[i], stream));
    fn(i);
    TS_CUDA_CHECK(cudaEventRecord(stop[i], stream));
    if (opt.sync_each) TS_CUDA_CHECK(cudaEventSynchronize(stop[i]));
  }
  TS_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> ms(opt.reps);
  for (int i = 0; i < opt.reps; ++i) {
    float t = 0.0f;
    TS_CUDA_CHECK(cudaEventElapsedTime(&t, start[i], stop[i]));
    ms[i] = t;
    TS_CUDA_CHECK(cudaEventDestroy(start[i]));
    TS_CUDA_CHECK(cudaEventDestroy(stop[i]));
  }
  return ms;
}

double MedianMs(cudaStream_t stream, const std::function<void(int)>& fn, const TimingOptions& opt) {
  std::vector<double> ms = EventTimesMs(stream, fn, opt);
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

double GraphMedianMs(cudaStream_t stream, const std::function<void(int)>& fn, int inner,
                     const TimingOptions& opt) {
  fn(0);
  TS_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TS_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < inner; ++i) fn(i);
  TS_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  TS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double ms = MedianMs(
      stream, [&](int) { TS_CUDA_CHECK(cudaGraphLaunch(exec, stream)); }, opt);
  TS_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TS_CUDA_CHECK(cudaGraphDestroy(graph));
  return ms / inner;
}

void Sustain(cudaStream_t stream, const std::function<void(int)>& fn, double seconds) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    fn(i);
    if (i % 16 == 15) {
      TS_CUDA_CHECK(cudaStreamSynchronize(stream));
      const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
      if (elapsed.count() >= seconds) return;
    }
  }
}

double CopyMs(cudaStream_t stream, void* dst, const void* src, size_t bytes,
              const TimingOptions& opt) {
  return MedianMs(
      stream,
      [&](int) {
        TS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
      },
      opt);
}

double CopyMs(cudaStream_t stream, size_t bytes, const TimingOptions& opt) {
  DeviceBuffer<char> src(bytes), dst(bytes);
  src.Zero();
  return CopyMs(stream, dst.get(), src.get(), bytes, opt);
}

void FillRandomBf16(uint16_t* out, int64_t n, uint32_t seed, cudaStream_t stream) {
  FillRandomBf16Kernel<<<1024, 256, 0, stream>>>(out, n, seed);
  TS_CUDA_CHECK(cudaGetLastError());
}

void FillRandomFp8(uint8_t* out, int64_t n, uint32_t seed, cudaStream_t stream) {
  FillRandomFp8Kernel<<<1024, 256, 0, stream>>>(out, n, seed);
  TS_CUDA_CHECK(cudaGetLastError());
}

std::vector<int32_t> PagedSlots(int64_t n, int64_t first_slot, std::mt19937* rng) {
  const int64_t pages = (n + 15) / 16;
  std::vector<int32_t> order(static_cast<size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), *rng);
  std::vector<int32_t> slots(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    slots[t] = static_cast<int32_t>(first_slot + order[t / 16] * int64_t{16} + t % 16);
  }
  return slots;
}

ExactSelection::ExactSelection(int64_t n, int64_t k, int64_t num_heads, int64_t num_kv_heads,
                               int64_t head_dim)
    : logits(static_cast<size_t>(n * num_heads)),
      head_max(static_cast<size_t>(num_heads)),
      head_inv_sum(static_cast<size_t>(num_heads)),
      vote(static_cast<size_t>(n)),
      score_workspace(kernels::cuda::ScoreKeysWorkspaceBytes(num_heads)),
      topk_workspace(kernels::cuda::TopKWorkspaceBytes(n)),
      top(static_cast<size_t>(k)) {
  score_workspace.Zero();
  topk_workspace.Zero();
  score.logits = logits.get();
  score.head_max = head_max.get();
  score.head_inv_sum = head_inv_sum.get();
  score.workspace = score_workspace.get();
  score.n = n;
  score.num_heads = num_heads;
  score.num_kv_heads = num_kv_heads;
  score.head_dim = head_dim;
  soft_vote.vote = vote.get();
  soft_vote.logits = logits.get();
  soft_vote.head_max = head_max.get();
  soft_vote.head_inv_sum = head_inv_sum.get();
  soft_vote.n = n;
  soft_vote.num_heads = num_heads;
  top_k.out = top.get();
  top_k.scores = vote.get();
  top_k.workspace = topk_workspace.get();
  top_k.n = n;
  top_k.k = k;
}

cudaError_t ExactSelection::Run(cudaStream_t stream) const {
  const cudaError_t err = kernels::cuda::ScoreKeys(score, stream);
  return err == cudaSuccess ? VoteAndTopK(stream) : err;
}

cudaError_t ExactSelection::VoteAndTopK(cudaStream_t stream, bool vote_histogram) const {
  kernels::cuda::VoteParams vote = soft_vote;
  kernels::cuda::TopKParams top = top_k;
  vote.top_k_workspace = vote_histogram ? top.workspace : nullptr;
  top.histogram_ready = vote_histogram;
  const cudaError_t err = kernels::cuda::VoteFromLogits(vote, stream);
  return err == cudaSuccess ? kernels::cuda::TopK(top, stream) : err;
}

BoundSelection::BoundSelection(const ExactSelection& exact_selection, int64_t top_k)
    : exact(exact_selection),
      workspace(kernels::cuda::BoundVoteWorkspaceBytes(exact_selection.score.n,
                                                       exact_selection.score.num_heads)),
      view(kernels::cuda::CarveBoundVoteWorkspace(workspace.get(), exact_selection.score.n,
                                                  exact_selection.score.num_heads)),
      head_max(static_cast<size_t>(exact_selection.score.num_heads)),
      head_inv_sum(head_max.size()),
      top(static_cast<size_t>(top_k)),
      k(top_k) {
  workspace.Zero();
}

cudaError_t BoundSelection::Run(cudaStream_t stream, int launches, bool list_candidates) const {
  kernels::cuda::BoundVoteParams p;
  p.score = exact.score;
  p.score.head_max = head_max.get();
  p.score.head_inv_sum = head_inv_sum.get();
  p.out = top.get();
  p.k = k;
  p.workspace = workspace.get();
  p.launches = launches;
  p.list_candidates = list_candidates;
  return kernels::cuda::BoundVoteSelect(p, stream);
}

PickComparison ComparePicks(const std::vector<int32_t>& want, const std::vector<int32_t>& got,
                            const std::vector<float>& exact_vote) {
  double kth = 1e300;
  for (int32_t i : want) kth = std::min(kth, double(exact_vote[static_cast<size_t>(i)]));
  std::vector<int32_t> extra;
  std::set_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(extra));
  PickComparison c;
  c.differ = extra.size();
  for (int32_t i : extra) c.beyond_near_tie += exact_vote[static_cast<size_t>(i)] < kth * (1 - 1e-5);
  c.ok = got.size() == want.size() && std::is_sorted(got.begin(), got.end()) &&
         c.beyond_near_tie == 0;
  return c;
}

}  // namespace tokenselect::bench
