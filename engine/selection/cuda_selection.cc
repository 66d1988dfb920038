#include "engine/selection/cuda_selection.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/model/tp_invariance.h"
#include "engine/selection/cuda_span_index.h"
#include "engine/selection/device_arena.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/selection.h"
#include "kernels/cuda/selection_list.h"
#include "kernels/cuda/span_scoring.h"

namespace tokenselect::engine {
namespace {

namespace kc = kernels::cuda;
using kc::CudaStatus;

// Budget covers the cache: every policy attends everything (selection_policy.h).
bool CoversAll(const SelectionOptions& o, int64_t n) { return o.n_init + o.k + o.n_local >= n; }

// A bound on the list length of a step of m new tokens after n cached ones.
int64_t ListBound(const SelectionOptions& o, int64_t n, int64_t m) {
  if (o.policy == SelectionPolicyKind::kDense || CoversAll(o, n)) return n + m;
  if (o.policy == SelectionPolicyKind::kQuest || o.policy == SelectionPolicyKind::kInfLlm ||
      o.policy == SelectionPolicyKind::kTokenSelectSpan ||
      o.policy == SelectionPolicyKind::kCascade) {
    return std::min(n, o.n_init + o.k + o.n_local) + m;
  }
  if (o.policy == SelectionPolicyKind::kStreaming) return o.n_init + o.k + o.n_local + m;
  return o.n_init + std::min(o.k, n - o.n_init - o.n_local) + o.n_local + m;
}

// The step's selection query (the new tokens' queries rotated at n_local + i, averaged) into
// `out` ([num_heads * head_dim], this rank's heads).
absl::Status BuildStepQuery(const SelectionOptions& o, const ModelConfig& c,
                            const CudaAttentionQuery& query, float* out) {
  return CudaStatus(
      kc::BuildSelectionQuery(out, query.q, query.q_row_stride, query.num_new, c.num_heads,
                              c.head_dim, o.n_local, query.inv_freq, query.stream),
      "BuildSelectionQuery");
}

// The coarse-to-fine launchers' view of a step (span_scoring.h): the selection query, the
// layer's keys over every cached token's slot, the shape and the budget.
kc::SelectionProblem StepProblem(const SelectionOptions& o, const ModelConfig& c,
                                 const CudaAttentionQuery& query, const float* selection_query) {
  kc::SelectionProblem pr;
  pr.query = selection_query;
  pr.k_cache = query.k_cache;
  pr.kv_type = KernelKvType(query.kv_dtype);
  pr.k_scale = query.k_scale;
  pr.slots = query.token_slots;
  pr.num_tokens = query.cache_length;
  pr.num_heads = c.num_heads;
  pr.num_kv_heads = c.num_kv_heads;
  pr.head_dim = c.head_dim;
  pr.scale = o.scale;
  pr.n_init = o.n_init;
  pr.k = o.k;
  pr.n_local = o.n_local;
  return pr;
}

}  // namespace

struct CudaSelectionAttention::Device {
  DeviceArena arena;
  float* query = nullptr;              // [H * d] the step's selection query (this rank's heads)
  float* full_query = nullptr;         // [tp_size * H * d] every rank's (tensor parallelism)
  float* logits = nullptr;             // [max_candidates, H]
  float* head_max = nullptr;           // [H]
  float* head_inv_sum = nullptr;       // [H]
  float* vote = nullptr;               // [max_candidates]
  void* score_workspace = nullptr;
  void* stats_workspace = nullptr;  // TP-invariant numerics: HeadSoftmaxStats'
  void* topk_workspace = nullptr;
  // BoundVoteSelect's workspace (one GPU, long lists: Create's bound_vote_min_candidates), and
  // the least candidate bound that uses it.
  void* bound_workspace = nullptr;
  int64_t bound_min_candidates = 0;
  int32_t* prefill_picks = nullptr;    // [k]
  // head_vote: one head's logits (then the ranked row), the votes, one head's picks, the
  // histogram of the votes.
  float* column = nullptr;            // [max_candidates]
  float* counts = nullptr;            // [max_candidates]
  int32_t* head_picks = nullptr;      // [k]
  int32_t* vote_histogram = nullptr;  // [tp_size * H + 1]
  // Per layer: the selection-cache entry and its picks, the hit flag, hit/miss counters.
  float* cached_query = nullptr;       // [L, tp_size * H * d]: over all ranks' heads
  int32_t* cached_valid = nullptr;     // [L]
  int32_t* hit = nullptr;              // [L]
  int32_t* picks = nullptr;            // [L, k]
  int32_t* num_picks = nullptr;        // [L]: tokenselect_span (its pick count is on the device)
  int64_t* counters = nullptr;         // [L, 2]: hits, misses
  // The attention list of the current layer.
  int32_t* indptr = nullptr;           // [2]
  int32_t* indices = nullptr;          // [list capacity]
  int32_t* positions = nullptr;        // [list capacity]
  int32_t* q_positions = nullptr;      // [max_new]
  int32_t* visible = nullptr;          // [max_new]
  // Quest: per layer the page bounds [max_pages, 2, kv_dim] bf16 (kept from step to step: only
  // the pages not yet complete are rebuilt), page scores, the selected set and its count.
  __nv_bfloat16* page_bounds = nullptr;  // [L, max_pages, 2, kv_dim]
  float* page_scores = nullptr;          // [max_pages]
  void* quest_workspace = nullptr;
  int32_t* selected = nullptr;           // [n_init + k + n_local]
  int32_t* num_selected = nullptr;       // [1]
  std::vector<int64_t> complete_pages;   // [L]: pages whose bounds are final
  std::vector<int64_t> seen_tokens;      // [L]: N of the layer's last call
  int64_t max_pages = 0;
  // InfLLM: per layer the received attention of tokens [0, observed[l]) (layer_state.h; the
  // rest count as 0), ChunkReceivedAttention's workspace, the blocks' representatives and
  // scores (the selected set and its count are Quest's buffers above).
  float* received = nullptr;      // [L, max_tokens]
  std::vector<int64_t> observed;  // [L]
  void* received_workspace = nullptr;
  int32_t* rep_slots = nullptr;   // [max_blocks, reps]
  float* block_scores = nullptr;  // [max_blocks]
  void* infllm_workspace = nullptr;
  int64_t max_tokens = 0;
  int64_t max_blocks = 0;
  int64_t max_candidates = 0;
  int64_t max_new = 0;
};

CudaSelectionAttention::CudaSelectionAttention(const SelectionOptions& options,
                                               const ModelConfig& config, int tp_size,
                                               int invariant_shards)
    : options_(options),
      config_(config),
      tp_size_(tp_size),
      invariant_shards_(invariant_shards),
      dev_(std::make_unique<Device>()) {}
CudaSelectionAttention::~CudaSelectionAttention() = default;

absl::StatusOr<std::unique_ptr<CudaSelectionAttention>> CudaSelectionAttention::Create(
    const SelectionOptions& options, const ModelConfig& config, int64_t max_tokens, int64_t max_new,
    int tp_size, int invariant_shards, int64_t bound_vote_min_candidates) {
  RETURN_IF_ERROR(ValidateSelectionOptions(options));
  if (tp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU selection: tensor-parallel size must be >= 1, got ", tp_size));
  }
  if (!ValidInvariantShards(invariant_shards, tp_size) ||
      (invariant_shards != 0 && config.num_kv_heads % (invariant_shards / tp_size) != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPU selection: invariant_shards must be 0, 1, 2 or 4, a multiple of the tensor-parallel "
        "size ",
        tp_size, " dividing the KV heads; got ", invariant_shards));
  }
  switch (options.policy) {
    case SelectionPolicyKind::kTokenSelect:
    case SelectionPolicyKind::kTopK:
    case SelectionPolicyKind::kHeadVote:
    case SelectionPolicyKind::kDense:
    case SelectionPolicyKind::kStreaming:
    case SelectionPolicyKind::kQuest:
    case SelectionPolicyKind::kInfLlm:
    case SelectionPolicyKind::kTokenSelectSpan:
    case SelectionPolicyKind::kCascade:
      break;
    default:
      return absl::UnimplementedError(absl::StrCat(
          "selection.policy ", PolicyName(options.policy),
          " has no GPU implementation yet (GPU policies: tokenselect, topk, quest, infllm, "
          "tokenselect_span, cascade, dense, streaming)"));
  }
  if (options.policy == SelectionPolicyKind::kTokenSelectSpan && invariant_shards > 0) {
    // The chunk map's and the span scores' head sums are not taken in the fixed shard order that
    // TP-invariant numerics need.
    return absl::UnimplementedError(
        "selection.policy tokenselect_span has no TP-invariant numerics on the GPU "
        "(invariant_shards must be 0)");
  }
  if (options.policy == SelectionPolicyKind::kInfLlm && invariant_shards > 0) {
    // Its head sums (received attention, block scores) are not yet taken in the fixed shard
    // order that TP-invariant numerics need.
    return absl::UnimplementedError(
        "selection.policy infllm has no TP-invariant numerics on the GPU (invariant_shards must "
        "be 0)");
  }
  const int64_t group = config.num_heads / std::max<int64_t>(1, config.num_kv_heads);
  const bool quest = options.policy == SelectionPolicyKind::kQuest;
  const bool infllm = options.policy == SelectionPolicyKind::kInfLlm;
  const bool span = options.policy == SelectionPolicyKind::kTokenSelectSpan;
  const bool cascade = options.policy == SelectionPolicyKind::kCascade;
  const bool head_vote = options.policy == SelectionPolicyKind::kHeadVote;
  const bool scores_keys = options.policy == SelectionPolicyKind::kTokenSelect ||
                           options.policy == SelectionPolicyKind::kTopK || head_vote || quest ||
                           infllm || span || cascade;
  if (scores_keys && ((config.head_dim != 64 && config.head_dim != 128) ||
                      (group != 1 && group != 2 && group != 4 && group != 8))) {
    return absl::UnimplementedError(absl::StrCat(
        "selection.policy ", PolicyName(options.policy), " on the GPU needs head_dim 64 or 128 "
        "and a query-head group of 1, 2, 4 or 8; this model has head_dim ", config.head_dim,
        " and group ", group));
  }
  if (max_tokens < 1 || max_new < 1) {
    return absl::InvalidArgumentError("GPU selection: max_tokens and max_new must be >= 1");
  }
  std::unique_ptr<CudaSelectionAttention> s(
      new CudaSelectionAttention(options, config, tp_size, invariant_shards));
  Device& d = *s->dev_;
  const int64_t heads = config.num_heads, row = config.num_heads * config.head_dim;
  const int64_t layers = config.num_layers;
  d.max_new = max_new;
  d.max_candidates = std::max<int64_t>(0, max_tokens - options.n_init - options.n_local);
  const int64_t k = std::min(options.k, std::max<int64_t>(d.max_candidates, 1));
  if (quest && d.max_candidates > 0) {
    const int64_t page = options.baselines.quest_page_size;
    d.max_pages = (d.max_candidates + page - 1) / page;
    const int64_t kv_dim = config.num_kv_heads * config.head_dim;
    RETURN_IF_ERROR(d.arena.Get(row, &d.query));
    RETURN_IF_ERROR(d.arena.Get(layers * d.max_pages * 2 * kv_dim, &d.page_bounds));
    RETURN_IF_ERROR(d.arena.Get(d.max_pages, &d.page_scores));
    char* ws = nullptr;
    RETURN_IF_ERROR(d.arena.Get(
        static_cast<int64_t>(kc::QuestSelectWorkspaceBytes(d.max_pages, options.k, page)), &ws));
    d.quest_workspace = ws;
    RETURN_IF_ERROR(
        d.arena.Get(options.n_init + options.k + options.n_local, &d.selected));
    RETURN_IF_ERROR(d.arena.Get(1, &d.num_selected));
    d.complete_pages.assign(static_cast<size_t>(layers), 0);
    d.seen_tokens.assign(static_cast<size_t>(layers), 0);
  } else if (infllm) {
    // Every step's received attention is kept, whether or not the budget covers the cache yet.
    d.max_tokens = max_tokens;
    RETURN_IF_ERROR(d.arena.Get(layers * max_tokens, &d.received));
    d.observed.assign(static_cast<size_t>(layers), 0);
    char* ws = nullptr;
    RETURN_IF_ERROR(d.arena.Get(
        static_cast<int64_t>(kc::ReceivedAttentionWorkspaceBytes(max_new, heads)), &ws));
    d.received_workspace = ws;
    const int64_t block = options.baselines.infllm_block_size;
    const int64_t reps = options.baselines.infllm_representatives;
    d.max_blocks = (d.max_candidates + block - 1) / block;
    RETURN_IF_ERROR(d.arena.Get(row, &d.query));
    RETURN_IF_ERROR(d.arena.Get(d.max_blocks * reps, &d.rep_slots));
    RETURN_IF_ERROR(d.arena.Get(d.max_blocks, &d.block_scores));
    RETURN_IF_ERROR(d.arena.Get(
        static_cast<int64_t>(kc::InfLlmSelectWorkspaceBytes(d.max_blocks, options.k, block)), &ws));
    d.infllm_workspace = ws;
    RETURN_IF_ERROR(d.arena.Get(options.n_init + options.k + options.n_local, &d.selected));
    RETURN_IF_ERROR(d.arena.Get(1, &d.num_selected));
  } else if (span) {
    // The index is built from every step, whether or not the budget covers the cache yet.
    ASSIGN_OR_RETURN(s->spans_, CudaSpanIndex::Create(options, config, max_tokens, max_new));
    RETURN_IF_ERROR(d.arena.Get(row, &d.query));
    RETURN_IF_ERROR(d.arena.Get(options.n_init + options.k + options.n_local, &d.selected));
    RETURN_IF_ERROR(d.arena.Get(1, &d.num_selected));
    if (tp_size > 1) RETURN_IF_ERROR(d.arena.Get(tp_size * row, &d.full_query));
    RETURN_IF_ERROR(d.arena.Get(layers * tp_size * row, &d.cached_query));
    RETURN_IF_ERROR(d.arena.Get(layers, &d.cached_valid));
    RETURN_IF_ERROR(d.arena.Get(layers, &d.hit));
    RETURN_IF_ERROR(d.arena.Get(layers * k, &d.picks));
    RETURN_IF_ERROR(d.arena.Get(layers, &d.num_picks));
  } else if (cascade) {
    // The step's list is the held tokens and the new ones: at most max_tokens - n_init.
    ASSIGN_OR_RETURN(s->cascade_, CudaCascade::Create(options, layers, max_tokens));
    const int64_t list = std::max<int64_t>(1, max_tokens - options.n_init);
    RETURN_IF_ERROR(d.arena.Get(row, &d.query));
    RETURN_IF_ERROR(d.arena.Get(list * heads, &d.logits));
    RETURN_IF_ERROR(d.arena.Get(heads, &d.head_max));
    RETURN_IF_ERROR(d.arena.Get(heads, &d.head_inv_sum));
    RETURN_IF_ERROR(d.arena.Get(list, &d.vote));
    char* ws = nullptr;
    RETURN_IF_ERROR(d.arena.Get(static_cast<int64_t>(kc::ScoreKeysWorkspaceBytes(heads)), &ws));
    d.score_workspace = ws;
    if (invariant_shards > 0) {
      RETURN_IF_ERROR(
          d.arena.Get(static_cast<int64_t>(kc::HeadSoftmaxStatsWorkspaceBytes(list, heads)), &ws));
      d.stats_workspace = ws;
    }
    RETURN_IF_ERROR(d.arena.Get(options.n_init + options.k + options.n_local, &d.selected));
    RETURN_IF_ERROR(d.arena.Get(1, &d.num_selected));
  } else if (scores_keys && !quest && d.max_candidates > k) {
    RETURN_IF_ERROR(d.arena.Get(row, &d.query));
    RETURN_IF_ERROR(d.arena.Get(d.max_candidates * heads, &d.logits));
    RETURN_IF_ERROR(d.arena.Get(heads, &d.head_max));
    RETURN_IF_ERROR(d.arena.Get(heads, &d.head_inv_sum));
    RETURN_IF_ERROR(d.arena.Get(d.max_candidates, &d.vote));
    char* ws = nullptr;
    RETURN_IF_ERROR(d.arena.Get(static_cast<int64_t>(kc::ScoreKeysWorkspaceBytes(heads)), &ws));
    d.score_workspace = ws;
    if (invariant_shards > 0) {
      RETURN_IF_ERROR(d.arena.Get(
          static_cast<int64_t>(kc::HeadSoftmaxStatsWorkspaceBytes(d.max_candidates, heads)), &ws));
      d.stats_workspace = ws;
    }
    RETURN_IF_ERROR(
        d.arena.Get(static_cast<int64_t>(kc::TopKWorkspaceBytes(d.max_candidates)), &ws));
    d.topk_workspace = ws;
    if (options.policy == SelectionPolicyKind::kTokenSelect && tp_size == 1 &&
        invariant_shards == 0 && d.max_candidates >= bound_vote_min_candidates &&
        kc::BoundVoteSupported(heads, config.num_kv_heads, config.head_dim)) {
      RETURN_IF_ERROR(d.arena.Get(
          static_cast<int64_t>(kc::BoundVoteWorkspaceBytes(d.max_candidates, heads)), &ws));
      d.bound_workspace = ws;
      d.bound_min_candidates = std::max<int64_t>(bound_vote_min_candidates, 1);
    }
    RETURN_IF_ERROR(d.arena.Get(k, &d.prefill_picks));
    if (head_vote) {
      RETURN_IF_ERROR(d.arena.Get(d.max_candidates, &d.column));
      RETURN_IF_ERROR(d.arena.Get(d.max_candidates, &d.counts));
      RETURN_IF_ERROR(d.arena.Get(k, &d.head_picks));
      RETURN_IF_ERROR(d.arena.Get(heads * tp_size + 1, &d.vote_histogram));
    }
    if (tp_size > 1) RETURN_IF_ERROR(d.arena.Get(tp_size * row, &d.full_query));
    RETURN_IF_ERROR(d.arena.Get(layers * tp_size * row, &d.cached_query));
    RETURN_IF_ERROR(d.arena.Get(layers, &d.cached_valid));
    RETURN_IF_ERROR(d.arena.Get(layers, &d.hit));
    RETURN_IF_ERROR(d.arena.Get(layers * k, &d.picks));
  }
  RETURN_IF_ERROR(d.arena.Get(layers * 2, &d.counters));
  const int64_t capacity = options.n_init + options.k + options.n_local + max_new;
  RETURN_IF_ERROR(d.arena.Get(2, &d.indptr));
  RETURN_IF_ERROR(d.arena.Get(capacity, &d.indices));
  RETURN_IF_ERROR(d.arena.Get(capacity, &d.positions));
  RETURN_IF_ERROR(d.arena.Get(max_new, &d.q_positions));
  RETURN_IF_ERROR(d.arena.Get(max_new, &d.visible));
  return s;
}

