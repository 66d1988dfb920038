// Coarse-to-fine selection on the GPU: the span index policy (tokenselect_span) and the Quest and
// InfLLM baselines (docs/DESIGN.md section 4, docs/selection.md). Each launcher reproduces its
// CPU policy in engine/selection/ (span_policy.cc, quest_policy.cc, infllm_policy.cc) and writes
// the selected token set [0, n_init) + picks + [N - n_local, N), ascending, to device memory;
// only near-ties of scores (fp32 on the GPU, double on the CPU) may order differently.
//
//   SpanSelect        span score = sum_h max_v scale * q_h . K[slot(v), h / g] over the span's
//                     index tokens v (ScoreKeys over every index token, then a warp per span
//                     takes the per-head maxima and their sum); spans best first (higher score,
//                     then lower index) kept while their candidate tokens fit the token budget (one
//                     that does not fit is skipped); + the unindexed spans and the tokens past
//                     covered_end; then the exact soft vote (ScoreKeys, VoteFromLogits, TopK of
//                     selection.h) over the kept tokens only.
//   QuestBuildPageBounds / QuestSelect   per page of page_size candidates (from n_init) and
//                     channel the key min and max; bound = scale * sum_h sum_i max(q_h,i min_i,
//                     q_h,i max_i); pages best first while they fit into k tokens.
//   InfLlmRepresentatives / InfLlmSelect   per block of block_size candidates its R tokens with
//                     the most received attention (ties: lower index); block score = sum_h max_r
//                     scale * q_h . K[r, h / g]; the top k / block_size blocks.
//
// Storage as in selection.h: keys bf16 [num_slots, num_kv_heads, head_dim] (un-rotated), query
// fp32 [num_heads, head_dim], scores fp32. An FP8 cache (kv_cache_type.h) is read by Quest's page
// bounds (bounds of the dequantized keys, bit for bit those of a bf16 cache holding them) and by
// InfLlmSelect, SpanSelect and ChunkReceivedAttention (dequantized in registers: the same results
// as over a bf16 cache holding the dequantized keys). Launchers take a cudaStream_t, never
// synchronise, and return the first CUDA error; cudaErrorInvalidValue for unsupported shapes
// (head_dim 64 or 128, group size 1, 2, 4 or 8) or inconsistent sizes. Outputs whose length is only
// known on the device come with a device-side count. When n_init + k + n_local >= N every launcher
// selects [0, N) without reading a key, as the CPU policies do.
#ifndef TOKENSELECT_KERNELS_CUDA_SPAN_SCORING_H_
#define TOKENSELECT_KERNELS_CUDA_SPAN_SCORING_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/kv_cache_type.h"

