// Building the span index on the GPU (Ltri-LLM; docs/DESIGN.md section 4): the chunk's causal
// attention map and span detection, the GPU twins of engine/selection/chunk_attention.h
// (ChunkAttentionMap, ReceivedAttention) and engine/selection/span_detection.h (DetectSpans).
//
//   ChunkAttentionMap   A[i, j] = sum_h softmax_{j' <= i}(scale * q_i,h . K[slot_j', h / g])[j]
//                       for j <= i, 0 above the diagonal (queries and keys rotated at their
//                       positions; fp32, heads added in order), and the received attention
//                       received[j] = sum_{i >= j} A[i, j] (summed in double, row order, as the
//                       CPU's ReceivedAttention).
//   DetectChunkSpans    DetectSpans on a map in device memory: the percentile threshold (a
//                       radix select), the 2-D prefix sums of A - tau in double, every span's
//                       triangle score, a stable sort of the positive ones (CUB), greedy NMS,
//                       the gap spans, the index-vector counts and the index tokens. Given the
//                       same map it returns what DetectSpans returns: the same spans, scores
//                       (the same doubles: the sums are taken in the CPU's order) and index
//                       tokens; only the index-vector count's exp() (CUDA's against the host
//                       library's, within an ulp) could round a count differently, at an exact
//                       half.
//
// Launchers take a cudaStream_t, never synchronise, and return the first CUDA error
// (cudaErrorInvalidValue for bad shapes or options).
#ifndef TOKENSELECT_KERNELS_CUDA_SPAN_DETECTION_H_
#define TOKENSELECT_KERNELS_CUDA_SPAN_DETECTION_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/span_scoring.h"

namespace tokenselect::kernels::cuda {

// map: [num_new, num_new] row-major, written in full; p.received ([num_new]) gets the map's
// column sums and p.workspace is ChunkAttentionMapWorkspaceBytes(num_new, num_heads). Up to six
// launches (row statistics by key splits and their merge, the map by tiles and head parts with
// each part's heads summed in order, the parts' sum in order, column sums).
cudaError_t ChunkAttentionMap(const ReceivedAttentionParams& p, float* map, cudaStream_t stream);

// The span detection options (engine's SpanOptions; lambda already chosen for the layer).
struct SpanDetectOptions {
  double threshold_percentile = 90.0;
  double nms_iou = 0.1;
  int64_t min_vectors = 1;
  int64_t max_vectors = 8;
  double lambda = 3.0;
};

// The most spans DetectChunkSpans can return for a chunk of c tokens (every candidate kept, plus
// the gaps), and the most index tokens.
int64_t SpanDetectMaxSpans(int64_t c);
int64_t SpanDetectMaxTokens(int64_t c, int64_t max_vectors);

// The chunk's spans in position order (by x, then y), covering [0, c): spans s < *num_spans
// have chunk offsets [span_x[s], span_y[s]] (inclusive), span_score[s] (the triangle score),
// span_gap[s] (1 for a gap span) and the index tokens index_tokens[indptr[s], indptr[s + 1])
// (chunk offsets, ascending); *num_tokens = indptr[*num_spans]. Entries past the counts are not
// written.
struct SpanDetectOutput {
  int32_t* counts = nullptr;  // [2]: num_spans, num_tokens
  int32_t* span_x = nullptr;  // [SpanDetectMaxSpans(c)]
  int32_t* span_y = nullptr;
  int32_t* span_gap = nullptr;
  int32_t* indptr = nullptr;  // [SpanDetectMaxSpans(c) + 1]
  double* span_score = nullptr;
  int32_t* index_tokens = nullptr;  // [SpanDetectMaxTokens(c, max_vectors)]
};

struct SpanDetectParams {
  SpanDetectOutput out;
  const float* map = nullptr;  // [c, c] (ChunkAttentionMap); only j <= i is read
  int64_t c = 0;               // >= 1
  SpanDetectOptions options;
  void* workspace = nullptr;  // SpanDetectWorkspaceBytes(c or more)
};

// For chunks of up to max_c tokens: O(max_c^2) (about 80 bytes per map entry).
size_t SpanDetectWorkspaceBytes(int64_t max_c);

// About sixteen launches (the threshold's four radix passes, row and column scans, span scores,
// CUB sort, NMS, assembly, index tokens). The NMS is one block walking the positive spans best
// first in batches of 1024: each batch is checked against the spans kept so far in parallel,
// then resolved in order within itself; its cost grows with (positive spans) x (kept spans) /
// 1024. H100, c = 512, a random-weight-like chunk (bench_span_cuda --detect): 0.33 ms, of which
// the NMS 0.13 ms (batches of 4096, 4 spans per thread, took 0.195 ms instead).
cudaError_t DetectChunkSpans(const SpanDetectParams& params, cudaStream_t stream);

// The span index's device arrays (SpanIndexView's, writable), for appending to them.
struct SpanIndexArrays {
  int32_t* span_begin = nullptr;
  int32_t* span_end = nullptr;
  int32_t* vector_indptr = nullptr;  // indptr[0] is 0, written by whoever writes span 0
  int32_t* vector_tokens = nullptr;
};

// Appends a chunk's detected spans (DetectChunkSpans' output, whose counts are on the device)
// to an index of `num_spans` spans and `num_vectors` index tokens, as SpanIndex::AppendChunk
// does: span s becomes [first_token + x, first_token + y + 1) with its index tokens shifted by
// first_token. The arrays must have room for the chunk's counts (the caller read them).
cudaError_t AppendDetectedSpans(const SpanDetectOutput& detected, const SpanIndexArrays& index,
                                int64_t num_spans, int64_t num_vectors, int64_t first_token,
                                cudaStream_t stream);

// Appends one span [begin, end) with one index token (a decode step's span), as above.
cudaError_t AppendOneSpan(const SpanIndexArrays& index, int64_t num_spans, int64_t num_vectors,
                          int32_t begin, int32_t end, int32_t token, cudaStream_t stream);

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_SPAN_DETECTION_H_