absl::Status CudaSelectionAttention::Select(const CudaAttentionQuery& query,
                                            CudaAttentionList* list) {
  Device& d = *dev_;
  const SelectionOptions& o = options_;
  const ModelConfig& c = config_;
  const int64_t n = query.cache_length, m = query.num_new;
  if (query.layer < 0 || query.layer >= c.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("GPU selection: layer ", query.layer,
                                                   " outside [0, ", c.num_layers, ")"));
  }
  if (m < 1 || m > d.max_new || n - o.n_init - o.n_local > d.max_candidates) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPU selection: a step of ", m, " new tokens after ", n,
        " cached ones is outside what the provider was created for"));
  }
  const int group_size = query.tp != nullptr ? query.tp->size() : 1;
  if (group_size != tp_size_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU selection: created for a tensor-parallel group of ", tp_size_,
        " but queried by a rank of a group of ", group_size));
  }
  CudaTensorParallel* tp = IsSharded(query.tp) ? query.tp : nullptr;
  cudaStream_t s = query.stream;
  const bool decode = m == 1;
  // A length on the device (a step captured in a graph): n is a bound, the kernels read the
  // current length; the caller accounts each replay (AccountReplay).
  const int32_t* device_n = query.device_cache_length;
  if (device_n != nullptr && !SupportsDeviceLength(query, n)) {
    return absl::InvalidArgumentError(
        "GPU selection: a device-side cache length for a step this provider cannot replay");
  }
  if (device_n == nullptr) Account(query.layer, n, m);
  if (o.policy == SelectionPolicyKind::kInfLlm) RETURN_IF_ERROR(ObserveInfLlm(query));
  if (spans_ != nullptr) RETURN_IF_ERROR(spans_->Observe(query));
  if (o.policy == SelectionPolicyKind::kDense || CoversAll(o, n)) {
    kc::DenseListParams p;
    p.kv_indptr = d.indptr;
    p.q_positions = d.q_positions;
    p.visible = d.visible;
    p.num_cached = n;
    p.device_num_cached.count = device_n;
    p.num_new = m;
    RETURN_IF_ERROR(CudaStatus(kc::FillDenseList(p, s), "FillDenseList"));
    list->kv_indices = query.token_slots;
    list->kv_positions = query.iota;
  } else if (o.policy == SelectionPolicyKind::kQuest || o.policy == SelectionPolicyKind::kInfLlm ||
             spans_ != nullptr || cascade_ != nullptr) {
    RETURN_IF_ERROR(o.policy == SelectionPolicyKind::kQuest    ? SelectQuest(query)
                    : o.policy == SelectionPolicyKind::kInfLlm ? SelectInfLlm(query)
                    : spans_ != nullptr                        ? SelectSpan(query)
                                                               : SelectCascade(query));
    list->kv_indices = d.indices;
    list->kv_positions = d.positions;
  } else {
    kc::SelectedListParams lp;
    lp.kv_indptr = d.indptr;
    lp.kv_indices = d.indices;
    lp.kv_positions = d.positions;
    lp.q_positions = d.q_positions;
    lp.visible = d.visible;
    lp.token_slots = query.token_slots;
    lp.num_cached = n;
    lp.device_num_cached.count = device_n;
    lp.num_new = m;
    lp.n_init = o.n_init;
    if (o.policy == SelectionPolicyKind::kStreaming) {
      lp.n_local = o.k + o.n_local;
    } else {
      const int64_t candidates = n - o.n_init - o.n_local;  // a bound with a device length
      kc::DeviceLength device_candidates;
      device_candidates.count = device_n;
      device_candidates.minus = static_cast<int32_t>(o.n_init + o.n_local);
      RETURN_IF_ERROR(BuildStepQuery(o, c, query, d.query));
      const int32_t* skip = nullptr;
      int32_t* picks = d.prefill_picks;
      if (decode) {  // through the layer's selection cache
        RETURN_IF_ERROR(CheckSelectionCache(query, tp));
        skip = d.hit + query.layer;
        picks = d.picks + query.layer * std::min(o.k, d.max_candidates);
        lp.hit = skip;
        lp.counters = d.counters + 2 * query.layer;
      }
      if (d.bound_workspace != nullptr && tp == nullptr &&
          candidates >= d.bound_min_candidates) {
        // Long lists on one GPU: the bound-vote selection, no logits in memory.
        kc::BoundVoteParams bp;
        bp.score =
            ScoreParams(query.token_slots + o.n_init, candidates, device_candidates, skip, query);
        bp.out = picks;
        bp.k = o.k;
        bp.workspace = d.bound_workspace;
        RETURN_IF_ERROR(CudaStatus(kc::BoundVoteSelect(bp, s), "BoundVoteSelect"));
      } else if (o.policy == SelectionPolicyKind::kHeadVote) {
        RETURN_IF_ERROR(HeadVotePicks(query, candidates, device_candidates, skip, picks));
      } else {
        // One GPU: the top-k ranks the votes as written, so the vote builds its first histogram.
        const bool vote_histogram = tp == nullptr;
        RETURN_IF_ERROR(VoteKeys(query, query.token_slots + o.n_init, candidates, device_candidates,
                                 skip, o.policy != SelectionPolicyKind::kTopK, vote_histogram));
        kc::TopKParams tp;
        tp.out = picks;
        tp.scores = d.vote;
        tp.workspace = d.topk_workspace;
        tp.n = candidates;
        tp.device_n = device_candidates;
        tp.k = o.k;
        tp.skip = skip;
        tp.histogram_ready = vote_histogram;
        RETURN_IF_ERROR(CudaStatus(kc::TopK(tp, s), "TopK"));
      }
      lp.picks = picks;
      lp.num_picks = std::min(o.k, candidates);
      lp.n_local = o.n_local;
    }
    RETURN_IF_ERROR(CudaStatus(kc::BuildSelectedList(lp, s), "BuildSelectedList"));
    list->kv_indices = d.indices;
    list->kv_positions = d.positions;
  }
  list->kv_indptr = d.indptr;
  list->q_positions = d.q_positions;
  list->visible = d.visible;
  list->max_kv_len = ListBound(o, n, m);
  return absl::OkStatus();
}

