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
  if (p.n < 0 || p.k < 0 || p.out == nullptr || p.head_max == nullptr ||
      p.head_inv_sum == nullptr || p.workspace == nullptr ||
      !BoundVoteSupported(p.num_heads, p.num_kv_heads, p.head_dim)) {
    return cudaErrorInvalidValue;
  }
  if (p.n == 0 || p.k == 0) return cudaSuccess;
  const BoundVoteWorkspace w = CarveBoundVoteWorkspace(p.workspace, p.n, p.num_heads);
  KeyScoreParams sp;
  sp.head_max = p.head_max;
  sp.head_inv_sum = p.head_inv_sum;
  sp.query = p.query;
  sp.k_cache = p.k_cache;
  sp.kv_type = p.kv_type;
  sp.k_scale = p.k_scale;
  sp.slots = p.slots;
  sp.workspace = w.score_workspace;
  sp.n = p.n;
  sp.device_n = p.device_n;
  sp.num_heads = p.num_heads;
  sp.num_kv_heads = p.num_kv_heads;
  sp.head_dim = p.head_dim;
  sp.scale = p.scale;
  sp.skip = p.skip;
  sp.vote_bound = w.bound;
  sp.vote_top = w.top_term;
  sp.sample_max = w.sample_max;
  sp.sample_inv_sum = w.sample_inv_sum;
  TS_CUDA_RETURN_IF_ERROR(ScoreKeys(sp, stream));
  if (p.launches < 2) return cudaSuccess;
  TopKParams screen;
  screen.scores = w.bound;
  screen.workspace = w.top_k_workspace;
  screen.n = p.n;
  screen.device_n = p.device_n;
  screen.k = p.k;
  screen.skip = p.skip;
  TopKParams::Screen& sc = screen.screen;
  sc.cand_index = w.cand_index;
  sc.cand_slots = w.cand_slots;
  sc.count = w.count;
  sc.slots = p.slots;
  sc.top_term = w.top_term;
  sc.sample_max = w.sample_max;
  sc.sample_inv_sum = w.sample_inv_sum;
  sc.head_max = p.head_max;
  sc.head_inv_sum = p.head_inv_sum;
  sc.num_heads = p.num_heads;
  sc.cand_vote = w.cand_vote;
  sc.query = p.query;
  sc.k_cache = p.k_cache;
  sc.kv_type = p.kv_type;
  sc.k_scale = p.k_scale;
  sc.num_kv_heads = p.num_kv_heads;
  sc.scale = p.scale;
  screen.out = p.out;  // the picks too (one block, after a grid barrier)
  return TopK(screen, stream);
}

}  // namespace tokenselect::kernels::cuda
