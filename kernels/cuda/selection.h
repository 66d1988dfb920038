// TokenSelect selection on the GPU (docs/DESIGN.md section 4): paged key scoring of the selection
// query, per-head softmax statistics, the head-summed soft vote, and a deterministic top-k.
//
//   ScoreKeys        s[j, h] = scale * q[h, :] . K[slots[j], h / g, :]   (logits: LogitIndex)
//                    plus m[h] = max_j s[j, h] and inv_sum[h] = 1 / sum_j exp(s[j, h] - m[h])
//   VoteFromLogits   vote[j] = sum_h exp(s[j, h] - m[h]) * inv_sum[h]   (soft vote), or
//                    vote[j] = sum_h s[j, h]                              (top-k ablation)
//   TopK             the k best of scores[0, n) by "higher score first, then lower index"
//                    (engine/selection/top_k.h's rule; NaN ranks lowest), ascending by index.
//   BoundVoteSelect  the soft vote's top k (the three above, up to near-ties) without the
//                    logits in memory: for long lists on one GPU (below, bound_vote.cu).
//   SelectionCacheCheck  the selection cache's lookup on the device (engine/selection/
//                    selection_cache.h): hit = cosine(query, cached query) >= theta.
//   PlaceSlice       a rank's query slice amid zeros (the cache check's gather under TP).
//
// Skip flags: ScoreKeys, VoteFromLogits and TopK take an optional device flag `skip`; when it is
// non-null and *skip != 0 the kernels return at once and write nothing (not even workspaces), so
// a graph of check -> score -> vote -> top-k keeps the cached top-k in the TopK output on a hit.
//
// Storage: keys bf16 or FP8 (kv_cache_type.h: dequantized exactly as read), query fp32,
// logits/votes fp32, all accumulation in fp32. ScoreKeys runs on tensor cores for head_dim 128
// and a query-head group of 4 (key_scores_mma.cu: the query split into 16-bit parts, ~fp32
// accurate), else on CUDA cores (key_scores.cu; there FP8 logits equal, bit for bit, those of a
// bf16 cache of the dequantized keys). The launchers take a cudaStream_t, never synchronise, and
// return the first CUDA error (cudaErrorInvalidValue for unsupported shapes: head_dim 64 or 128,
// group size 1, 2, 4 or 8).
// On sm_90+ VoteFromLogits, TopK and ScoreKeys' tensor-core kernel are launched as programmatic
// dependents of the kernel ahead of them (pdl.cuh): their blocks start while it finishes and
// wait for its completion.
//
// Logits layout (LogitIndex): the heads in chunks of 4, each chunk one contiguous [n][4] block
// (the last chunk [n][num_heads % 4] when that is not 0), chunk c at offset 4 c n, n the bound.
// A warp of the tensor-core scoring kernel writes one kv group's 4 heads for 16 consecutive
// tokens: 256 contiguous bytes. With token-major rows (the layout before) each 32-byte sector
// held two kv groups, written in halves by two warps: 1M tokens, 75.5M L2 sector lookups against
// 71.5M now; selection 0.6102 -> 0.6020 ms at 1M, 0.3184 -> 0.3138 at 512K (H200, same call,
// twenty-first session).
//
// Device lengths: ScoreKeys, VoteFromLogits and TopK take an optional `device_n`
// (device_length.h); n is then a bound that sizes the grids and the kernels read the current
// length, so that one captured CUDA graph serves a growing sequence (CudaModel's whole-step
// decode graphs).
#ifndef TOKENSELECT_KERNELS_CUDA_SELECTION_H_
#define TOKENSELECT_KERNELS_CUDA_SELECTION_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/device_length.h"
#include "kernels/cuda/kv_cache_type.h"

