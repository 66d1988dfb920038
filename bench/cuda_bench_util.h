// Helpers shared by the CUDA benchmarks (bench/*_cuda_bench.*, nccl_kv_bench.cc): CUDA-event
// timing (median of reps, CUDA-graph replay, optional L2 flush), the device-to-device copy that
// serves as the bandwidth ceiling, device-side random bf16 and FP8 fills, paged slot lists and the exact
// soft-vote selection's buffers. Every helper aborts the run on a
// CUDA error (TS_CUDA_CHECK, tests/gpu/gpu_test_util.h).
#ifndef TOKENSELECT_BENCH_CUDA_BENCH_UTIL_H_
#define TOKENSELECT_BENCH_CUDA_BENCH_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "kernels/cuda/selection.h"
#include "tests/gpu/gpu_test_util.h"

namespace tokenselect::bench {

using gpu_test::DeviceBuffer;

struct TimingOptions {
  int reps = 20;   // timed calls
  int warmup = 3;  // untimed calls first (fn(0) .. fn(warmup - 1))
  // false: every rep is queued before one synchronisation (the GPU never waits on the host);
  // true: each rep is waited for before the next is launched, so a rep's time includes the
  // launch latency between its start event and its first kernel.
  bool sync_each = false;
  // When set, a cudaMemsetAsync of the whole buffer runs before each rep, outside its events,
  // so that each rep starts with a cold L2 (use a buffer a few times the L2 size).
  const DeviceBuffer<char>* l2_flush = nullptr;
};

// Times of opt.reps calls fn(rep), rep = 0 .. reps - 1 (callers rotate inputs by rep), each
// between two CUDA events recorded on `stream`; ms, in rep order.
std::vector<double> EventTimesMs(cudaStream_t stream, const std::function<void(int)>& fn,
                                 const TimingOptions& opt);

// The median (element reps / 2 in sorted order) of EventTimesMs.
double MedianMs(cudaStream_t stream, const std::function<void(int)>& fn, const TimingOptions& opt);

// ms per call of fn when `inner` calls fn(0) .. fn(inner - 1) are captured in one CUDA graph on
// `stream` and the graph's replays are timed with MedianMs(opt): host launch overhead stays
// out, which matters for few-microsecond kernels. fn(0) runs once before the capture (lazy
// initialisation in launchers must not happen inside it).
double GraphMedianMs(cudaStream_t stream, const std::function<void(int)>& fn, int inner,
                     const TimingOptions& opt);

// Calls fn(0), fn(1), ... on `stream` for `seconds` of wall time (a synchronisation every 16
// calls): brings the GPU to the power and clock state of that load before it is timed.
void Sustain(cudaStream_t stream, const std::function<void(int)>& fn, double seconds);

// Median ms of a device-to-device cudaMemcpyAsync of `bytes` from src to dst on `stream`.
double CopyMs(cudaStream_t stream, void* dst, const void* src, size_t bytes,
              const TimingOptions& opt);
// The same between two fresh buffers of `bytes` (freed before it returns).
double CopyMs(cudaStream_t stream, size_t bytes, const TimingOptions& opt);
// A copy's bandwidth counted as bytes read + written: GB/s.
inline double CopyGBs(size_t bytes, double ms) {
  return 2.0 * static_cast<double>(bytes) / ms / 1e6;
}

// Fills out[0, n) with bf16 bits of values in about [-2, 2) from a hash of (index, seed), on the
// device (host generation of GiBs is too slow). The values do not depend on the launch shape.
void FillRandomBf16(uint16_t* out, int64_t n, uint32_t seed, cudaStream_t stream);
// The same for e4m3 codes: magnitudes up to ~8, both signs, never NaN.
void FillRandomFp8(uint8_t* out, int64_t n, uint32_t seed, cudaStream_t stream);

// Slots of a request of n tokens in a paged cache: pages of 16 consecutive slots from
// first_slot on, in an order shuffled with *rng; token t -> page order[t / 16], slot t % 16.
std::vector<int32_t> PagedSlots(int64_t n, int64_t first_slot, std::mt19937* rng);

// The exact selection over n candidates (kernels/cuda/selection.h): ScoreKeys, VoteFromLogits,
// TopK(k), with the buffers it writes owned here. The caller sets score.query, score.k_cache
// and score.slots (and scale or skip flags where needed) before Run.
struct ExactSelection {
  ExactSelection(int64_t n, int64_t k, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim);
  // Enqueues the three launches on `stream`; the first failing launch's error.
  cudaError_t Run(cudaStream_t stream) const;
  // The vote and the top-k of Run: the vote builds the top-k's first histogram, as the engine
  // does on one GPU (VoteParams::top_k_workspace); with vote_histogram false the top-k makes its
  // own, as under tensor parallelism.
  cudaError_t VoteAndTopK(cudaStream_t stream, bool vote_histogram = true) const;

  DeviceBuffer<float> logits, head_max, head_inv_sum, vote;  // [n * heads], [heads] x 2, [n]
  DeviceBuffer<char> score_workspace, topk_workspace;
  DeviceBuffer<int32_t> top;  // [k]: picked candidate indices, ascending
  kernels::cuda::KeyScoreParams score;
  kernels::cuda::VoteParams soft_vote;
  kernels::cuda::TopKParams top_k;
};

// The bound-vote selection (selection.h: BoundVoteSelect) over an ExactSelection's inputs:
// its own workspace (view: its parts, for checks), statistics and picks. `launches` stops after
// that many of the two (benchmarks).
struct BoundSelection {
  BoundSelection(const ExactSelection& exact, int64_t k);
  cudaError_t Run(cudaStream_t stream, int launches = 2, bool list_candidates = false) const;

  const ExactSelection& exact;
  DeviceBuffer<char> workspace;
  kernels::cuda::BoundVoteWorkspace view;
  DeviceBuffer<float> head_max, head_inv_sum;
  DeviceBuffer<int32_t> top;
  int64_t k;
};

// The bound-vote selection's picks (got) against the exact chain's (want), both ascending token
// indices, with the exact chain's votes: how many differ, and how many of those lie beyond a
// near-tie (an exact vote below the exact k-th vote by more than 1e-5 of it). ok: as many picks,
// ascending, none beyond a near-tie.
struct PickComparison {
  size_t differ = 0;
  int beyond_near_tie = 0;
  bool ok = false;
};
PickComparison ComparePicks(const std::vector<int32_t>& want, const std::vector<int32_t>& got,
                            const std::vector<float>& exact_vote);

}  // namespace tokenselect::bench

#endif  // TOKENSELECT_BENCH_CUDA_BENCH_UTIL_H_