bool CudaSelectionAttention::SupportsDeviceLength(const CudaAttentionQuery& query,
                                                  int64_t bound) const {
  const SelectionOptions& o = options_;
  if (query.num_new < 1 || query.num_new > dev_->max_new || bound < query.cache_length) {
    return false;
  }
  switch (o.policy) {
    case SelectionPolicyKind::kDense:
      // A dense list of several new tokens grows with the length (ListBound), and with it the
      // prefill kernel's launch plan: decode steps only.
      return query.num_new == 1;
    case SelectionPolicyKind::kStreaming:
    case SelectionPolicyKind::kTokenSelect:
    case SelectionPolicyKind::kTopK:
      // Not covered now means not covered at any longer length: the same path and the same list
      // bound (n_init + k + n_local + num_new) for every length.
      return !CoversAll(o, query.cache_length) &&
             bound - o.n_init - o.n_local <= dev_->max_candidates;
    default:
      return false;
  }
}

void CudaSelectionAttention::AccountReplay(const CudaAttentionQuery& query) {
  Account(query.layer, query.cache_length, query.num_new);
}

void CudaSelectionAttention::Account(int64_t layer, int64_t n, int64_t m) {
  const SelectionOptions& o = options_;
  ++stats_.layer_steps;
  if (m == 1) ++stats_.decode_layer_steps;
  const bool full = o.policy == SelectionPolicyKind::kDense || CoversAll(o, n);
  if (full) {
    ++stats_.full_attention_steps;
  } else if (o.policy == SelectionPolicyKind::kQuest) {
    stats_.candidates_scored += (n - o.n_init - o.n_local + o.baselines.quest_page_size - 1) /
                                o.baselines.quest_page_size;
  } else if (o.policy == SelectionPolicyKind::kInfLlm) {
    // The representatives scored (infllm_policy.cc): min(reps, block length) per block, when a
    // block is kept at all.
    const int64_t block = o.baselines.infllm_block_size;
    const int64_t reps = o.baselines.infllm_representatives;
    const int64_t candidates = n - o.n_init - o.n_local;
    if (o.k / block > 0) {
      const int64_t tail = candidates % block;
      stats_.candidates_scored += candidates / block * reps + std::min(reps, tail);
    }
  } else if (cascade_ != nullptr) {
    stats_.candidates_scored += cascade_->ListBound(layer, n);  // held (a bound) + new
  } else if (spans_ != nullptr) {
    // The index vectors (a bound: the spans that meet the candidates are scored); the kept
    // tokens' soft vote is sized on the device.
    stats_.candidates_scored += spans_->NumIndexTokens(layer);
  } else if (o.policy != SelectionPolicyKind::kStreaming && m != 1) {
    stats_.candidates_scored += n - o.n_init - o.n_local;  // decode goes through the cache
  }
  const int64_t bound = ListBound(o, n, m);
  stats_.attended_tokens += bound;
  if (m == 1) stats_.decode_attended_tokens += bound;
}

