// BoundVoteSelect (selection.h): the bound-vote selection's two launches over one workspace.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/selection.h"

namespace tokenselect::kernels::cuda {
namespace {

constexpr size_t kAlign = 256;

size_t Round(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

size_t BoundVoteWorkspaceBytes(int64_t n, int64_t num_heads) {
  const size_t per_token = Round(static_cast<size_t>(n) * 4);
  return Round(ScoreKeysWorkspaceBytes(num_heads)) + Round(TopKWorkspaceBytes(n)) +
         5 * per_token + 2 * Round(static_cast<size_t>(num_heads) * 4) + kAlign;
}

BoundVoteWorkspace CarveBoundVoteWorkspace(void* workspace, int64_t n, int64_t num_heads) {
  char* at = static_cast<char*>(workspace);
  auto take = [&](size_t bytes) {
    char* p = at;
    at += Round(bytes);
    return p;
  };
  const size_t per_token = static_cast<size_t>(n) * 4;
  const size_t per_head = static_cast<size_t>(num_heads) * 4;
  BoundVoteWorkspace w;
  w.score_workspace = take(ScoreKeysWorkspaceBytes(num_heads));
  w.top_k_workspace = take(TopKWorkspaceBytes(n));
  w.bound = reinterpret_cast<float*>(take(per_token));
  w.top_term = reinterpret_cast<uint32_t*>(take(per_token));
  w.cand_index = reinterpret_cast<int32_t*>(take(per_token));
  w.cand_slots = reinterpret_cast<int32_t*>(take(per_token));
  w.cand_vote = reinterpret_cast<float*>(take(per_token));
  w.sample_max = reinterpret_cast<float*>(take(per_head));
  w.sample_inv_sum = reinterpret_cast<float*>(take(per_head));
  w.count = reinterpret_cast<int32_t*>(take(sizeof(int32_t)));
  return w;
}

cudaError_t BoundVoteSelect(const BoundVoteParams& p, cudaStream_t stream) {
  const KeyScoreParams& in = p.score;
  if (in.n < 0 || p.k < 0 || p.out == nullptr || in.head_max == nullptr ||
      in.head_inv_sum == nullptr || p.workspace == nullptr ||
      !BoundVoteSupported(in.num_heads, in.num_kv_heads, in.head_dim)) {
    return cudaErrorInvalidValue;
  }
  if (in.n == 0 || p.k == 0) return cudaSuccess;
  const BoundVoteWorkspace w = CarveBoundVoteWorkspace(p.workspace, in.n, in.num_heads);
  KeyScoreParams sp = in;
  sp.logits = nullptr;
  sp.workspace = w.score_workspace;
  sp.vote_bound = w.bound;
  sp.vote_top = w.top_term;
  sp.sample_max = w.sample_max;
  sp.sample_inv_sum = w.sample_inv_sum;
  TS_CUDA_RETURN_IF_ERROR(ScoreKeys(sp, stream));
  if (p.launches < 2) return cudaSuccess;
  TopKParams screen;
  screen.out = p.out;
  screen.scores = w.bound;
  screen.workspace = w.top_k_workspace;
  screen.n = sp.n;
  screen.device_n = sp.device_n;
  screen.k = p.k;
  screen.skip = sp.skip;
  TopKParams::Screen& sc = screen.screen;
  sc.cand_index = w.cand_index;
  sc.cand_slots = w.cand_slots;
  sc.count = w.count;
  sc.cand_vote = w.cand_vote;
  sc.top_term = w.top_term;
  sc.sample_max = w.sample_max;
  sc.sample_inv_sum = w.sample_inv_sum;
  sc.keys = sp;
  return TopK(screen, stream);
}

}  // namespace tokenselect::kernels::cuda
