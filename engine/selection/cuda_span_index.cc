#include "engine/selection/cuda_span_index.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/selection/chunk_attention.h"
#include "engine/selection/span_detection.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/span_detection.h"

namespace tokenselect::engine {
namespace {

namespace kc = kernels::cuda;
using kc::CudaStatus;

// What the host stages of a chunk's detected spans per copy; a chunk with more (rare: hundreds
// of spans is typical at 512 tokens) takes a second, exact copy.
constexpr int64_t kStagedSpans = 4096;
constexpr int64_t kStagedTokens = 32768;

absl::Status DeviceAlloc(size_t bytes, void** out) {
  const cudaError_t err = cudaMalloc(out, std::max<size_t>(bytes, 1));
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("GPU span index: out of device memory allocating ", bytes, " bytes"));
  }
  return CudaStatus(err, "cudaMalloc");
}

// A device array that grows (doubling) and keeps a prefix of its contents when it does.
template <typename T>
struct Growable {
  T* ptr = nullptr;
  int64_t capacity = 0;

  ~Growable() { cudaFree(ptr); }
  absl::Status Reserve(int64_t need, int64_t keep, cudaStream_t stream) {
    if (need <= capacity) return absl::OkStatus();
    keep = std::min(keep, capacity);
    const int64_t cap = std::max<int64_t>({need, 2 * capacity, 1024});
    void* fresh = nullptr;
    RETURN_IF_ERROR(DeviceAlloc(static_cast<size_t>(cap) * sizeof(T), &fresh));
    T* next = static_cast<T*>(fresh);
    if (keep > 0) {
      RETURN_IF_ERROR(
          CudaStatus(cudaMemcpyAsync(next, ptr, keep * sizeof(T), cudaMemcpyDeviceToDevice, stream),
                     "span index copy"));
    }
    // The old array may still be read by work on the stream.
    RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "span index growth"));
    cudaFree(ptr);
    ptr = next;
    capacity = cap;
    return absl::OkStatus();
  }
};

// Pinned host memory.
template <typename T>
struct Pinned {
  T* ptr = nullptr;
  ~Pinned() { cudaFreeHost(ptr); }
  absl::Status Allocate(int64_t count) {
    void* p = nullptr;
    RETURN_IF_ERROR(
        CudaStatus(cudaMallocHost(&p, static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T)),
                   "cudaMallocHost"));
    ptr = static_cast<T*>(p);
    return absl::OkStatus();
  }
};

// SpanMaxKept (span_scoring.h) from the host index: the kept-token bound SpanSelect sizes its
// soft vote by.
// Spans without index vectors come only from unobserved tokens, rollbacks and imports
// (`unindexed`: one of those happened), so the scan over the spans is skipped otherwise.
int64_t MaxKept(const SpanIndex& index, bool unindexed, int64_t n, const SelectionOptions& o) {
  const int64_t begin = o.n_init, end = n - o.n_local;
  if (end <= begin) return 0;
  int64_t always = 0;
  if (unindexed) {
    for (const IndexedSpan& s : index.spans()) {
      if (s.num_vectors != 0) continue;
      const int64_t b = std::max<int64_t>(s.begin, begin), e = std::min<int64_t>(s.end, end);
      if (b < e) always += e - b;
    }
  }
  const int64_t tail = std::max(index.covered_end(), begin);
  if (tail < end) always += end - tail;
  return std::min(end - begin, SpanTokenBudget(o) + always);
}

}  // namespace

kc::ReceivedAttentionParams StepChunkParams(const CudaAttentionQuery& query,
                                            const ModelConfig& config, float* received,
                                            void* workspace) {
  kc::ReceivedAttentionParams rp;
  rp.received = received;
  rp.workspace = workspace;
  rp.q = query.q;
  rp.q_row_stride = query.q_row_stride;
  rp.k_cache = query.k_cache;
  rp.kv_type = KernelKvType(query.kv_dtype);
  rp.k_scale = query.k_scale;
  rp.slots = query.token_slots + query.cache_length;
  rp.first_position = query.cache_length;
  rp.num_new = query.num_new;
  rp.num_heads = config.num_heads;
  rp.num_kv_heads = config.num_kv_heads;
  rp.head_dim = config.head_dim;
  rp.inv_freq = query.inv_freq;
  rp.scale = 1.0f / std::sqrt(static_cast<float>(config.head_dim));
  return rp;
}