// Quest: the selection query, the page bounds of the pages not yet complete (earlier pages never
// change: their tokens and keys are fixed), the page choice, then the list.
absl::Status CudaSelectionAttention::SelectQuest(const CudaAttentionQuery& query) {
  Device& d = *dev_;
  const SelectionOptions& o = options_;
  const ModelConfig& c = config_;
  const int64_t n = query.cache_length, layer = query.layer;
  const int64_t page = o.baselines.quest_page_size;
  const int64_t kv_dim = c.num_kv_heads * c.head_dim;
  cudaStream_t s = query.stream;
  RETURN_IF_ERROR(BuildStepQuery(o, c, query, d.query));
  if (n < d.seen_tokens[layer]) d.complete_pages[layer] = 0;  // the sequence was rewound
  d.seen_tokens[layer] = n;
  const int64_t cand_end = n - o.n_local;
  const int64_t first = d.complete_pages[layer];
  const int64_t first_token = o.n_init + first * page;
  __nv_bfloat16* bounds = d.page_bounds + layer * d.max_pages * 2 * kv_dim;
  if (first_token < cand_end) {
    kc::QuestBoundsParams bp;
    bp.page_bounds = bounds + first * 2 * kv_dim;
    bp.problem.k_cache = query.k_cache;
    bp.problem.kv_type = KernelKvType(query.kv_dtype);
    bp.problem.k_scale = query.k_scale;
    bp.problem.slots = query.token_slots + first_token;
    bp.problem.num_tokens = cand_end - first_token;
    bp.problem.num_heads = c.num_heads;
    bp.problem.num_kv_heads = c.num_kv_heads;
    bp.problem.head_dim = c.head_dim;
    bp.page_size = page;
    RETURN_IF_ERROR(CudaStatus(kc::QuestBuildPageBounds(bp, s), "QuestBuildPageBounds"));
  }
  d.complete_pages[layer] = (cand_end - o.n_init) / page;
  kc::QuestSelectParams qp;
  qp.out.tokens = d.selected;
  qp.out.num_selected = d.num_selected;
  qp.page_scores = d.page_scores;
  qp.page_bounds = bounds;
  qp.problem = StepProblem(o, c, query, d.query);  // keys unread: the bounds stand in
  qp.page_size = page;
  qp.workspace = d.quest_workspace;
  qp.head_parts = invariant_shards_ > 0 ? invariant_shards_ / tp_size_ : 1;
  // QuestSelect's two halves: a page's bound sums over heads, so under tensor parallelism each
  // rank scores with its heads and the ranks add up before the choice.
  RETURN_IF_ERROR(CudaStatus(kc::QuestScorePages(qp, s), "QuestScorePages"));
  if (o.k > 0 && IsSharded(query.tp)) {
    RETURN_IF_ERROR(query.tp->AllReduceSum(d.page_scores, kc::QuestNumPages(qp.problem, page), s));
  }
  RETURN_IF_ERROR(CudaStatus(kc::QuestChoosePages(qp, s), "QuestChoosePages"));
  return ListFromSelected(query);
}

