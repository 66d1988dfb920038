// InfLLM selection on the GPU: InfLlmRepresentatives, InfLlmSelect and its workspace
// (span_scoring.h).
//
// Reads the received attention (representatives), then the representatives' keys and the query
// (selection); writes the representative slots, the block scores and the selected set.
//
// InfLLM: InfLlmRepsKernel, one warp per block, reps rounds of a warp arg-max over the block's
// received attention, each round restricted to the tokens ranked after the previous pick.
// Scoring is GroupScoreKernel over the representatives (span_scoring_internal.cuh: one warp per
// block, up to blocks * reps * H_kv * d * 2 bytes of keys); TopK(blocks, k / block_size).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/selection.h"
#include "kernels/cuda/span_scoring.h"
#include "kernels/cuda/span_scoring_internal.cuh"

namespace tokenselect::kernels::cuda {
namespace {

using span_internal::AssembleArgs;
using span_internal::BaseAssemble;
using span_internal::Carver;
using span_internal::Covers;
using span_internal::GridFor;
using span_internal::GroupScoreArgs;
using span_internal::kThreads;
using span_internal::kWarpsPerBlock;
using span_internal::LaunchAssemble;
using span_internal::LaunchGroupScore;
using span_internal::LaunchSelectAll;
using span_internal::NumUnits;
using span_internal::ValidProblem;

__global__ void InfLlmRepsKernel(int32_t* __restrict__ rep_slots,
                                 const float* __restrict__ received, int64_t received_size,
                                 const int32_t* __restrict__ slots, int64_t begin, int64_t end,
                                 int64_t block_size, int64_t reps, int64_t num_blocks) {
  const int lane = threadIdx.x & 31;
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (blk >= num_blocks) return;
  const int64_t b0 = begin + blk * block_size;
  const int64_t b1 = min(end, b0 + block_size);
  const int64_t count = min(reps, b1 - b0);
  float prev_v = 0.0f;
  int64_t prev_t = -1;
  for (int64_t r = 0; r < count; ++r) {
    float best_v = 0.0f;
    int64_t best_t = -1;
    for (int64_t t = b0 + lane; t < b1; t += 32) {
      const float v = t < received_size ? received[t] : 0.0f;
      const bool after = prev_t < 0 || v < prev_v || (v == prev_v && t > prev_t);
      if (after && (best_t < 0 || v > best_v || (v == best_v && t < best_t))) {
        best_v = v;
        best_t = t;
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best_v, off);
      const int64_t ot = __shfl_xor_sync(0xffffffffu, best_t, off);
      if (ot >= 0 && (best_t < 0 || ov > best_v || (ov == best_v && ot < best_t))) {
        best_v = ov;
        best_t = ot;
      }
    }
    if (lane == 0) rep_slots[blk * reps + r] = slots[best_t];
    prev_v = best_v;
    prev_t = best_t;
  }
  for (int64_t r = count + lane; r < reps; r += 32) rep_slots[blk * reps + r] = -1;
}

// ---------------------------------------------------------------------------------------------
// Workspace.

struct InfLlmWorkspace {
  void* topk_ws;
  int32_t* topk_out;
};

InfLlmWorkspace CarveInfLlm(Carver* c, int64_t num_blocks, int64_t k, int64_t block_size) {
  InfLlmWorkspace w;
  w.topk_ws = c->Take<char>(static_cast<int64_t>(TopKWorkspaceBytes(num_blocks)));
  w.topk_out = c->Take<int32_t>(k / block_size);
  return w;
}

}  // namespace

int64_t InfLlmNumBlocks(const SelectionProblem& problem, int64_t block_size) {
  return NumUnits(problem, block_size);
}

cudaError_t InfLlmRepresentatives(const InfLlmRepsParams& p, cudaStream_t stream) {
  const SelectionProblem& pr = p.problem;
  if (pr.num_tokens < 0 || p.block_size <= 0 || p.reps <= 0 || p.received_size < 0 ||
      pr.n_init < 0 || pr.n_local < 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t blocks = InfLlmNumBlocks(pr, p.block_size);
  if (blocks == 0) return cudaSuccess;
  InfLlmRepsKernel<<<GridFor(blocks, kWarpsPerBlock, INT32_MAX), kThreads, 0, stream>>>(
      p.rep_slots, p.received, p.received_size, pr.slots, pr.n_init, pr.num_tokens - pr.n_local,
      p.block_size, p.reps, blocks);
  return cudaGetLastError();
}

size_t InfLlmSelectWorkspaceBytes(int64_t num_blocks, int64_t k, int64_t block_size) {
  Carver c(nullptr);
  CarveInfLlm(&c, num_blocks, k, std::max<int64_t>(block_size, 1));
  return c.used();
}

namespace {

// What both halves of the selection derive from the parameters: the blocks, how many are kept,
// and the workspace's pieces.
struct InfLlmPlan {
  int64_t blocks = 0;
  int64_t keep = 0;
  bool covers = false;
  InfLlmWorkspace w{};
};

cudaError_t PlanInfLlm(const InfLlmSelectParams& p, InfLlmPlan* plan) {
  const SelectionProblem& pr = p.problem;
  if (!ValidProblem(pr) || (pr.kv_type == KvCacheType::kFp8E4M3 && pr.k_scale == nullptr) ||
      p.block_size <= 0 || p.reps <= 0) {
    return cudaErrorInvalidValue;
  }
  plan->covers = Covers(pr);
  if (plan->covers) return cudaSuccess;
  plan->blocks = InfLlmNumBlocks(pr, p.block_size);
  plan->keep = std::min(pr.k / p.block_size, plan->blocks);
  Carver carver(p.workspace);
  plan->w = CarveInfLlm(&carver, plan->blocks, pr.k, p.block_size);
  return cudaSuccess;
}

}  // namespace

cudaError_t InfLlmScoreBlocks(const InfLlmSelectParams& p, cudaStream_t stream) {
  InfLlmPlan plan;
  TS_CUDA_RETURN_IF_ERROR(PlanInfLlm(p, &plan));
  if (plan.covers || plan.keep == 0) return cudaSuccess;
  const SelectionProblem& pr = p.problem;
  GroupScoreArgs g;
  g.scores = p.block_scores;
  g.query = pr.query;
  g.keys = pr.k_cache;
  g.kv_type = pr.kv_type;
  g.k_scale = pr.k_scale;
  g.rep_slots = p.rep_slots;
  g.reps = p.reps;
  g.block_size = p.block_size;
  g.num_groups = plan.blocks;
  g.cand_begin = pr.n_init;
  g.cand_end = pr.num_tokens - pr.n_local;
  g.num_heads = static_cast<int>(pr.num_heads);
  g.num_kv_heads = static_cast<int>(pr.num_kv_heads);
  g.scale = pr.scale;
  return LaunchGroupScore(g, pr.head_dim, stream);
}

cudaError_t InfLlmChooseBlocks(const InfLlmSelectParams& p, cudaStream_t stream) {
  InfLlmPlan plan;
  TS_CUDA_RETURN_IF_ERROR(PlanInfLlm(p, &plan));
  const SelectionProblem& pr = p.problem;
  if (plan.covers) return LaunchSelectAll(p.out, pr.num_tokens, stream);
  AssembleArgs asm_args = BaseAssemble(p.out, pr);
  asm_args.unit = p.block_size;
  if (plan.keep == 0) return LaunchAssemble(asm_args, SelectionCapacity(pr), stream);
  // This workspace needs no initialisation; TopK's part must be zero at launch.
  TS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(plan.w.topk_ws, 0, TopKWorkspaceBytes(0), stream));
  TopKParams tp;
  tp.out = plan.w.topk_out;
  tp.scores = p.block_scores;
  tp.workspace = plan.w.topk_ws;
  tp.n = plan.blocks;
  tp.k = plan.keep;
  TS_CUDA_RETURN_IF_ERROR(TopK(tp, stream));
  asm_args.picks = plan.w.topk_out;
  asm_args.num_picks_host = plan.keep;
  return LaunchAssemble(asm_args, SelectionCapacity(pr), stream);
}

cudaError_t InfLlmSelect(const InfLlmSelectParams& p, cudaStream_t stream) {
  TS_CUDA_RETURN_IF_ERROR(InfLlmScoreBlocks(p, stream));
  return InfLlmChooseBlocks(p, stream);
}

}  // namespace tokenselect::kernels::cuda