struct CudaSpanIndex::Device {
  struct Layer {
    Growable<int32_t> begin, end, indptr, tokens;
    // The host index's spans and index tokens that the device arrays hold unchanged.
    int64_t synced_spans = 0;
    int64_t synced_tokens = 0;
    bool unindexed = false;  // may hold spans without index vectors (MaxKept)
  };
  std::vector<Layer> layers;
  // A chunk's map, received attention and detection (sized for max_new).
  Growable<float> map, received;
  Growable<char> received_workspace, detect_workspace;
  Growable<int32_t> out_ints;  // counts, x, y, gap, indptr, index tokens
  Growable<double> out_score;
  kc::SpanDetectOutput out;
  // Host staging of the detection.
  Pinned<int32_t> h_ints;  // counts[2], x, y, gap, indptr (kStagedSpans + 1), tokens
  Pinned<double> h_score;
  Pinned<float> h_received;
  // SpanSelect's scratch, grown with the index.
  Growable<float> span_scores, kept_votes;
  Growable<int32_t> kept_tokens, num_kept;
  Growable<char> select_workspace;  // SpanSelect's (it clears what must be zero itself)
  int64_t max_tokens = 0;
  int64_t max_new = 0;
  // What one staged copy moves: kStagedSpans / kStagedTokens, or less where the detection's
  // arrays are shorter.
  int64_t staged_spans = 0;
  int64_t staged_tokens = 0;
};

CudaSpanIndex::CudaSpanIndex(const SelectionOptions& options, const ModelConfig& config)
    : options_(options),
      config_(config),
      states_(static_cast<size_t>(config.num_layers)),
      dev_(std::make_unique<Device>()) {}

CudaSpanIndex::~CudaSpanIndex() = default;

absl::StatusOr<std::unique_ptr<CudaSpanIndex>> CudaSpanIndex::Create(
    const SelectionOptions& options, const ModelConfig& config, int64_t max_tokens,
    int64_t max_new) {
  if (max_new < 1 || max_new > kMaxSpanChunk || max_tokens < 1 || max_tokens > INT32_MAX / 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("selection.policy tokenselect_span on the GPU takes steps of 1 to ",
                     kMaxSpanChunk, " tokens (the model's max_chunk) and up to ", INT32_MAX / 2,
                     " tokens; got steps of ", max_new, " and ", max_tokens, " tokens"));
  }
  std::unique_ptr<CudaSpanIndex> s(new CudaSpanIndex(options, config));
  Device& d = *s->dev_;
  d.max_tokens = max_tokens;
  d.max_new = max_new;
  d.layers.resize(static_cast<size_t>(config.num_layers));
  cudaStream_t stream = nullptr;  // allocation only
  const int64_t c = max_new;
  const int64_t spans = kc::SpanDetectMaxSpans(c);
  const int64_t tokens = kc::SpanDetectMaxTokens(c, options.span.max_vectors);
  RETURN_IF_ERROR(d.map.Reserve(c * c, 0, stream));
  RETURN_IF_ERROR(d.received.Reserve(c, 0, stream));
  RETURN_IF_ERROR(d.received_workspace.Reserve(
      static_cast<int64_t>(kc::ChunkAttentionMapWorkspaceBytes(c, config.num_heads)), 0, stream));
  RETURN_IF_ERROR(
      d.detect_workspace.Reserve(static_cast<int64_t>(kc::SpanDetectWorkspaceBytes(c)), 0, stream));
  RETURN_IF_ERROR(d.out_ints.Reserve(2 + 4 * spans + 1 + tokens, 0, stream));
  RETURN_IF_ERROR(d.out_score.Reserve(spans, 0, stream));
  int32_t* ints = d.out_ints.ptr;
  d.out.counts = ints;
  d.out.span_x = ints + 2;
  d.out.span_y = d.out.span_x + spans;
  d.out.span_gap = d.out.span_y + spans;
  d.out.indptr = d.out.span_gap + spans;
  d.out.index_tokens = d.out.indptr + spans + 1;
  d.out.span_score = d.out_score.ptr;
  d.staged_spans = std::min(kStagedSpans, spans);
  d.staged_tokens = std::min(kStagedTokens, tokens);
  RETURN_IF_ERROR(d.h_ints.Allocate(2 + 4 * kStagedSpans + 1 + kStagedTokens));
  RETURN_IF_ERROR(d.h_score.Allocate(kStagedSpans));
  RETURN_IF_ERROR(d.h_received.Allocate(c));
  RETURN_IF_ERROR(d.num_kept.Reserve(1, 0, stream));
  return s;
}