absl::Status CudaSelectionAttention::CheckSelectionCache(const CudaAttentionQuery& query,
                                                         CudaTensorParallel* tp) {
  Device& d = *dev_;
  cudaStream_t s = query.stream;
  // The cosine is over all heads: under tensor parallelism the ranks' queries are gathered first
  // (each rank writes its slice of a zeroed buffer and the sum fills in the rest exactly), so
  // every rank checks the same vectors and decides alike.
  const int64_t row = config_.num_heads * config_.head_dim;
  const int64_t dim = row * tp_size_;
  const float* check_query = d.query;
  if (tp != nullptr) {
    RETURN_IF_ERROR(CudaStatus(kc::PlaceSlice(d.full_query, dim, d.query, tp->rank() * row, row, s),
                               "PlaceSlice"));
    RETURN_IF_ERROR(tp->AllReduceSum(d.full_query, dim, s));
    check_query = d.full_query;
  }
  kc::CacheCheckParams cp;
  cp.hit = d.hit + query.layer;
  cp.cached_query = d.cached_query + query.layer * dim;
  cp.cached_valid = d.cached_valid + query.layer;
  cp.query = check_query;
  cp.dim = dim;
  cp.theta = static_cast<float>(options_.theta);
  return CudaStatus(kc::SelectionCacheCheck(cp, s), "SelectionCacheCheck");
}