namespace tokenselect::kernels::cuda {

// What every selection launcher shares: the request's keys of one layer and the budget.
struct SelectionProblem {
  const float* query = nullptr;            // [num_heads, head_dim], the selection query
  const void* k_cache = nullptr;           // [num_slots, num_kv_heads, head_dim] of kv_type
  KvCacheType kv_type = KvCacheType::kBf16;
  const float* k_scale = nullptr;          // FP8 only: [num_kv_heads] fp32, device memory
  const int32_t* slots = nullptr;          // [num_tokens]: cache slot of token t
  int64_t num_tokens = 0;                  // N
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;
  int64_t n_init = 0;
  int64_t k = 0;
  int64_t n_local = 0;
};

// The selected set: tokens[0, *num_selected) ascending. tokens has room for
// SelectionCapacity(problem) entries; entries past the count are not written.
struct SelectionOutput {
  int32_t* tokens = nullptr;
  int32_t* num_selected = nullptr;  // [1]
};

// min(N, n_init + k + n_local): the most tokens any launcher here writes.
int64_t SelectionCapacity(const SelectionProblem& problem);

// ---------------------------------------------------------------------------------------------
// tokenselect_span.

// The span index of one request and layer in device memory (engine/selection/span_index.h as
// CSR): spans ascending by begin, token ranges [begin, end); span i owns the index tokens
// vector_tokens[vector_indptr[i], vector_indptr[i + 1]) (token positions, ascending; their keys
// are K[slots[token]]). A span without index tokens holds tokens the index never observed.
struct SpanIndexView {
  const int32_t* span_begin = nullptr;     // [num_spans]
  const int32_t* span_end = nullptr;       // [num_spans]
  const int32_t* vector_indptr = nullptr;  // [num_spans + 1]
  const int32_t* vector_tokens = nullptr;  // [vector_indptr[num_spans]]
  int64_t num_spans = 0;
  int64_t num_vectors = 0;  // vector_indptr[num_spans], as the host knows it
  int64_t covered_end = 0;  // tokens at or after it belong to no span
};

struct SpanSelectParams {
  SelectionOutput out;
  // Diagnostics, all written: span_scores[i] is span i's score, NaN when it was not scored
  // (outside the candidates, no index tokens, or an index token >= N); kept_tokens[0, m) the
  // kept candidate tokens ascending (-1 up to max_kept); kept_votes[0, m) their soft votes
  // (their top-k is the picks); num_kept[0] = m.
  float* span_scores = nullptr;  // [num_spans]
  int32_t* kept_tokens = nullptr;  // [max_kept]
  float* kept_votes = nullptr;     // [max_kept]
  int32_t* num_kept = nullptr;     // [1]
  SelectionProblem problem;
  SpanIndexView index;
  int64_t token_budget = 0;  // SpanTokenBudget(options): span tokens passed to the soft vote
  // An upper bound on the kept tokens m, SpanMaxKept() of the host copy of the index: the soft
  // vote runs over max_kept entries, the ones past m masked out (so that nothing waits for m on
  // the host). A smaller value than the true m truncates the kept list (num_kept says so).
  int64_t max_kept = 0;
  void* workspace = nullptr;  // SpanSelectWorkspaceBytes(); no initialisation needed
  // Optional [1] (a selection-cache hit, SelectionCacheCheck): when *skip != 0 no key is read and
  // the selected set is not written (the diagnostics are then unspecified); the sort still runs
  // (CUB takes its length from the host), over the workspace as it is.
  const int32_t* skip = nullptr;
};

// The bound for max_kept from host copies of the index arrays: min(candidates, token_budget +
// the candidate tokens of spans without index tokens + those at or after covered_end).
int64_t SpanMaxKept(const int32_t* span_begin, const int32_t* span_end,
                    const int32_t* vector_indptr, int64_t num_spans, int64_t covered_end,
                    int64_t num_tokens, int64_t n_init, int64_t n_local, int64_t token_budget);

size_t SpanSelectWorkspaceBytes(int64_t num_spans, int64_t num_vectors, int64_t max_kept,
                                int64_t num_heads, int64_t k);

// About 20 launches, no host synchronisation: span scores; a stable radix sort of the spans by
// score (CUB); one block takes spans in that order to the budget and builds the kept token
// ranges in index order (overlaps merged); the kept list; ScoreKeys over it; soft-vote
// statistics over the first m entries; VoteFromLogits; TopK; the output.
cudaError_t SpanSelect(const SpanSelectParams& params, cudaStream_t stream);

// SpanSelect in three parts, for tensor parallelism (docs/parallel.md), where a rank holds only
// its heads (as QuestScorePages / QuestChoosePages):
//   SpanScoreSpans   span_scores: this rank's heads' share of each span's score;
//                    the caller sums span_scores[0, num_spans) over the ranks;
//   SpanVoteKept     the span choice from the summed scores, the kept list and kept_votes: this
//                    rank's heads' share of each kept token's soft vote (each head's softmax is
//                    the head's own); the caller sums kept_votes[0, max_kept) over the ranks;
//   SpanPickTokens   the top k of the summed votes and the selected set.
// With a covering budget or k = 0 the first two do nothing and the sums are not needed. Every
// part honours skip. SpanSelect is the three in a row, minus the sums (and the first part's sort
// entries stand, where SpanVoteKept derives them from the summed scores).
cudaError_t SpanScoreSpans(const SpanSelectParams& params, cudaStream_t stream);
cudaError_t SpanVoteKept(const SpanSelectParams& params, cudaStream_t stream);
cudaError_t SpanPickTokens(const SpanSelectParams& params, cudaStream_t stream);

// The selection cache (selection.h's SelectionCacheCheck) for the launchers here, whose picks'
// count is known on the device only: the entry is the picks (the selected set's tokens in
// [n_init, N - n_local) when it was stored, as offsets from n_init, ascending: selection.h's
// picks). A lookup runs SelectionCacheCheck, then
// the launcher with skip = the hit flag, then ApplySelectionCache:
//   - a miss (*hit == 0): the launcher wrote the selected set; its picks become the entry;
//   - a hit: the selected set is [0, n_init) + the entry's picks below N - n_local +
//     [N - n_local, N) for the current N (picks in the window or past N, possible only when N
//     shrank, are dropped, as engine/selection/selection_cache.h says).
// counters (optional, [2]) get += hit and += 1 - hit. One block; nothing waits for the host.
struct CachedSelectionParams {
  SelectionOutput out;
  int32_t* picks = nullptr;      // [k]: the entry's picks, offsets from n_init, ascending
  int32_t* num_picks = nullptr;  // [1]
  const int32_t* hit = nullptr;  // [1]
  int64_t* counters = nullptr;
  SelectionProblem problem;  // num_tokens, n_init, k, n_local used; not a covering budget
};
cudaError_t ApplySelectionCache(const CachedSelectionParams& params, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// quest.

// Pages of page_size tokens over the candidates [n_init, N - n_local): page p covers
// [n_init + p * page_size, min(N - n_local, n_init + (p + 1) * page_size)).
int64_t QuestNumPages(const SelectionProblem& problem, int64_t page_size);

struct QuestBoundsParams {
  // [num_pages, 2, num_kv_heads, head_dim]: per page the channel minimum, then the maximum.
  __nv_bfloat16* page_bounds = nullptr;
  SelectionProblem problem;  // query, scale and budget unused
  int64_t page_size = 16;
};

// One block per page; reads every candidate key once. Nothing to do when num_pages is 0.
cudaError_t QuestBuildPageBounds(const QuestBoundsParams& params, cudaStream_t stream);

struct QuestSelectParams {
  SelectionOutput out;
  float* page_scores = nullptr;  // [num_pages], written
  const __nv_bfloat16* page_bounds = nullptr;  // QuestBuildPageBounds()
  SelectionProblem problem;  // k_cache unused
  int64_t page_size = 16;
  void* workspace = nullptr;  // QuestSelectWorkspaceBytes(); no initialisation needed
  // 1, 2 or 4 (dividing num_kv_heads): the KV heads' groups whose shares of a page's score are
  // added in a fixed binary tree (TP-invariant numerics: a tensor-parallel rank's groups are
  // its share of the one-GPU tree); 1 sums all heads in one pass.
  int head_parts = 1;
};

size_t QuestSelectWorkspaceBytes(int64_t num_pages, int64_t k, int64_t page_size);

// Page bounds (one warp per page, 2 * H_kv * d * 2 bytes each), then the greedy page choice: with
// F full pages and a short last page of r tokens, the choice is the top q = k / page_size full
// pages (TopK) and the short page when it fits when its turn comes, which may push out the
// lowest-ranked of the q (one counting kernel finds its rank).
cudaError_t QuestSelect(const QuestSelectParams& params, cudaStream_t stream);

// QuestSelect in two halves, for tensor parallelism (docs/parallel.md), where a rank holds only
// its heads' bounds: QuestScorePages writes page_scores (this rank's heads' share of each bound;
// nothing when the budget covers the candidates or k is 0), the caller sums page_scores over the
// ranks, and QuestChoosePages makes the page choice and the output from them. QuestSelect is
// the two in a row.
cudaError_t QuestScorePages(const QuestSelectParams& params, cudaStream_t stream);
cudaError_t QuestChoosePages(const QuestSelectParams& params, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// infllm.

// Blocks of block_size tokens over the candidates, as QuestNumPages.
int64_t InfLlmNumBlocks(const SelectionProblem& problem, int64_t block_size);

struct InfLlmRepsParams {
  int32_t* rep_slots = nullptr;  // [num_blocks, reps]: slots, -1 past a short block's count
  const float* received = nullptr;  // [received_size]; tokens at or after it count as 0
  int64_t received_size = 0;
  SelectionProblem problem;  // slots, num_tokens, n_init, n_local used
  int64_t block_size = 128;
  int64_t reps = 4;
};

// One warp per block: the min(reps, block length) tokens with the highest received attention
// (ties: lower index), as their slots.
cudaError_t InfLlmRepresentatives(const InfLlmRepsParams& params, cudaStream_t stream);

struct InfLlmSelectParams {
  SelectionOutput out;
  float* block_scores = nullptr;  // [num_blocks], written
  const int32_t* rep_slots = nullptr;  // InfLlmRepresentatives()
  SelectionProblem problem;
  int64_t block_size = 128;
  int64_t reps = 4;
  void* workspace = nullptr;  // InfLlmSelectWorkspaceBytes(); no initialisation needed
};

size_t InfLlmSelectWorkspaceBytes(int64_t num_blocks, int64_t k, int64_t block_size);

// Block scores (one warp per block), TopK of k / block_size blocks, the output.
cudaError_t InfLlmSelect(const InfLlmSelectParams& params, cudaStream_t stream);

// InfLlmSelect in two halves, for tensor parallelism (as QuestScorePages / QuestChoosePages):
// InfLlmScoreBlocks writes block_scores (this rank's heads' share; nothing when the budget
// covers the candidates or no block is kept), the caller sums them over the ranks, and
// InfLlmChooseBlocks takes the top blocks and writes the output. InfLlmSelect is the two in a row.
cudaError_t InfLlmScoreBlocks(const InfLlmSelectParams& params, cudaStream_t stream);
cudaError_t InfLlmChooseBlocks(const InfLlmSelectParams& params, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// The received attention of a forward step's new tokens (what InfLLM's representatives are
// chosen by; engine/selection/chunk_attention.h is the CPU oracle): for a step of c new tokens
// at positions p_0 + i, already in the K cache,
//   received[j] = sum_{i >= j} sum_h softmax_{j' <= i}(scale * q_i,h . K[slot_j', h / g])[j]
// (queries and keys rotated at their positions)
// - the attention token j got from the queries of the step that wrote it. Each row of each head
// sums to 1, so received sums to c * num_heads (a decode step writes num_heads). Under tensor
// parallelism a rank sums over its own heads; the ranks' results add up to the whole model's.
// Costs the chunk's causal attention twice on CUDA cores (c^2 * H * d multiply-adds).
struct ReceivedAttentionParams {
  float* received = nullptr;         // [num_new], written
  void* workspace = nullptr;         // ReceivedAttentionWorkspaceBytes(num_new, num_heads)
  const __nv_bfloat16* q = nullptr;  // row i at q + i * q_row_stride: [num_heads, head_dim],
  int64_t q_row_stride = 0;          //   un-rotated
  const void* k_cache = nullptr;     // [num_slots, num_kv_heads, head_dim] of kv_type, un-rotated
  KvCacheType kv_type = KvCacheType::kBf16;
  const float* k_scale = nullptr;  // FP8 only: [num_kv_heads]
  const int32_t* slots = nullptr;  // [num_new]: the new tokens' slots
  int64_t first_position = 0;      // p_0
  int64_t num_new = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;             // 64 or 128
  const float* inv_freq = nullptr;  // [head_dim / 2]
  float scale = 1.0f;               // > 0
};

size_t ReceivedAttentionWorkspaceBytes(int64_t num_new, int64_t num_heads);
// ChunkAttentionMap's (span_detection.h): the above plus its heads' partial maps (8 x c^2 floats
// for chunks of c <= 1024 tokens). Both are enough for any chunk of up to num_new tokens.
size_t ChunkAttentionMapWorkspaceBytes(int64_t num_new, int64_t num_heads);

// Three launches, no atomics (the result does not depend on the schedule); fp32 throughout.
// cudaErrorInvalidValue for a null pointer, an unsupported shape or a bad scale.
cudaError_t ChunkReceivedAttention(const ReceivedAttentionParams& params, cudaStream_t stream);

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_SPAN_SCORING_H_