absl::Status CudaSpanIndex::Reserve(int64_t layer, int64_t spans, int64_t tokens,
                                    cudaStream_t stream) {
  Device::Layer& l = dev_->layers[static_cast<size_t>(layer)];
  const int64_t keep_spans = l.synced_spans, keep_tokens = l.synced_tokens;
  RETURN_IF_ERROR(l.begin.Reserve(spans, keep_spans, stream));
  RETURN_IF_ERROR(l.end.Reserve(spans, keep_spans, stream));
  RETURN_IF_ERROR(l.indptr.Reserve(spans + 1, keep_spans + 1, stream));
  return l.tokens.Reserve(tokens, keep_tokens, stream);
}

absl::Status CudaSpanIndex::Upload(int64_t layer, cudaStream_t stream) {
  const SpanIndex& index = states_[static_cast<size_t>(layer)].spans;
  Device::Layer& l = dev_->layers[static_cast<size_t>(layer)];
  const std::vector<IndexedSpan>& spans = index.spans();
  const int64_t S = static_cast<int64_t>(spans.size()), V = index.num_index_tokens();
  RETURN_IF_ERROR(Reserve(layer, S, V, stream));
  const int64_t s0 = l.synced_spans;
  if (s0 < S) {
    std::vector<int32_t> begin, end, indptr, tokens;
    for (int64_t i = s0; i < S; ++i) {
      const IndexedSpan& s = spans[static_cast<size_t>(i)];
      begin.push_back(s.begin);
      end.push_back(s.end);
      if (i == s0) indptr.push_back(static_cast<int32_t>(s.first_vector));
      indptr.push_back(static_cast<int32_t>(s.first_vector + s.num_vectors));
      absl::Span<const int32_t> v = index.vectors(s);
      tokens.insert(tokens.end(), v.begin(), v.end());
    }
    const int64_t t0 = spans[static_cast<size_t>(s0)].first_vector;
    // From pageable memory: each copy has read its source when it returns.
    auto copy = [&](int32_t* dst, const std::vector<int32_t>& src) {
      if (src.empty()) return absl::OkStatus();
      return CudaStatus(cudaMemcpyAsync(dst, src.data(), src.size() * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, stream),
                        "span index upload");
    };
    RETURN_IF_ERROR(copy(l.begin.ptr + s0, begin));
    RETURN_IF_ERROR(copy(l.end.ptr + s0, end));
    RETURN_IF_ERROR(copy(l.indptr.ptr + s0, indptr));
    RETURN_IF_ERROR(copy(l.tokens.ptr + t0, tokens));
  } else if (S == 0) {
    const int32_t zero = 0;
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(l.indptr.ptr, &zero, sizeof(zero), cudaMemcpyHostToDevice, stream),
        "span index upload"));
  }
  l.synced_spans = S;
  l.synced_tokens = V;
  return absl::OkStatus();
}