absl::Status CudaSelectionAttention::ListFromSelected(const CudaAttentionQuery& query) {
  Device& d = *dev_;
  const SelectionOptions& o = options_;
  kc::TokensListParams lp;
  lp.kv_indptr = d.indptr;
  lp.kv_indices = d.indices;
  lp.kv_positions = d.positions;
  lp.q_positions = d.q_positions;
  lp.visible = d.visible;
  lp.token_slots = query.token_slots;
  lp.tokens = d.selected;
  lp.count = d.num_selected;
  lp.capacity = o.n_init + o.k + o.n_local;
  lp.num_cached = query.cache_length;
  lp.num_new = query.num_new;
  return CudaStatus(kc::ListFromTokens(lp, query.stream), "ListFromTokens");
}

// InfLLM, every step: the new tokens' received attention into the layer's state (zeros for
// tokens between what was observed and this step, as the CPU's resize does; under tensor
// parallelism each rank's heads' share, summed over the ranks).
absl::Status CudaSelectionAttention::ObserveInfLlm(const CudaAttentionQuery& query) {
  Device& d = *dev_;
  const ModelConfig& c = config_;
  const int64_t n = query.cache_length, m = query.num_new, layer = query.layer;
  cudaStream_t s = query.stream;
  if (n + m > d.max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU selection: ", n + m, " tokens exceed the provider's ", d.max_tokens));
  }
  float* received = d.received + layer * d.max_tokens;
  int64_t& observed = d.observed[static_cast<size_t>(layer)];
  if (observed < n) {
    RETURN_IF_ERROR(CudaStatus(
        cudaMemsetAsync(received + observed, 0, (n - observed) * sizeof(float), s), "memset"));
  }
  const kc::ReceivedAttentionParams rp =
      StepChunkParams(query, c, received + n, d.received_workspace);
  RETURN_IF_ERROR(CudaStatus(kc::ChunkReceivedAttention(rp, s), "ChunkReceivedAttention"));
  if (IsSharded(query.tp)) RETURN_IF_ERROR(query.tp->AllReduceSum(received + n, m, s));
  observed = n + m;
  return absl::OkStatus();
}

// InfLLM: the selection query, each block's representatives by received attention, the block
// scores (summed over the ranks' heads under tensor parallelism), the top blocks, then the list.
absl::Status CudaSelectionAttention::SelectInfLlm(const CudaAttentionQuery& query) {
  Device& d = *dev_;
  const SelectionOptions& o = options_;
  const ModelConfig& c = config_;
  cudaStream_t s = query.stream;
  RETURN_IF_ERROR(BuildStepQuery(o, c, query, d.query));
  const kc::SelectionProblem pr = StepProblem(o, c, query, d.query);
  const int64_t block = o.baselines.infllm_block_size;
  const int64_t reps = o.baselines.infllm_representatives;
  kc::InfLlmRepsParams rp;
  rp.rep_slots = d.rep_slots;
  rp.received = d.received + query.layer * d.max_tokens;
  rp.received_size = d.observed[static_cast<size_t>(query.layer)];
  rp.problem = pr;
  rp.block_size = block;
  rp.reps = reps;
  RETURN_IF_ERROR(CudaStatus(kc::InfLlmRepresentatives(rp, s), "InfLlmRepresentatives"));
  kc::InfLlmSelectParams ip;
  ip.out.tokens = d.selected;
  ip.out.num_selected = d.num_selected;
  ip.block_scores = d.block_scores;
  ip.rep_slots = d.rep_slots;
  ip.problem = pr;
  ip.block_size = block;
  ip.reps = reps;
  ip.workspace = d.infllm_workspace;
  RETURN_IF_ERROR(CudaStatus(kc::InfLlmScoreBlocks(ip, s), "InfLlmScoreBlocks"));
  if (o.k / block > 0 && IsSharded(query.tp)) {
    RETURN_IF_ERROR(query.tp->AllReduceSum(d.block_scores, kc::InfLlmNumBlocks(pr, block), s));
  }
  RETURN_IF_ERROR(CudaStatus(kc::InfLlmChooseBlocks(ip, s), "InfLlmChooseBlocks"));
  return ListFromSelected(query);
}