namespace tokenselect::kernels::cuda {

// Where logit (token j, head h) of n (the bound) x num_heads logits lives (layout above).
__host__ __device__ inline int64_t LogitIndex(int64_t j, int64_t h, int64_t n, int64_t num_heads) {
  const int64_t chunk = h & ~int64_t{3};
  const int64_t width = num_heads - chunk < 4 ? num_heads - chunk : 4;
  return chunk * n + j * width + (h - chunk);
}

struct KeyScoreParams {
  float* logits = nullptr;              // n * num_heads fp32 (LogitIndex)
  float* head_max = nullptr;            // [num_heads]: max_j logits[j, h]
  float* head_inv_sum = nullptr;        // [num_heads]: 1 / sum_j exp(logits[j, h] - head_max[h])
  const float* query = nullptr;         // [num_heads, head_dim], the selection query
  const void* k_cache = nullptr;        // [num_slots, num_kv_heads, head_dim] of kv_type, un-rotated
  KvCacheType kv_type = KvCacheType::kBf16;
  const float* k_scale = nullptr;       // FP8 only: [num_kv_heads] fp32, device memory
  const int32_t* slots = nullptr;       // [n]: cache slot of candidate j
  // ScoreKeysWorkspaceBytes() bytes, zeroed once after allocation (the kernel leaves it zeroed).
  void* workspace = nullptr;
  int64_t n = 0;                        // a bound when device_n is set
  DeviceLength device_n;                // optional: the current n on the device, >= 1 (0 is read
                                        // as 1: the kernels read at least one key)
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;             // query head h uses kv head h / (num_heads / num_kv_heads)
  int64_t head_dim = 0;
  float scale = 1.0f;
  const int32_t* skip = nullptr;        // optional [1]: when *skip != 0, write nothing
  // Bound-vote mode (tensor-core shapes only: BoundVoteSupported), when vote_bound is
  // set: no logits; instead, once every block has scored its first few tiles (up to 8 steps),
  // the per-head softmax state of those sampled tiles (sample_max / sample_inv_sum, [num_heads])
  // fixes provisional constants C_h, and vote_bound[j] = sum_h exp(logit[j, h] - C_h).
  // head_max / head_inv_sum are written as always (bf16 keys: the same bits as without the
  // mode). With the exact C*_h = head_max - log(head_inv_sum), the exact soft vote of j lies
  // within [vote_bound[j] / max_h a_h, vote_bound[j] / min_h a_h], a_h = exp(C*_h - C_h):
  // BoundVoteSelect's screen turns that into a candidate list. Launched cooperatively.
  float* vote_bound = nullptr;
  // [n]: the largest of j's 32 terms, its head in the low 5 bits (the term rounded down there):
  // the screen bounds that term by its own head's a_h and only the rest by the extremes.
  uint32_t* vote_top = nullptr;
  float* sample_max = nullptr;
  float* sample_inv_sum = nullptr;
};

size_t ScoreKeysWorkspaceBytes(int64_t num_heads);

// One pass over the keys: logits, plus the per-head softmax statistics (per-block partial
// max/sum-exp, combined per group of blocks, then across groups, by the last blocks to finish).
// n == 0 writes nothing.
cudaError_t ScoreKeys(const KeyScoreParams& params, cudaStream_t stream);

enum class VoteMode { kSoftVote, kSumLogits };

struct VoteParams {
  float* vote = nullptr;                // [n]
  const float* logits = nullptr;        // n * num_heads (ScoreKeys; LogitIndex)
  const float* head_max = nullptr;      // [num_heads] (soft vote only)
  const float* head_inv_sum = nullptr;  // [num_heads] (soft vote only)
  int64_t n = 0;                        // a bound when device_n is set
  DeviceLength device_n;                // optional: the current n on the device
  int64_t num_heads = 0;
  VoteMode mode = VoteMode::kSoftVote;
  const int32_t* skip = nullptr;        // optional [1]: when *skip != 0, write nothing
  // Optional: the workspace of the TopK call that ranks these votes next (nothing may change
  // them in between, e.g. no sum across tensor-parallel ranks). The kernel adds the histogram
  // of its votes' first radix digit into it, so that call, with histogram_ready set, skips its
  // first pass over the votes and one grid barrier.
  void* top_k_workspace = nullptr;
};

// Heads are summed in a fixed order, so equal logit rows give bitwise-equal votes.
cudaError_t VoteFromLogits(const VoteParams& params, cudaStream_t stream);

// Per-head softmax statistics of ScoreKeys' logits (the head_max / head_inv_sum it writes) in
// an order fixed by n alone, not by the head count or the grid (head_stats.cu): TP-invariant
// numerics run it after ScoreKeys, so that one GPU and every tensor-parallel rank vote from the
// same bits. Two launches; the workspace needs no initialisation.
struct HeadStatsParams {
  float* head_max = nullptr;      // [num_heads] (out)
  float* head_inv_sum = nullptr;  // [num_heads] (out)
  const float* logits = nullptr;  // n * num_heads (ScoreKeys; LogitIndex)
  void* workspace = nullptr;      // HeadSoftmaxStatsWorkspaceBytes(n, num_heads)
  int64_t n = 0;                  // a bound when device_n is set
  DeviceLength device_n;
  int64_t num_heads = 0;          // up to 512
  const int32_t* skip = nullptr;  // optional [1]: when *skip != 0, write nothing
};

size_t HeadSoftmaxStatsWorkspaceBytes(int64_t n, int64_t num_heads);
cudaError_t HeadSoftmaxStats(const HeadStatsParams& params, cudaStream_t stream);

struct TopKParams {
  int32_t* out = nullptr;               // [min(k, n)] indices, ascending
  const float* scores = nullptr;        // [n]
  // TopKWorkspaceBytes() bytes, 16-byte aligned, zeroed once after allocation (the kernel leaves
  // it zeroed).
  void* workspace = nullptr;
  int64_t n = 0;                        // up to 2^31 - 1; a bound when device_n is set
  DeviceLength device_n;                // optional: the current n on the device
  int64_t k = 0;
  const int32_t* skip = nullptr;        // optional [1]: when *skip != 0, write nothing
  // The first digit's histogram of these scores is in the workspace already: the votes' own,
  // added by the VoteFromLogits call with this workspace as top_k_workspace, with the same n,
  // device_n and skip. (The call clears it, as every call leaves the workspace zeroed.)
  bool histogram_ready = false;
};

size_t TopKWorkspaceBytes(int64_t n);

// Radix select on the order-preserving 32-bit image of the scores (a 12-bit digit, then two of
// 10 bits: over the few keys of the chosen top bin in every block when it holds at most 8192,
// else over all keys), then a stable compaction: every score above the k-th best wins, plus the
// first (by index) of those equal to it. Deterministic; one cooperative launch with grid-wide
// barriers (at most one block per SM), no host synchronisation. Capturable in a CUDA graph.
cudaError_t TopK(const TopKParams& params, cudaStream_t stream);

// The bound-vote soft-vote selection (bound_vote.cu): the top k of VoteFromLogits' soft votes,
// as ScoreKeys -> VoteFromLogits -> TopK would pick them (the same picks up to near-ties: the
// candidates' logits are fp32 dots, not the tensor-core kernel's bits), without writing or
// reading the n x num_heads fp32 logits. Two launches:
//   1. ScoreKeys in bound mode (KeyScoreParams::vote_bound): per token 8 bytes of vote bounds,
//      and head_max / head_inv_sum as always;
//   2. the screen (bound_vote.cu): with a_h as in KeyScoreParams::vote_bound (from the sample's
//      and the full statistics) each token's exact soft vote lies between a lower and an upper
//      bound (its top term over its own head's a_h, the rest over the extremes). With T the k-th
//      largest lower bound, every token whose upper bound reaches T is a candidate: every token
//      of the exact soft vote's top k (ties included) is one. Degenerate statistics (not
//      finite) make every token one. The candidates are scored exactly (candidate_vote.cuh:
//      fp32 dots on CUDA cores, then VoteFromLogits' arithmetic) and the top k of those votes
//      written as token indices (ascending).
// Cheaper than the plain chain only for long lists (kBoundVoteMinCandidates); tensor-core
// shapes only (BoundVoteSupported). Both kernels are cooperative. skip and device_n as
// elsewhere.
struct BoundVoteParams {
  // The inputs as for ScoreKeys (query, keys, slots, n, device_n, shape, scale, skip), and
  // head_max / head_inv_sum, written as ScoreKeys writes them. Its logits, workspace and
  // bound-mode fields are not read: the workspace below holds their place.
  KeyScoreParams score;
  int32_t* out = nullptr;               // [min(k, n)]: picked token indices, ascending
  int64_t k = 0;
  // BoundVoteWorkspaceBytes(score.n, score.num_heads) bytes, zeroed once after allocation (the
  // launches leave its counters zeroed). Its parts: BoundVoteWorkspace.
  void* workspace = nullptr;
  // Benchmarks: 1 stops after the scoring. The bounds, stored evict_last in L2 for the screen
  // to read and discard, then stay there until overwritten (l2_policy.cuh).
  int launches = 2;
  // Checks: afterwards the workspace's cand_index / cand_vote [0, *count) hold the candidates
  // in index order with their votes (a few microseconds more; *count is always written).
  bool list_candidates = false;
};

// The workspace's parts (CarveBoundVoteWorkspace): the bounds, the candidate list and votes.
struct BoundVoteWorkspace {
  void* score_workspace;   // ScoreKeysWorkspaceBytes
  void* top_k_workspace;   // TopKWorkspaceBytes: the screen's radix select
  // [n] each: KeyScoreParams::vote_bound / vote_top, then the screen's scratch; undefined after
  // the screen (it discards their L2 lines unwritten).
  float* bound;
  uint32_t* top_term;
  float* sample_max;       // [num_heads]
  float* sample_inv_sum;   // [num_heads]
  // [n] each: the candidates, their cache slots and votes, by the screen's blocks' ranges;
  // with BoundVoteParams::list_candidates cand_index / cand_vote [0, *count) in index order.
  int32_t* cand_index;
  int32_t* cand_slots;
  float* cand_vote;
  int32_t* count;          // [1]: the candidates
};

// Where the engine switches to it (CudaSelectionAttention::Create). Selection alone against the
// plain chain (bench_kernels_cuda --quick --crossover, thirtieth session's screen): at 512K
// faster on an H100 (0.4181 / 0.4395 ms) and on an H200 (0.3041 / 0.3072); at 768K (0.5960 /
// 0.6458, 0.4244 / 0.4492) and 1M (0.7759 / 0.8530, 0.5520 / 0.5882) by more. At 128K and below
// it is slower (32K, twenty-ninth session: 0.116 against 0.050 ms). Between them (thirty-first
// session, same bench): at 256K slower on both (H100 0.2337 / 0.2306, H200 0.1800 / 0.1682), at
// 384K faster on an H100 (0.3246 / 0.3350) but slower on an H200 (0.2417 / 0.2399): the
// threshold was 512K. (The twenty-ninth session's screen was equal at 512K on an H100, slower on
// an H200: the threshold was 768K.) Thirty-second session, with the bounds kept in L2
// (l2_policy.cuh): at 384K faster on both (H100 0.3071 / 0.3353, H200 0.2238 / 0.2367), at 256K
// faster on an H100 (0.2208 / 0.2306) and equal on an H200 (0.1663 / 0.1663), at 128K slower on
// both (0.1325 / 0.1269, 0.1070 / 0.0955): the threshold was 384K. Thirty-third session,
// bench_fp8_kv_cuda (both cache types, plain / bound): at 320K faster on both GPUs with bf16 keys
// (H100 0.2879 / 0.2631, H200 0.2097 / 0.1983) and FP8 keys (0.1823 / 0.1672, 0.1419 / 0.1380),
// at 256K equal with FP8 keys on an H200 (0.1161 / 0.1179, 0.1158 / 0.1160), at 192K slower
// with FP8 keys on both: the threshold is 320K.
constexpr int64_t kBoundVoteMinCandidates = 320 * 1024;

size_t BoundVoteWorkspaceBytes(int64_t n, int64_t num_heads);
BoundVoteWorkspace CarveBoundVoteWorkspace(void* workspace, int64_t n, int64_t num_heads);
bool BoundVoteSupported(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim);
cudaError_t BoundVoteSelect(const BoundVoteParams& params, cudaStream_t stream);

// The hard head vote (engine/selection/head_vote.h's HeadVote, the TokenSelect ablation) from
// ScoreKeys' logits, around TopK (head_vote.cu): for each head h, HeadLogitColumn copies its
// logits into a row and TopK picks its k best, which AddHeadVotes counts; VoteFromLogits
// (kSumLogits) gives the summed logits; HeadVoteRankScores turns counts and sums into one row
// that TopK ranks as HeadVote does: with c* the largest count that at least min(k, n)
// candidates reach, +inf where count > c* (fewer than k: all win), the summed logit where
// count == c* (the best of them win, ties to the lower index), -inf below.
struct HeadColumnParams {
  float* column = nullptr;        // [n]: logits[j, head]
  const float* logits = nullptr;  // ScoreKeys' (LogitIndex at the bound n)
  int64_t n = 0;                  // a bound when device_n is set
  DeviceLength device_n;
  int64_t num_heads = 0;
  int64_t head = 0;
  const int32_t* skip = nullptr;  // optional [1]: when *skip != 0, write nothing
};
cudaError_t HeadLogitColumn(const HeadColumnParams& params, cudaStream_t stream);

struct HeadVoteCountParams {
  float* counts = nullptr;         // [n]: += 1 at every pick
  const int32_t* picks = nullptr;  // [min(k, n)] distinct (TopK's)
  int64_t n = 0;                   // a bound when device_n is set
  DeviceLength device_n;
  int64_t k = 0;
  const int32_t* skip = nullptr;
};
cudaError_t AddHeadVotes(const HeadVoteCountParams& params, cudaStream_t stream);

struct HeadVoteRankParams {
  float* ranked = nullptr;        // [n] (out)
  int32_t* histogram = nullptr;   // [max_votes + 1] scratch (cleared by the call)
  const float* counts = nullptr;  // [n] votes per candidate (summed over every rank's heads)
  const float* summed = nullptr;  // [n] summed logits (the same)
  int64_t n = 0;                  // a bound when device_n is set
  DeviceLength device_n;
  int64_t k = 0;
  int64_t max_votes = 0;  // the head count over all ranks, up to 4096
  const int32_t* skip = nullptr;
};
cudaError_t HeadVoteRankScores(const HeadVoteRankParams& params, cudaStream_t stream);

struct CacheCheckParams {
  int32_t* hit = nullptr;           // [1] out: 1 when *cached_valid and cosine(query, cached_query)
                                    // >= theta, else 0
  float* cached_query = nullptr;    // [dim]: the entry; overwritten with query on a miss
  int32_t* cached_valid = nullptr;  // [1]: 0 until the first miss stores an entry, then 1
  const float* query = nullptr;     // [dim] fp32 (the selection query, flattened over heads)
  int64_t dim = 0;
  float theta = 0.9f;
};

// One launch (one block), no host synchronisation: cosine in double (a.b / (|a| |b|), clamped to
// [-1, 1], 0 when either vector is zero; a NaN cosine misses), then on a miss the entry is
// replaced by the query and marked valid. The caller zeroes *cached_valid once per request and
// layer. theta = -1 hits on every check after the first; theta > 1 never hits. Invalid value for
// dim <= 0 or null pointers.
cudaError_t SelectionCacheCheck(const CacheCheckParams& params, cudaStream_t stream);

// dst[0, dim) = zeros around src[0, len) placed at [offset, offset + len): under tensor
// parallelism a rank's slice of the selection query, which an all-reduce of every rank's copy
// turns into the whole query for the cache check. One launch (in a step graph one node, where a
// memset and a copy were two). Invalid value for null pointers, len < 0, offset < 0 or
// offset + len > dim.
cudaError_t PlaceSlice(float* dst, int64_t dim, const float* src, int64_t offset, int64_t len,
                       cudaStream_t stream);

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_SELECTION_H_