absl::Status CudaSpanIndex::Observe(const CudaAttentionQuery& query) {
  Device& d = *dev_;
  const ModelConfig& c = config_;
  const int64_t n = query.cache_length, m = query.num_new, layer = query.layer;
  cudaStream_t stream = query.stream;
  if (m < 1 || m > d.max_new || n < 0 || n + m > d.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("GPU span index: a step of ", m,
                                                   " tokens after ", n,
                                                   " is outside what it was created for"));
  }
  SelectionLayerState& state = states_[static_cast<size_t>(layer)];
  SpanIndex& index = state.spans;
  Device::Layer& l = d.layers[static_cast<size_t>(layer)];
  // SpanPolicy::ObserveChunk's rollback: spans that end after n change; those before stay.
  if (n < index.covered_end()) {
    int64_t keep = 0;
    while (keep < static_cast<int64_t>(index.spans().size()) &&
           index.spans()[static_cast<size_t>(keep)].end <= n) {
      ++keep;
    }
    if (keep < l.synced_spans) {
      l.synced_spans = keep;
      l.synced_tokens = keep < static_cast<int64_t>(index.spans().size())
                            ? index.spans()[static_cast<size_t>(keep)].first_vector
                            : index.num_index_tokens();
    }
  }
  if (n < index.covered_end()) l.unindexed = true;
  state.TruncateTo(n);
  if (const int64_t missed = n - index.covered_end(); missed > 0) {
    // Tokens the index never saw: one span without index vectors, always a candidate.
    DetectedSpan unindexed;
    unindexed.y = static_cast<int32_t>(missed - 1);
    unindexed.gap = true;
    index.AppendChunk(index.covered_end(), missed, {unindexed});
    l.unindexed = true;
  }
  const bool in_step = l.synced_spans == static_cast<int64_t>(index.spans().size()) &&
                       l.synced_tokens == index.num_index_tokens();
  const int64_t spans_before = static_cast<int64_t>(index.spans().size());
  const int64_t tokens_before = index.num_index_tokens();
  const double lambda = SpanLambda(options_.span, layer);
  state.received.resize(static_cast<size_t>(n));
  if (m == 1) {
    // The 1 x 1 map holds num_heads (each head's one probability is 1; under tensor parallelism
    // every rank's heads): the CPU's detection of it is the token's own span with its key as the
    // index vector.
    const int ranks = IsSharded(query.tp) ? query.tp->size() : 1;
    const float heads = static_cast<float>(c.num_heads * ranks);
    const std::vector<DetectedSpan> spans = DetectSpans({heads}, 1, options_.span, lambda);
    state.received.push_back(heads);
    index.AppendChunk(n, 1, spans);
    if (in_step && spans.size() == 1 && spans[0].index_tokens.size() == 1) {
      RETURN_IF_ERROR(Reserve(layer, spans_before + 1, tokens_before + 1, stream));
      kc::SpanIndexArrays arrays{l.begin.ptr, l.end.ptr, l.indptr.ptr, l.tokens.ptr};
      RETURN_IF_ERROR(
          CudaStatus(kc::AppendOneSpan(arrays, spans_before, tokens_before, static_cast<int32_t>(n),
                                       static_cast<int32_t>(n + 1),
                                       static_cast<int32_t>(n + spans[0].index_tokens[0]), stream),
                     "AppendOneSpan"));
      l.synced_spans = spans_before + 1;
      l.synced_tokens = tokens_before + 1;
      return absl::OkStatus();
    }
    return Upload(layer, stream);
  }

  // The chunk's map and received attention, then its spans, on the GPU.
  const kc::ReceivedAttentionParams rp =
      StepChunkParams(query, c, d.received.ptr, d.received_workspace.ptr);
  RETURN_IF_ERROR(CudaStatus(kc::ChunkAttentionMap(rp, d.map.ptr, stream), "ChunkAttentionMap"));
  if (IsSharded(query.tp)) {
    // This rank's heads' share of the map and of its column sums: add the other ranks' heads.
    // Every rank then detects the same spans from the same sums.
    RETURN_IF_ERROR(query.tp->AllReduceSum(d.map.ptr, m * m, stream));
    RETURN_IF_ERROR(query.tp->AllReduceSum(d.received.ptr, m, stream));
  }
  kc::SpanDetectParams dp;
  dp.out = d.out;
  dp.map = d.map.ptr;
  dp.c = m;
  dp.options.threshold_percentile = options_.span.threshold_percentile;
  dp.options.nms_iou = options_.span.nms_iou;
  dp.options.min_vectors = options_.span.min_vectors;
  dp.options.max_vectors = options_.span.max_vectors;
  dp.options.lambda = lambda;
  dp.workspace = d.detect_workspace.ptr;
  RETURN_IF_ERROR(CudaStatus(kc::DetectChunkSpans(dp, stream), "DetectChunkSpans"));

  // The host's copy: counts and a staged prefix of every array, then the rest if it is longer.
  int32_t* h = d.h_ints.ptr;
  int32_t *hx = h + 2, *hy = hx + kStagedSpans, *hg = hy + kStagedSpans, *hi = hg + kStagedSpans;
  int32_t* ht = hi + kStagedSpans + 1;
  auto fetch = [&](void* dst, const void* src, int64_t bytes) {
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream),
                      "span detection copy");
  };
  // The detection's arrays (spans entries each, tokens index tokens) into host memory.
  auto fetch_spans = [&](int32_t* x, int32_t* y, int32_t* gap, int32_t* indptr, double* score,
                         int32_t* tokens, int64_t spans, int64_t num_tokens) -> absl::Status {
    RETURN_IF_ERROR(fetch(x, d.out.span_x, spans * sizeof(int32_t)));
    RETURN_IF_ERROR(fetch(y, d.out.span_y, spans * sizeof(int32_t)));
    RETURN_IF_ERROR(fetch(gap, d.out.span_gap, spans * sizeof(int32_t)));
    RETURN_IF_ERROR(fetch(indptr, d.out.indptr, (spans + 1) * sizeof(int32_t)));
    RETURN_IF_ERROR(fetch(score, d.out.span_score, spans * sizeof(double)));
    RETURN_IF_ERROR(fetch(tokens, d.out.index_tokens, num_tokens * sizeof(int32_t)));
    return CudaStatus(cudaStreamSynchronize(stream), "span detection copy");
  };
  const int64_t ss = d.staged_spans, st = d.staged_tokens;
  RETURN_IF_ERROR(fetch(h, d.out.counts, 2 * sizeof(int32_t)));
  RETURN_IF_ERROR(fetch(d.h_received.ptr, d.received.ptr, m * sizeof(float)));
  RETURN_IF_ERROR(fetch_spans(hx, hy, hg, hi, d.h_score.ptr, ht, ss, st));
  const int64_t S = h[0], V = h[1];
  const int64_t s_staged = std::min(S, ss);
  std::vector<int32_t> x(hx, hx + s_staged), y(hy, hy + s_staged), gap(hg, hg + s_staged),
      indptr(hi, hi + s_staged + 1), tokens(ht, ht + std::min(V, st));
  std::vector<double> score(d.h_score.ptr, d.h_score.ptr + s_staged);
  if (S > ss || V > st) {
    x.resize(S);
    y.resize(S);
    gap.resize(S);
    indptr.resize(S + 1);
    score.resize(S);
    tokens.resize(V);
    RETURN_IF_ERROR(fetch_spans(x.data(), y.data(), gap.data(), indptr.data(), score.data(),
                                tokens.data(), S, V));
  }
  std::vector<DetectedSpan> spans(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) {
    DetectedSpan& s = spans[static_cast<size_t>(i)];
    s.x = x[i];
    s.y = y[i];
    s.score = score[i];
    s.gap = gap[i] != 0;
    s.index_tokens.assign(tokens.begin() + indptr[i], tokens.begin() + indptr[i + 1]);
  }
  state.received.insert(state.received.end(), d.h_received.ptr, d.h_received.ptr + m);
  index.AppendChunk(n, m, spans);
  if (!in_step) return Upload(layer, stream);
  RETURN_IF_ERROR(Reserve(layer, spans_before + S, tokens_before + V, stream));
  kc::SpanIndexArrays arrays{l.begin.ptr, l.end.ptr, l.indptr.ptr, l.tokens.ptr};
  RETURN_IF_ERROR(
      CudaStatus(kc::AppendDetectedSpans(d.out, arrays, spans_before, tokens_before, n, stream),
                 "AppendDetectedSpans"));
  l.synced_spans = spans_before + S;
  l.synced_tokens = tokens_before + V;
  return absl::OkStatus();
}