// tokenselect_span: the selection query, then SpanSelect over the layer's span index (kept up
// to date by CudaSpanIndex::Observe), then the list.
absl::Status CudaSelectionAttention::SelectSpan(const CudaAttentionQuery& query) {
  Device& d = *dev_;
  RETURN_IF_ERROR(BuildStepQuery(options_, config_, query, d.query));
  kc::SelectionOutput out;
  out.tokens = d.selected;
  out.num_selected = d.num_selected;
  const kc::SelectionProblem problem = StepProblem(options_, config_, query, d.query);
  // Decode goes through the layer's selection cache, as on the CPU: a hit skips SpanSelect (no
  // key read) and reuses the stored picks; a miss stores SpanSelect's.
  const int64_t layer = query.layer;
  CudaTensorParallel* tp = IsSharded(query.tp) ? query.tp : nullptr;
  const int32_t* hit = nullptr;
  if (query.num_new == 1) {
    RETURN_IF_ERROR(CheckSelectionCache(query, tp));
    hit = d.hit + layer;
  }
  RETURN_IF_ERROR(spans_->Select(layer, problem, out, hit, tp, query.stream));
  if (hit != nullptr) {
    kc::CachedSelectionParams cp;
    cp.out = out;
    cp.picks = d.picks + layer * std::min(options_.k, d.max_candidates);
    cp.num_picks = d.num_picks + layer;
    cp.hit = hit;
    cp.counters = d.counters + 2 * layer;
    cp.problem = problem;
    RETURN_IF_ERROR(CudaStatus(kc::ApplySelectionCache(cp, query.stream), "ApplySelectionCache"));
  }
  return ListFromSelected(query);
}

kc::KeyScoreParams CudaSelectionAttention::ScoreParams(const int32_t* slots, int64_t n,
                                                       kc::DeviceLength device_n,
                                                       const int32_t* skip,
                                                       const CudaAttentionQuery& query) const {
  const Device& d = *dev_;
  kc::KeyScoreParams sp;
  sp.logits = d.logits;
  sp.head_max = d.head_max;
  sp.head_inv_sum = d.head_inv_sum;
  sp.query = d.query;
  sp.k_cache = query.k_cache;
  sp.kv_type = KernelKvType(query.kv_dtype);
  sp.k_scale = query.k_scale;
  sp.slots = slots;
  sp.workspace = d.score_workspace;
  sp.n = n;
  sp.device_n = device_n;
  sp.num_heads = config_.num_heads;
  sp.num_kv_heads = config_.num_kv_heads;
  sp.head_dim = config_.head_dim;
  sp.scale = options_.scale;
  sp.skip = skip;
  return sp;
}

absl::Status CudaSelectionAttention::VoteKeys(const CudaAttentionQuery& query, const int32_t* slots,
                                              int64_t n, kc::DeviceLength device_n,
                                              const int32_t* skip, bool soft_vote,
                                              bool top_k_histogram) {
  Device& d = *dev_;
  cudaStream_t s = query.stream;
  RETURN_IF_ERROR(
      CudaStatus(kc::ScoreKeys(ScoreParams(slots, n, device_n, skip, query), s), "ScoreKeys"));
  if (invariant_shards_ > 0 && soft_vote) {
    // ScoreKeys' sums of exponentials follow its grid, which follows this rank's head count:
    // recompute them in an order fixed by n alone.
    kc::HeadStatsParams hp;
    hp.head_max = d.head_max;
    hp.head_inv_sum = d.head_inv_sum;
    hp.logits = d.logits;
    hp.workspace = d.stats_workspace;
    hp.n = n;
    hp.device_n = device_n;
    hp.num_heads = config_.num_heads;
    hp.skip = skip;
    RETURN_IF_ERROR(CudaStatus(kc::HeadSoftmaxStats(hp, s), "HeadSoftmaxStats"));
  }
  kc::VoteParams vp;
  vp.vote = d.vote;
  vp.logits = d.logits;
  vp.head_max = d.head_max;
  vp.head_inv_sum = d.head_inv_sum;
  vp.n = n;
  vp.device_n = device_n;
  vp.num_heads = config_.num_heads;
  vp.mode = soft_vote ? kc::VoteMode::kSoftVote : kc::VoteMode::kSumLogits;
  vp.skip = skip;
  if (top_k_histogram) vp.top_k_workspace = d.topk_workspace;
  RETURN_IF_ERROR(CudaStatus(kc::VoteFromLogits(vp, s), "VoteFromLogits"));
  // Votes (and summed logits) are sums over heads: add the other ranks' heads. On a cache hit
  // the votes are stale and the sum unused (the top-k skips), but every rank still makes the
  // call, since the hit flag is on the device and collectives must match; the peer-memory
  // all-reduce reads the flag (the same on every rank) and moves nothing.
  if (IsSharded(query.tp)) RETURN_IF_ERROR(query.tp->AllReduceSumUnless(d.vote, n, skip, s));
  return absl::OkStatus();
}

// head_vote: the summed logits (VoteKeys), then each head's top k counted as votes (summed over
// the ranks' heads under tensor parallelism), then the ranking of HeadVote (head_vote.h).
absl::Status CudaSelectionAttention::HeadVotePicks(const CudaAttentionQuery& query,
                                                   int64_t candidates,
                                                   kc::DeviceLength device_candidates,
                                                   const int32_t* skip, int32_t* picks) {
  Device& d = *dev_;
  const SelectionOptions& o = options_;
  cudaStream_t s = query.stream;
  const int32_t* slots = query.token_slots + o.n_init;
  RETURN_IF_ERROR(VoteKeys(query, slots, candidates, device_candidates, skip, false, false));
  RETURN_IF_ERROR(
      CudaStatus(cudaMemsetAsync(d.counts, 0, candidates * sizeof(float), s), "memset"));
  kc::TopKParams tk;
  tk.workspace = d.topk_workspace;
  tk.n = candidates;
  tk.device_n = device_candidates;
  tk.k = o.k;
  tk.skip = skip;
  kc::HeadColumnParams cp;
  cp.column = d.column;
  cp.logits = d.logits;
  cp.n = candidates;
  cp.device_n = device_candidates;
  cp.num_heads = config_.num_heads;
  cp.skip = skip;
  kc::HeadVoteCountParams vp;
  vp.counts = d.counts;
  vp.picks = d.head_picks;
  vp.n = candidates;
  vp.device_n = device_candidates;
  vp.k = o.k;
  vp.skip = skip;
  tk.out = d.head_picks;
  tk.scores = d.column;
  for (int64_t h = 0; h < config_.num_heads; ++h) {
    cp.head = h;
    RETURN_IF_ERROR(CudaStatus(kc::HeadLogitColumn(cp, s), "HeadLogitColumn"));
    RETURN_IF_ERROR(CudaStatus(kc::TopK(tk, s), "TopK"));
    RETURN_IF_ERROR(CudaStatus(kc::AddHeadVotes(vp, s), "AddHeadVotes"));
  }
  if (IsSharded(query.tp)) {
    RETURN_IF_ERROR(query.tp->AllReduceSumUnless(d.counts, candidates, skip, s));
  }
  kc::HeadVoteRankParams rp;
  rp.ranked = d.column;
  rp.histogram = d.vote_histogram;
  rp.counts = d.counts;
  rp.summed = d.vote;
  rp.n = candidates;
  rp.device_n = device_candidates;
  rp.k = o.k;
  rp.max_votes = config_.num_heads * tp_size_;
  rp.skip = skip;
  RETURN_IF_ERROR(CudaStatus(kc::HeadVoteRankScores(rp, s), "HeadVoteRankScores"));
  tk.out = picks;  // over the ranked row, in d.column
  return CudaStatus(kc::TopK(tk, s), "TopK");
}

