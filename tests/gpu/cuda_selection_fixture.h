// The fixture of the GPU selection provider's tests (cuda_selection_test.cc,
// cuda_cascade_test.cc): a scrambled-slot cache of bf16-valued random keys, the GPU provider's
// and the CPU oracle's lists for the same steps, and the stateful-policy drivers.
#ifndef TOKENSELECT_TESTS_GPU_CUDA_SELECTION_FIXTURE_H_
#define TOKENSELECT_TESTS_GPU_CUDA_SELECTION_FIXTURE_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/model/cuda_attention.h"
#include "engine/selection/attention_list.h"
#include "engine/selection/chunk_attention.h"
#include "engine/selection/cuda_selection.h"
#include "engine/selection/layer_state.h"
#include "engine/selection/selection_cache.h"
#include "engine/selection/selection_policy.h"
#include "engine/selection/selection_query.h"
#include "kernels/ops.h"
#include "tests/gpu/gpu_test_util.h"

namespace tokenselect::engine::gpu_selection_test {

using gpu_test::DeviceBuffer;
using gpu_test::RoundBf16;

inline const __nv_bfloat16* AsBf16(const DeviceBuffer<uint16_t>& bits) {
  return reinterpret_cast<const __nv_bfloat16*>(bits.get());
}

struct Shape {
  int64_t heads, kv_heads, head_dim;
};

class CudaSelectionTest : public ::testing::TestWithParam<Shape> {
 public:
  const ModelConfig& config() const { return config_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  const std::vector<float>& keys() const { return k_; }
  const std::vector<int32_t>& slots() const { return slots_; }
  int64_t num_slots() const { return num_slots_; }

  // A sequence of `total` tokens in scrambled slots with bf16-valued random keys.
  void SetUpCache(int64_t total, std::mt19937* rng) {
    const Shape s = GetParam();
    config_.num_layers = 2;
    config_.num_heads = s.heads;
    config_.num_kv_heads = s.kv_heads;
    config_.head_dim = s.head_dim;
    config_.hidden_size = s.heads * s.head_dim;
    num_slots_ = total + 37;
    std::vector<int32_t> perm(static_cast<size_t>(num_slots_));
    for (int64_t i = 0; i < num_slots_; ++i) perm[i] = static_cast<int32_t>(i);
    std::shuffle(perm.begin(), perm.end(), *rng);
    slots_.assign(perm.begin(), perm.begin() + total);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    k_.resize(static_cast<size_t>(num_slots_ * s.kv_heads * s.head_dim));
    for (float& x : k_) x = RoundBf16(normal(*rng));
    iota_.resize(static_cast<size_t>(total + 2));
    for (size_t i = 0; i < iota_.size(); ++i) iota_[i] = static_cast<int32_t>(i);
    kernels::RopeParams rope;
    rope.head_dim = s.head_dim;
    inv_freq_ = kernels::RopeInverseFrequencies(rope);
    d_k_ = DeviceBuffer<uint16_t>(gpu_test::ToBf16Bits(k_));
    d_slots_ = DeviceBuffer<int32_t>(slots_);
    d_iota_ = DeviceBuffer<int32_t>(iota_);
    d_inv_freq_ = DeviceBuffer<float>(inv_freq_);
  }

  // Runs the GPU provider for `num_new` query rows after `cached` tokens; returns the list.
  AttentionList RunGpu(CudaSelectionAttention* provider, int64_t layer, int64_t cached,
                       const std::vector<float>& q, int64_t num_new) {
    d_q_ = DeviceBuffer<uint16_t>(gpu_test::ToBf16Bits(q));
    CudaAttentionQuery query;
    query.layer = layer;
    query.cache_length = cached;
    query.num_new = num_new;
    query.q = AsBf16(d_q_);
    query.q_row_stride = config_.num_heads * config_.head_dim;
    query.k_cache = AsBf16(d_k_);
    query.token_slots = d_slots_.get();
    query.iota = d_iota_.get();
    query.inv_freq = d_inv_freq_.get();
    query.config = &config_;
    CudaAttentionList list;
    const absl::Status st = provider->Select(query, &list);
    EXPECT_TRUE(st.ok()) << st;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<int32_t> indptr = gpu_test::DownloadFrom(list.kv_indptr, 2);
    EXPECT_LE(indptr[1], list.max_kv_len);
    AttentionList out;
    out.kv_slots = gpu_test::DownloadFrom(list.kv_indices, indptr[1]);
    out.kv_positions = gpu_test::DownloadFrom(list.kv_positions, indptr[1]);
    out.q_positions = gpu_test::DownloadFrom(list.q_positions, num_new);
    out.visible = gpu_test::DownloadFrom(list.visible, num_new);
    return out;
  }

  SelectionInput CpuInput(const std::vector<float>& query, int64_t cached) const {
    SelectionInput in;
    in.query = query.data();
    in.num_heads = config_.num_heads;
    in.keys.k_cache = k_.data();
    in.keys.slots = slots_.data();
    in.keys.num_tokens = cached;
    in.keys.num_slots = num_slots_;
    in.keys.num_kv_heads = config_.num_kv_heads;
    in.keys.head_dim = config_.head_dim;
    return in;
  }

  std::vector<float> RandomQ(int64_t rows, std::mt19937* rng) const {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> q(static_cast<size_t>(rows * config_.num_heads * config_.head_dim));
    for (float& x : q) x = RoundBf16(normal(*rng));
    return q;
  }

  // Entries that differ between two lists (a near-tie flip changes one pick: two entries).
  static int64_t Mismatches(const AttentionList& a, const AttentionList& b) {
    if (a.kv_slots.size() != b.kv_slots.size() || a.q_positions != b.q_positions ||
        a.visible != b.visible || a.kv_positions != b.kv_positions) {
      return 1 << 30;
    }
    std::vector<int32_t> x = a.kv_slots, y = b.kv_slots;
    std::sort(x.begin(), x.end());
    std::sort(y.begin(), y.end());
    std::vector<int32_t> diff;
    std::set_symmetric_difference(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(diff));
    return static_cast<int64_t>(diff.size());
  }

 protected:
  ModelConfig config_;
  int64_t num_slots_ = 0;
  std::vector<int32_t> slots_, iota_;
  std::vector<float> k_, inv_freq_;
  DeviceBuffer<uint16_t> d_k_, d_q_;  // bf16 bits
  DeviceBuffer<int32_t> d_slots_, d_iota_;
  DeviceBuffer<float> d_inv_freq_;
};

// A policy and its budget, prefill chunks of `chunk` tokens.
inline SelectionOptions TestOptions(SelectionPolicyKind policy, int64_t n_init, int64_t k,
                                    int64_t n_local, int64_t chunk) {
  SelectionOptions opt;
  opt.policy = policy;
  opt.n_init = n_init;
  opt.k = k;
  opt.n_local = n_local;
  opt.chunk_size = chunk;
  return opt;
}

// The CPU policy's ObserveChunk of a step of m new tokens after `cached` (queries q), at the
// model's attention scale (what SelectionAttention gives it).
absl::Status ObserveOnCpu(const SelectionPolicy& policy, const CudaSelectionTest& t, int64_t layer,
                          int64_t cached, const std::vector<float>& q, int64_t m,
                          SelectionLayerState* state);

// A stateful policy over a prompt in chunks and then decode steps, on the GPU provider and on
// the CPU policy (its Select - through a SelectionCache on decode steps when the policy uses one
// - then ObserveChunk of the step, as SelectionAttention calls them); each step's list must
// equal the CPU's up to `tolerance` entries (a near-tie flip), and the steps that differ are
// counted. Queries are random, except with drift > 0, where each layer's decode query drifts
// from step to step (by drift, and 6 x drift every fifth step) so that the cache both hits and
// misses at theta 0.9.
struct StatefulRun {
  std::unique_ptr<CudaSelectionAttention> provider;
  std::vector<SelectionLayerState> cpu_state;
  SelectionCacheCounters cpu_cache;
  int64_t flips = 0, selecting = 0;
};

StatefulRun RunStatefulSteps(CudaSelectionTest* t, const SelectionOptions& opt, int64_t chunk,
                             int64_t prompt, int64_t steps, int64_t total, int64_t tolerance,
                             std::mt19937* rng, float drift = 0.0f);

// A second provider made from the first's exported state (a decode worker's) selects as the
// first at the next step, and exports the same state.
void ExpectStateCarriesOver(CudaSelectionTest* t, const SelectionOptions& opt,
                            CudaSelectionAttention* first, int64_t total, int64_t chunk,
                            int64_t cached, std::mt19937* rng);

// Worst |gpu - cpu| / (1 + cpu) of the exported received attention against the CPU policy's.
double WorstReceived(const std::vector<SelectionLayerState>& gpu,
                     const std::vector<SelectionLayerState>& cpu, int64_t tokens);

// "" when two cascading caches hold the same tokens with scores within `tolerance` (relative;
// 0: bitwise), the same offer counters and next token; else what differs first.
std::string CascadeDifference(const CascadeCache& got, const CascadeCache& want, double tolerance);

}  // namespace tokenselect::engine::gpu_selection_test

#endif  // TOKENSELECT_TESTS_GPU_CUDA_SELECTION_FIXTURE_H_