absl::Status CudaSpanIndex::Select(int64_t layer, const kc::SelectionProblem& problem,
                                   const kc::SelectionOutput& out, const int32_t* skip,
                                   CudaTensorParallel* tp, cudaStream_t stream) {
  Device& d = *dev_;
  const SpanIndex& index = states_[static_cast<size_t>(layer)].spans;
  Device::Layer& l = d.layers[static_cast<size_t>(layer)];
  const int64_t S = static_cast<int64_t>(index.spans().size());
  const int64_t max_kept = MaxKept(index, l.unindexed, problem.num_tokens, options_);
  RETURN_IF_ERROR(d.span_scores.Reserve(S, 0, stream));
  RETURN_IF_ERROR(d.kept_tokens.Reserve(max_kept, 0, stream));
  RETURN_IF_ERROR(d.kept_votes.Reserve(max_kept, 0, stream));
  const int64_t bytes = static_cast<int64_t>(kc::SpanSelectWorkspaceBytes(
      S, index.num_index_tokens(), max_kept, problem.num_heads, problem.k));
  RETURN_IF_ERROR(d.select_workspace.Reserve(bytes, 0, stream));
  kc::SpanSelectParams sp;
  sp.out = out;
  sp.span_scores = d.span_scores.ptr;
  sp.kept_tokens = d.kept_tokens.ptr;
  sp.kept_votes = d.kept_votes.ptr;
  sp.num_kept = d.num_kept.ptr;
  sp.problem = problem;
  sp.index.span_begin = l.begin.ptr;
  sp.index.span_end = l.end.ptr;
  sp.index.vector_indptr = l.indptr.ptr;
  sp.index.vector_tokens = l.tokens.ptr;
  sp.index.num_spans = S;
  sp.index.num_vectors = index.num_index_tokens();
  sp.index.covered_end = index.covered_end();
  sp.token_budget = SpanTokenBudget(options_);
  sp.max_kept = max_kept;
  sp.workspace = d.select_workspace.ptr;
  sp.skip = skip;
  if (!IsSharded(tp)) return CudaStatus(kc::SpanSelect(sp, stream), "SpanSelect");
  // Span scores and votes are sums over heads: each rank adds its heads' share, then the ranks'
  // shares are summed between the parts. Every rank holds the same index, so the counts and the
  // calls match; k = 0 (nothing is scored) makes no call on any rank. On a selection-cache hit the
  // sums are unused (AllReduceSumUnless).
  RETURN_IF_ERROR(CudaStatus(kc::SpanScoreSpans(sp, stream), "SpanScoreSpans"));
  if (problem.k > 0 && S > 0) {
    RETURN_IF_ERROR(tp->AllReduceSumUnless(sp.span_scores, S, skip, stream));
  }
  RETURN_IF_ERROR(CudaStatus(kc::SpanVoteKept(sp, stream), "SpanVoteKept"));
  if (problem.k > 0 && max_kept > 0) {
    RETURN_IF_ERROR(tp->AllReduceSumUnless(sp.kept_votes, max_kept, skip, stream));
  }
  return CudaStatus(kc::SpanPickTokens(sp, stream), "SpanPickTokens");
}