// cascade: the selection query, the layer's token list (held + new), its soft vote, then the
// cache update, which writes the selected set.
absl::Status CudaSelectionAttention::SelectCascade(const CudaAttentionQuery& query) {
  Device& d = *dev_;
  RETURN_IF_ERROR(BuildStepQuery(options_, config_, query, d.query));
  ASSIGN_OR_RETURN(const CudaCascade::List list, cascade_->Begin(query.layer, query.cache_length,
                                                                 query.token_slots, query.stream));
  kc::DeviceLength length;
  length.count = list.length;
  RETURN_IF_ERROR(VoteKeys(query, list.slots, list.bound, length, nullptr, true, false));
  RETURN_IF_ERROR(cascade_->Finish(query.layer, query.cache_length, d.vote, d.selected,
                                   d.num_selected, query.stream));
  return ListFromSelected(query);
}

absl::StatusOr<std::vector<SelectionLayerState>> CudaSelectionAttention::ExportLayerStates(
    cudaStream_t stream) const {
  std::vector<SelectionLayerState> states;
  if (spans_ != nullptr) {
    RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "span index"));
    return spans_->states();
  }
  if (cascade_ != nullptr) return cascade_->Export(stream);
  if (options_.policy != SelectionPolicyKind::kInfLlm) return states;
  const Device& d = *dev_;
  states.resize(static_cast<size_t>(config_.num_layers));
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    std::vector<float>& received = states[static_cast<size_t>(l)].received;
    received.resize(static_cast<size_t>(d.observed[static_cast<size_t>(l)]));
    if (received.empty()) continue;
    RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(received.data(), d.received + l * d.max_tokens,
                                   received.size() * sizeof(float), cudaMemcpyDeviceToHost, stream),
                   "received attention copy"));
  }
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "received attention copy"));
  return states;
}

absl::Status CudaSelectionAttention::ImportLayerStates(
    const std::vector<SelectionLayerState>& states, cudaStream_t stream) {
  if (states.empty()) return absl::OkStatus();
  if (static_cast<int64_t>(states.size()) != config_.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("final.selection_states has ", states.size(),
                                                   " layers, the model ", config_.num_layers));
  }
  if (spans_ != nullptr) return spans_->Import(states, stream);
  if (cascade_ != nullptr) return cascade_->Import(states, stream);
  if (options_.policy != SelectionPolicyKind::kInfLlm) {
    return absl::UnimplementedError(absl::StrCat("final.selection_states: selection.policy ",
                                                 PolicyName(options_.policy),
                                                 " takes no prefill state on the GPU backend"));
  }
  Device& d = *dev_;
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    const std::vector<float>& received = states[static_cast<size_t>(l)].received;
    if (static_cast<int64_t>(received.size()) > d.max_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("final.selection_states[", l, "] holds ", received.size(),
                       " tokens' received attention; the request has room for ", d.max_tokens));
    }
  }
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    const std::vector<float>& received = states[static_cast<size_t>(l)].received;
    if (!received.empty()) {
      RETURN_IF_ERROR(CudaStatus(
          cudaMemcpyAsync(d.received + l * d.max_tokens, received.data(),
                          received.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
          "received attention copy"));
    }
    d.observed[static_cast<size_t>(l)] = static_cast<int64_t>(received.size());
  }
  // The host vectors may go away once this returns.
  return CudaStatus(cudaStreamSynchronize(stream), "received attention copy");
}

absl::StatusOr<std::vector<SelectionCacheCounters>> CudaSelectionAttention::LayerCacheCounters(
    cudaStream_t stream) const {
  std::vector<int64_t> host(static_cast<size_t>(2 * config_.num_layers));
  RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(host.data(), dev_->counters, host.size() * 8,
                                             cudaMemcpyDeviceToHost, stream),
                             "counters copy"));
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "counters copy"));
  std::vector<SelectionCacheCounters> layers(static_cast<size_t>(config_.num_layers));
  for (size_t l = 0; l < layers.size(); ++l) {
    layers[l].hits = host[2 * l];
    layers[l].misses = host[2 * l + 1];
  }
  return layers;
}

absl::StatusOr<SelectionCacheCounters> CudaSelectionAttention::CacheCounters(
    cudaStream_t stream) const {
  ASSIGN_OR_RETURN(std::vector<SelectionCacheCounters> layers, LayerCacheCounters(stream));
  SelectionCacheCounters total;
  for (const SelectionCacheCounters& c : layers) {
    total.hits += c.hits;
    total.misses += c.misses;
  }
  return total;
}

absl::StatusOr<std::vector<int32_t>> CudaSelectionAttention::LayerPicks(
    int64_t layer, cudaStream_t stream) const {
  if (dev_->picks == nullptr || layer < 0 || layer >= config_.num_layers) {
    return absl::InvalidArgumentError("LayerPicks: no picks for this layer or policy");
  }
  const int64_t k = std::min(options_.k, dev_->max_candidates);
  std::vector<int32_t> picks(static_cast<size_t>(k));
  RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(picks.data(), dev_->picks + layer * k, k * 4,
                                             cudaMemcpyDeviceToHost, stream),
                             "picks copy"));
  int32_t count = static_cast<int32_t>(k);
  if (dev_->num_picks != nullptr) {
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(&count, dev_->num_picks + layer, 4, cudaMemcpyDeviceToHost, stream),
        "picks copy"));
  }
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "picks copy"));
  picks.resize(static_cast<size_t>(std::clamp<int64_t>(count, 0, k)));
  return picks;
}

}  // namespace tokenselect::engine
