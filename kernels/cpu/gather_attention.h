// Internals of cpu::GatherAttention (kernels/ops.h), shared by its two schedules and exposed for
// tests and benchmarks, which run both schedules on the same inputs.
//
// Both schedules compute, for every query head h (kv head h / group) and query i,
//   s_j = scale * rot(q[i, h], q_pos[i]) . rot(k[slot_j], kv_pos[j]),
//   out[i, h] = sum_j softmax(s)_j v[slot_j],
// over list entries j < visible[i], with an online (streaming) softmax in fp32 over tiles of the
// key list, so scratch memory does not grow with kv_len. Queries are rotated once, into a
// per-kv-head layout [num_kv_heads][num_queries * group][head_dim] (row i * group + j is query i,
// head kv_head * group + j), so that one kv head's query rows are one matrix.
// Scratch memory comes from per-thread buffers reused across calls (scratch.h).
// Score and P.V products are sgemm calls small enough that OpenBLAS runs them on the calling
// thread (m * n * k <= kBlasSingleThreadWork), so that OpenMP threads can call it concurrently
// without OpenBLAS's own threads (and its lock around threaded level-3 calls) getting involved.
#ifndef TOKENSELECT_KERNELS_CPU_GATHER_ATTENTION_H_
#define TOKENSELECT_KERNELS_CPU_GATHER_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "kernels/ops.h"

namespace tokenselect::kernels::cpu::internal {

// OpenBLAS (interface/gemm.c) runs an sgemm single-threaded when m * n * k <= 65536 *
// GEMM_MULTITHREAD_THRESHOLD (4 by default). Larger calls still work, just threaded.
constexpr int64_t kBlasSingleThreadWork = 65536 * 4;

// Query rows per kv head (num_queries * group) up to which GatherAttention uses the split-keys
// schedule; above it, the tiled one.
constexpr int64_t kSplitKeysMaxRows = 32;

struct GatherAttentionOptions {
  // Split-keys: keys per inner tile. Tiled: keys per shared tile. 0 picks the default.
  int64_t tile_keys = 0;
  // Split-keys only: number of key ranges processed in parallel and merged. 0 picks the default.
  int64_t num_splits = 0;
  // Tiled only: query rows per work item. 0 picks the default.
  int64_t rows_per_item = 0;
};

// Decode schedule (few query rows per kv head): the visible key range is cut into num_splits
// ranges processed in parallel, each with its own online-softmax state for all query rows; the
// states are merged at the end. Each key's cos/sin row is computed once and used for every kv
// head; each (key, kv head) is gathered and rotated once and used for all `group` query heads.
void GatherAttentionSplitKeys(const GatherAttentionParams& params,
                              const GatherAttentionOptions& options);

// Prefill schedule (many query rows, e.g. a chunk of 512 queries): the key list is walked in
// shared tiles; each tile is gathered and rotated once (all kv heads, in parallel), then the
// (kv head, block of query rows) work items run in parallel over it, each with its own slice of
// the online-softmax state. Items skip the part of a tile no row of theirs can see, so causal
// chunks cost about half a square.
void GatherAttentionTiled(const GatherAttentionParams& params,
                          const GatherAttentionOptions& options);

// ---- Pieces shared by the two schedules (gather_attention.cc). ----

// Checks the shapes and pointers (TS_CHECK: these are programming errors).
void ValidateGatherAttentionParams(const GatherAttentionParams& params);

// visible[i] clamped to [0, kv_len] (kv_len when visible is null), for every query.
std::vector<int64_t> VisibleCounts(const GatherAttentionParams& params);

// The set-up both schedules share.
struct GatherGeometry {
  int64_t group = 0;              // query heads per kv head
  int64_t rows = 0;               // query rows per kv head: num_queries * group
  std::vector<int64_t> visible;   // VisibleCounts
  int64_t visible_end = 0;        // max of visible
};
// Validates `params` and fills `geometry`. Returns false when there is nothing left to compute:
// no queries, or no query sees any key (the output is then written as zeros).
bool PrepareGather(const GatherAttentionParams& params, GatherGeometry* geometry);

// Writes the rotated (not scaled) queries, [num_queries * num_heads * head_dim] floats, in the
// per-kv-head layout described above.
void RotateQueries(const GatherAttentionParams& params, float* rotated);

// One online-softmax step over a block of score rows s: [rows, cols] (row stride cols), whose
// row r may only see its first limit[r] columns. For each row with limit > 0: m_new =
// max(m[r], max of the visible scores), s <- exp(s - m_new) on the visible part and 0 beyond,
// l[r] = l[r] * exp(m[r] - m_new) + sum, the accumulator row acc[r] ([head_dim]) scaled by
// exp(m[r] - m_new), m[r] = m_new. Rows with limit 0 get s = 0 and keep their state. The caller
// then adds s . V into acc.
void OnlineSoftmaxStep(float* s, int64_t rows, int64_t cols, const int64_t* limit, float* m,
                       float* l, float* acc, int64_t head_dim);

// Scores s = scale * q k^T: q [rows, head_dim], k [keys, head_dim], s [rows, keys].
void ScoreGemm(float* s, const float* q, const float* k, int64_t rows, int64_t keys,
               int64_t head_dim, float scale);

// acc += p v: p [rows, keys], v [keys, head_dim], acc [rows, head_dim].
void AccumulateGemm(float* acc, const float* p, const float* v, int64_t rows, int64_t keys,
                    int64_t head_dim);

// out[i, kv_head * group + j, :] = acc row (i * group + j) / l of that row, or zeros when l is 0
// (the query saw no key). acc/l in the per-kv-head layout; all kv heads.
void WriteNormalizedOutput(const GatherAttentionParams& params, const float* acc, const float* l);

}  // namespace tokenselect::kernels::cpu::internal

#endif  // TOKENSELECT_KERNELS_CPU_GATHER_ATTENTION_H_