int64_t CudaSpanIndex::NumIndexTokens(int64_t layer) const {
  return states_[static_cast<size_t>(layer)].spans.num_index_tokens();
}

absl::Status CudaSpanIndex::Import(const std::vector<SelectionLayerState>& states,
                                   cudaStream_t stream) {
  if (states.size() != states_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("final.selection_states has ", states.size(),
                                                   " layers, the model ", states_.size()));
  }
  for (size_t l = 0; l < states.size(); ++l) {
    const int64_t tokens = std::max<int64_t>(static_cast<int64_t>(states[l].received.size()),
                                             states[l].spans.covered_end());
    if (tokens > dev_->max_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("final.selection_states[", l, "] covers ",
                                                     tokens, " tokens; the request has room for ",
                                                     dev_->max_tokens));
    }
  }
  for (size_t l = 0; l < states.size(); ++l) {
    states_[l].received = states[l].received;
    states_[l].spans = states[l].spans;
    Device::Layer& layer = dev_->layers[l];
    layer.synced_spans = 0;
    layer.synced_tokens = 0;
    layer.unindexed = true;
    RETURN_IF_ERROR(Upload(static_cast<int64_t>(l), stream));
  }
  return CudaStatus(cudaStreamSynchronize(stream), "span index upload");
}

}  // namespace tokenselect::engine
