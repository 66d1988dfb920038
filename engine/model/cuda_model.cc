// CudaModel at run time: sequences in the page pool, the forward step (graph-captured segments
// around per-sequence selection and attention), Forward, DecodeBatch and greedy choice.
// Construction and weight upload are in cuda_model_load.cc; decode steps replayed as one graph
// (and the device-side lengths they need) in cuda_model_step_graph.cc.
#include "engine/model/cuda_model.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/model/cuda_model_internal.h"
#include "engine/model/kv_scales.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/simple_attention.h"

namespace tokenselect::engine {
namespace {

namespace kc = kernels::cuda;
using cuda_model_internal::DeviceMemory;
using cuda_model_internal::LayerBuffers;
using kc::CudaStatus;

}  // namespace

CudaModel::CudaModel(const ModelConfig& config, const CudaModelOptions& options)
    : config_(config), options_(options), dev_(std::make_unique<Device>()) {}
CudaModel::~CudaModel() {
  cuda_model_internal::UseDevice(options_).IgnoreError();  // the frees below are on that device
  default_seq_.reset();
}

CudaSequence::~CudaSequence() {
  if (model_ != nullptr) model_->Release(this);
}

void CudaModel::Release(CudaSequence* seq) {
  cuda_model_internal::UseDevice(options_).IgnoreError();
  if (seq->slots_ != nullptr) cudaFree(seq->slots_);  // waits for the device
  seq->slots_ = nullptr;
  dev_->free_pages.insert(dev_->free_pages.begin(), seq->pages_.begin(), seq->pages_.end());
  seq->pages_.clear();
  seq->model_ = nullptr;
}

int64_t CudaModel::num_pages() const { return dev_->num_pages; }

void* CudaModel::k_cache_data(int64_t layer) const {
  return dev_->layers[static_cast<size_t>(layer)].k_cache.as<void>();
}
void* CudaModel::v_cache_data(int64_t layer) const {
  return dev_->layers[static_cast<size_t>(layer)].v_cache.as<void>();
}
const float* CudaModel::k_scale(int64_t layer) const {
  if (dev_->kv_scales.bytes() == 0) return nullptr;
  return dev_->kv_scales.as<float>() + KvScaleIndex(layer, 0, 0, config_.num_kv_heads);
}
const float* CudaModel::v_scale(int64_t layer) const {
  if (dev_->kv_scales.bytes() == 0) return nullptr;
  return dev_->kv_scales.as<float>() + KvScaleIndex(layer, 1, 0, config_.num_kv_heads);
}
int64_t CudaModel::free_pages() const { return static_cast<int64_t>(dev_->free_pages.size()); }

absl::StatusOr<std::unique_ptr<CudaSequence>> CudaModel::NewSequence(int64_t max_tokens) {
  if (max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaModel::NewSequence: max_tokens must be >= 1, got ", max_tokens));
  }
  RETURN_IF_ERROR(cuda_model_internal::UseDevice(options_));
  const int64_t page = options_.page_size;
  const int64_t needed = (max_tokens + page - 1) / page;
  Device& d = *dev_;
  if (needed > static_cast<int64_t>(d.free_pages.size())) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "CudaModel: a sequence of ", max_tokens, " tokens needs ", needed, " KV pages; ",
        d.free_pages.size(), " of ", d.num_pages, " are free"));
  }
  static std::atomic<uint64_t> next_sequence_id{1};
  std::unique_ptr<CudaSequence> seq(new CudaSequence());
  seq->id_ = next_sequence_id.fetch_add(1, std::memory_order_relaxed);
  seq->pages_.assign(d.free_pages.begin(), d.free_pages.begin() + needed);
  d.free_pages.erase(d.free_pages.begin(), d.free_pages.begin() + needed);
  seq->model_ = this;  // from here on the destructor returns the pages
  seq->host_slots_.resize(static_cast<size_t>(max_tokens));
  for (int64_t pos = 0; pos < max_tokens; ++pos) {
    seq->host_slots_[pos] =
        seq->pages_[pos / page] * static_cast<int32_t>(page) + static_cast<int32_t>(pos % page);
  }
  void* slots = nullptr;
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&slots, max_tokens * 4), "cudaMalloc"));
  seq->slots_ = static_cast<int32_t*>(slots);
  RETURN_IF_ERROR(CudaStatus(cudaMemcpy(slots, seq->host_slots_.data(), max_tokens * 4,
                                        cudaMemcpyHostToDevice),
                             "upload"));
  return seq;
}

cudaStream_t CudaModel::stream() const { return dev_->stream; }

// Segment 0: embedding, then layer 0 up to its KV append. Segment s in [1, num_layers]: layer
// s - 1 after its attention (o_proj, MLP), then layer s up to its KV append, or for the last
// segment the final norm and lm_head (of the last row, when `logits`). Every pointer a segment
// reads is fixed for a given m, so decode segments (m = 1) are captured as CUDA graphs.
absl::Status CudaModel::EnqueueSegment(int64_t segment, int64_t m, int64_t logits_rows) {
  const ModelConfig& c = config_;
  Device& d = *dev_;
  cudaStream_t s = d.stream;
  const int64_t hidden = c.hidden_size, q_dim = c.q_dim(), kv_dim = c.kv_dim();
  const int64_t inter = c.intermediate_size, qkv_dim = q_dim + 2 * kv_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  // TP-invariant numerics (CudaModelOptions::invariant_shards): plan_n is the whole model's n.
  const int64_t shards = options_.invariant_shards;
  const int64_t tp_size = TpSize();
  // A GEMM y = x W^T on x's and W's columns [k0, k0 + k) of rows `stride` long (0: k).
  auto linear_slice = [&](void* y, const __nv_bfloat16* x, const __nv_bfloat16* w, const void* bias,
                          int64_t rows, int64_t k, int64_t stride, int64_t n, int64_t plan_n,
                          bool fp32_out, bool accumulate) {
    kc::LinearParams p;
    p.y = y;
    p.x = x;
    p.w = w;
    p.bias = bias;
    p.m = rows;
    p.k = k;
    p.n = n;
    p.x_stride = p.w_stride = stride;
    p.plan_n = shards > 0 ? plan_n : 0;
    p.out = fp32_out ? kc::GemmOutput::kFp32 : kc::GemmOutput::kBf16;
    p.accumulate = accumulate;
    return CudaStatus(d.gemm->Linear(p, s), "Linear");
  };
  // Column-parallel (or replicated) GEMMs: n is the rank's share of the whole n_total.
  auto linear = [&](void* y, const __nv_bfloat16* x, const DeviceMemory& w,
                    const DeviceMemory& bias, int64_t rows, int64_t k, int64_t n, int64_t n_total,
                    bool fp32_out) {
    return linear_slice(y, x, w.bf16(), bias.bytes() > 0 ? bias.as<void>() : nullptr, rows, k, 0, n,
                        n_total, fp32_out, false);
  };
  auto rms_norm = [&](const DeviceMemory& weight, float* x, int64_t rows) {
    kc::RmsNormParams p;
    p.out = d.h.bf16();
    p.x = x;
    p.weight = weight.bf16();
    p.rows = rows;
    p.dim = hidden;
    p.eps = eps;
    return CudaStatus(kc::RmsNorm(p, s), "RmsNorm");
  };
  // Tensor parallelism: o_proj and down_proj are row-parallel, so each rank's GEMM gives a
  // partial sum of the layer's output. Rank 0 adds its partial and the bias to x (the GEMM
  // epilogue), the others write their partial over x, and an all-reduce sums the ranks' x: the
  // old residual and the bias counted once, every partial once, every rank left with the same x.
  //
  // With TP-invariant numerics the whole k splits into S slices whose partial sums (the first
  // with the old x and the bias) meet in a fixed binary tree; rank r of T holds the S / T slices
  // [r S / T, (r + 1) S / T) and sums them as that subtree, the all-reduce adds the subtrees (2
  // ranks: a + b, exact in either order). A pair is one GEMM and an accumulating GEMM
  // (round(a + acc) is the sum of two leaves, the second exact in fp32); four slices add a
  // second pair (in `partial`) to the first.
  CudaTensorParallel* tp = IsSharded(options_.tp) ? options_.tp : nullptr;
  const bool lead = tp == nullptr || tp->rank() == 0;
  DeviceMemory no_bias;
  auto row_parallel = [&](const __nv_bfloat16* in, const DeviceMemory& w, const DeviceMemory& bias,
                          int64_t k) -> absl::Status {
    const void* lead_bias = lead && bias.bytes() > 0 ? bias.as<void>() : nullptr;
    const int64_t slices = shards > 0 ? shards / tp_size : 1;
    if (slices <= 1) {
      RETURN_IF_ERROR(linear_slice(d.x.as<void>(), in, w.bf16(), lead_bias, m, k, 0, hidden, hidden,
                                   true, lead));
    } else {
      const int64_t ks = k / slices;
      auto leaf = [&](void* y, int64_t slice, const void* b, bool accumulate) {
        return linear_slice(y, in + slice * ks, w.bf16() + slice * ks, b, m, ks, k, hidden, hidden,
                            true, accumulate);
      };
      RETURN_IF_ERROR(leaf(d.x.as<void>(), 0, lead_bias, lead));
      RETURN_IF_ERROR(leaf(d.x.as<void>(), 1, nullptr, true));
      if (slices == 4) {
        RETURN_IF_ERROR(leaf(d.partial.as<void>(), 2, nullptr, false));
        RETURN_IF_ERROR(leaf(d.partial.as<void>(), 3, nullptr, true));
        RETURN_IF_ERROR(CudaStatus(
            kc::AddInPlace(d.x.as<float>(), d.partial.as<float>(), m * hidden, s), "AddInPlace"));
      }
    }
    if (tp == nullptr) return absl::OkStatus();
    return tp->AllReduceSum(d.x.as<float>(), m * hidden, s);
  };
  if (segment == 0) {
    kc::EmbeddingParams ep{d.x.as<float>(), d.embed.bf16(), d.tokens.as<int32_t>(), m,
                           hidden,          c.vocab_size};
    RETURN_IF_ERROR(CudaStatus(kc::Embedding(ep, s), "Embedding"));
  } else {
    LayerBuffers& b = d.layers[segment - 1];
    RETURN_IF_ERROR(row_parallel(d.attn.bf16(), b.o, b.o_bias, q_dim));
    RETURN_IF_ERROR(rms_norm(b.post_norm, d.x.as<float>(), m));
    RETURN_IF_ERROR(linear(d.gate_up.as<void>(), d.h.bf16(), b.gate_up, b.gate_up_bias, m, hidden,
                           2 * inter, 2 * inter * tp_size, false));
    kc::SwiGluParams sp;
    sp.out = d.act.bf16();
    sp.gate = d.gate_up.bf16();
    sp.up = d.gate_up.bf16() + inter;
    sp.rows = m;
    sp.cols = inter;
    sp.in_stride = 2 * inter;
    RETURN_IF_ERROR(CudaStatus(kc::SwiGlu(sp, s), "SwiGlu"));
    RETURN_IF_ERROR(row_parallel(d.act.bf16(), b.down, b.down_bias, inter));
  }
  if (segment == c.num_layers) {
    if (logits_rows == 0) return absl::OkStatus();
    RETURN_IF_ERROR(rms_norm(d.norm, d.x.as<float>() + (m - logits_rows) * hidden, logits_rows));
    const DeviceMemory& lm_head = d.lm_head.bytes() > 0 ? d.lm_head : d.embed;
    return linear(d.logits.as<void>(), d.h.bf16(), lm_head, no_bias, logits_rows, hidden,
                  c.vocab_size, c.vocab_size, true);
  }
  LayerBuffers& b = d.layers[segment];
  RETURN_IF_ERROR(rms_norm(b.input_norm, d.x.as<float>(), m));
  RETURN_IF_ERROR(linear(d.qkv.as<void>(), d.h.bf16(), b.qkv, b.qkv_bias, m, hidden, qkv_dim,
                         qkv_dim * tp_size, false));
  kc::KvAppendParams kv;
  kv.k_cache = b.k_cache.as<void>();
  kv.v_cache = b.v_cache.as<void>();
  kv.kv_type = KernelKvType(options_.kv_dtype);
  kv.k_scale = k_scale(segment);
  kv.v_scale = v_scale(segment);
  kv.head_dim = c.head_dim;
  kv.k = d.qkv.bf16() + q_dim;
  kv.v = d.qkv.bf16() + q_dim + kv_dim;
  kv.slots = d.new_slots.as<int32_t>();
  kv.num_tokens = m;
  kv.row = kv_dim;
  kv.src_stride = qkv_dim;
  kv.num_slots = static_cast<int64_t>(b.k_cache.bytes()) / (kv_dim * kv_element_bytes());
  return CudaStatus(kc::KvAppend(kv, s), "KvAppend");
}

absl::Status CudaModel::RunSegment(int64_t segment, int64_t m, int64_t logits_rows) {
  Device& d = *dev_;
  // Decode steps replay graphs of their segments, and so do full prefill chunks (key -m).
  const int kind = GraphKind(m, logits_rows);
  if (kind < 0) return EnqueueSegment(segment, m, logits_rows);
  std::vector<cudaGraphExec_t>& execs = d.graphs[kind == kDecodeGraph ? m : -m];
  if (execs.empty()) execs.assign(static_cast<size_t>(config_.num_layers + 1), nullptr);
  cudaGraphExec_t& exec = execs[segment];
  if (exec == nullptr) {
    RETURN_IF_ERROR(CudaStatus(
        cudaStreamBeginCapture(d.stream, cudaStreamCaptureModeThreadLocal), "graph capture"));
    const absl::Status enqueued = EnqueueSegment(segment, m, logits_rows);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(d.stream, &graph);
    RETURN_IF_ERROR(enqueued);
    RETURN_IF_ERROR(CudaStatus(ended, "graph capture"));
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (made != cudaSuccess) exec = nullptr;
    RETURN_IF_ERROR(CudaStatus(made, "graph instantiate"));
  }
  // Segments after the first end in all-reduces: no rank launches them before all are here.
  if (segment > 0 && IsSharded(options_.tp)) RETURN_IF_ERROR(options_.tp->WaitForRanks());
  return CudaStatus(cudaGraphLaunch(exec, d.stream), "graph launch");
}

CudaAttentionQuery CudaModel::LayerQuery(int64_t layer, const StepRow& row) const {
  const ModelConfig& c = config_;
  Device& d = *dev_;
  LayerBuffers& b = d.layers[layer];
  const int64_t qkv_dim = c.q_dim() + 2 * c.kv_dim();
  CudaAttentionQuery query;
  query.layer = layer;
  query.cache_length = row.seq->length_;
  query.num_new = row.count;
  query.q = d.qkv.bf16() + row.row * qkv_dim;
  query.q_row_stride = qkv_dim;
  query.k_cache = b.k_cache.as<void>();
  query.v_cache = b.v_cache.as<void>();
  query.kv_dtype = options_.kv_dtype;
  query.k_scale = k_scale(layer);
  query.v_scale = v_scale(layer);
  query.token_slots = row.seq->slots_;
  query.iota = d.iota.as<int32_t>();
  query.inv_freq = d.inv_freq.as<float>();
  query.config = &config_;
  query.stream = d.stream;
  query.tp = options_.tp;
  return query;
}

absl::Status CudaModel::ReserveAttentionWorkspace(size_t bytes, bool may_allocate) {
  Device& d = *dev_;
  if (bytes <= d.attention_workspace.bytes()) return absl::OkStatus();
  if (!may_allocate) {
    return absl::InternalError(absl::StrCat("CudaModel: attention workspace of ", bytes,
                                            " bytes was not reserved before the step"));
  }
  // A captured whole-step graph holds the old workspace's address: drop it (after a wait: none
  // in flight); its key's next step captures again. (A prefill that needs more than the decode
  // steps reserved, e.g. a gathered list, comes after them when a sequence is reused.)
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(d.stream), "sync"));
  RETURN_IF_ERROR(DropStepGraph(kDecodeGraph));
  RETURN_IF_ERROR(DropStepGraph(kChunkGraph));
  return d.attention_workspace.Allocate(bytes);
}

// The row's provider, or full attention from the model's own per-row providers.
absl::StatusOr<CudaAttentionProvider*> CudaModel::RowProvider(const StepRow& row) {
  if (row.attention != nullptr) return row.attention;
  Device& d = *dev_;
  if (IsSharded(options_.tp) && row.row >= static_cast<int64_t>(d.dense_rows.size())) {
    return absl::InternalError("CudaModel: dense attention row was not reserved at construction");
  }
  while (static_cast<int64_t>(d.dense_rows.size()) <= row.row) {
    d.dense_rows.push_back(std::make_unique<CudaDenseAttention>());
    RETURN_IF_ERROR(CudaDenseAttention::Create(options_.max_chunk, d.dense_rows.back().get()));
  }
  return d.dense_rows[row.row].get();
}

int CudaModel::GraphKind(int64_t m, int64_t logits_rows) const {
  if (!options_.use_graphs) return -1;
  if (logits_rows == m && m <= options_.max_batch) return kDecodeGraph;
  if (options_.graph_prefill_chunks && logits_rows == 0 && m == options_.max_chunk && m > 1) {
    return kChunkGraph;
  }
  return -1;
}

int64_t CudaModel::TpSize() const { return IsSharded(options_.tp) ? options_.tp->size() : 1; }

namespace {

// The KV heads a split plan is made for (CudaModel::DecodeSplits).
int64_t PlanKvHeads(const ModelConfig& c, const CudaModelOptions& o, int64_t tp_size) {
  return o.invariant_shards == 0 ? c.num_kv_heads
                                 : c.num_kv_heads * tp_size / o.invariant_shards;
}

}  // namespace

int CudaModel::DecodeSplits(int64_t max_kv_len) const {
  return kc::PlanDecodeSplits(1, PlanKvHeads(config_, options_, TpSize()),
                              std::max<int64_t>(1, max_kv_len), dev_->num_sms);
}

int CudaModel::PrefillSplits(int64_t q, int64_t max_kv_len) const {
  const int64_t kv = PlanKvHeads(config_, options_, TpSize());
  return kc::PlanPrefillSplits(1, kv * config_.group_size(), kv, q,
                               std::max<int64_t>(1, max_kv_len), dev_->num_sms);
}

absl::Status CudaModel::Attention(int64_t layer, const StepRow& row, const int32_t* device_length,
                                  int64_t bound) {
  const ModelConfig& c = config_;
  Device& d = *dev_;
  LayerBuffers& b = d.layers[layer];
  const int64_t m = row.count;
  const int64_t qkv_dim = c.q_dim() + 2 * c.kv_dim();
  const __nv_bfloat16* q = d.qkv.bf16() + row.row * qkv_dim;
  __nv_bfloat16* out = d.attn.bf16() + row.row * c.q_dim();
  // Under tensor parallelism nothing is allocated inside a step: with NCCL's peer mappings a
  // cudaFree waits for the other GPUs too, which may be waiting in an all-reduce for this rank's
  // next launch (a deadlock). Build reserves the largest workspace and every dense row instead.
  // Inside a whole-step graph capture nothing may be allocated either: PlanRows reserves for
  // decode steps, a chunk's first step by segments for its later captures.
  const bool may_allocate = !IsSharded(options_.tp) && !d.capturing;
  auto reserve_workspace = [&](size_t bytes) {
    return ReserveAttentionWorkspace(bytes, may_allocate);
  };
  ASSIGN_OR_RETURN(CudaAttentionProvider * attention, RowProvider(row));
  CudaAttentionQuery query = LayerQuery(layer, row);
  const int64_t length = device_length != nullptr ? bound : row.seq->length_;
  query.cache_length = length;
  query.device_cache_length = device_length;
  CudaAttentionList list;
  RETURN_IF_ERROR(attention->Select(query, &list));
  if (list.max_kv_len < 0 || list.max_kv_len > length + m) {
    return absl::InternalError(absl::StrCat("attention provider: max_kv_len ", list.max_kv_len,
                                            " is out of range"));
  }
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  if (m == 1) {
    kc::DecodeAttentionParams ap;
    ap.out = out;
    ap.q = q;
    ap.q_positions = list.q_positions;
    ap.k_cache = b.k_cache.as<void>();
    ap.v_cache = b.v_cache.as<void>();
    ap.kv_type = KernelKvType(options_.kv_dtype);
    ap.k_scale = query.k_scale;
    ap.v_scale = query.v_scale;
    ap.indptr = list.kv_indptr;
    ap.indices = list.kv_indices;
    ap.kv_positions = list.kv_positions;
    ap.inv_freq = d.inv_freq.as<float>();
    ap.batch = 1;
    ap.num_heads = c.num_heads;
    ap.num_kv_heads = c.num_kv_heads;
    ap.head_dim = c.head_dim;
    ap.num_splits = d.tuned_attention ? DecodeSplits(list.max_kv_len) : 1;
    ap.scale = scale;
    if (d.tuned_attention) {
      RETURN_IF_ERROR(reserve_workspace(
          kc::DecodeAttentionWorkspaceBytes(1, c.num_heads, c.head_dim, ap.num_splits)));
    }
    ap.workspace = d.attention_workspace.as<void>();
    return CudaStatus(
        d.tuned_attention ? kc::DecodeAttention(ap, d.stream) : kc::SimpleDecodeAttention(ap, d.stream),
        "decode attention");
  }
  kc::PrefillAttentionParams pp;
  pp.out = out;
  pp.q = q;
  pp.q_row_stride = qkv_dim;
  pp.q_positions = list.q_positions;
  pp.q_indptr = d.q_indptr.as<int32_t>();
  pp.visible = list.visible;
  pp.k_cache = b.k_cache.as<void>();
  pp.v_cache = b.v_cache.as<void>();
  pp.kv_type = KernelKvType(options_.kv_dtype);
  pp.k_scale = query.k_scale;
  pp.v_scale = query.v_scale;
  pp.kv_indptr = list.kv_indptr;
  pp.kv_indices = list.kv_indices;
  pp.kv_positions = list.kv_positions;
  pp.inv_freq = d.inv_freq.as<float>();
  pp.batch = 1;
  pp.total_q = m;
  pp.num_heads = c.num_heads;
  pp.num_kv_heads = c.num_kv_heads;
  pp.head_dim = c.head_dim;
  pp.max_q_len = m;
  pp.max_kv_len = std::max<int64_t>(1, list.max_kv_len);
  pp.scale = scale;
  if (d.tuned_attention) {
    pp.num_splits = PrefillSplits(m, pp.max_kv_len);
    RETURN_IF_ERROR(reserve_workspace(kc::PrefillAttentionWorkspaceBytes(pp)));
  }
  pp.workspace = d.attention_workspace.as<void>();
  return CudaStatus(d.tuned_attention ? kc::PrefillAttention(pp, d.stream)
                                      : kc::SimplePrefillAttention(pp, d.stream),
                    "prefill attention");
}

absl::Status CudaModel::CheckTokens(absl::Span<const int32_t> tokens) const {
  if (tokens.empty()) return absl::InvalidArgumentError("CudaModel: no tokens");
  for (int32_t id : tokens) {
    if (id < 0 || id >= config_.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("CudaModel: token id ", id, " outside the vocabulary"));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaModel::Step(absl::Span<const StepRow> rows, absl::Span<const int32_t> tokens,
                             int64_t logits_rows) {
  Device& d = *dev_;
  cudaStream_t s = d.stream;
  const int64_t m = static_cast<int64_t>(tokens.size());
  // The step's small inputs. Pageable copies are staged before cudaMemcpyAsync returns, so the
  // host memory may change afterwards.
  std::vector<int32_t> new_slots;
  new_slots.reserve(static_cast<size_t>(m));
  for (const StepRow& r : rows) {
    const int32_t* from = r.seq->host_slots_.data() + r.seq->length_;
    new_slots.insert(new_slots.end(), from, from + r.count);
  }
  const int32_t q_indptr[2] = {0, static_cast<int32_t>(m)};
  RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(d.tokens.as<int32_t>(), tokens.data(), m * 4,
                                             cudaMemcpyHostToDevice, s),
                             "copy"));
  RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(d.new_slots.as<int32_t>(), new_slots.data(), m * 4,
                                             cudaMemcpyHostToDevice, s),
                             "copy"));
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(d.q_indptr.as<int32_t>(), q_indptr, 8, cudaMemcpyHostToDevice, s), "copy"));
  ASSIGN_OR_RETURN(const std::vector<RowPlan> plan, PlanRows(rows));
  bool ran = false;
  const int kind = GraphKind(m, logits_rows);
  if (kind == kDecodeGraph || (kind == kChunkGraph && rows.size() == 1)) {
    RETURN_IF_ERROR(RunStepGraph(kind, rows, plan, logits_rows, &ran));
  }
  if (!ran) {
    for (int64_t l = 0; l < config_.num_layers; ++l) {
      RETURN_IF_ERROR(RunSegment(l, m, logits_rows));
      for (size_t r = 0; r < rows.size(); ++r) {
        RETURN_IF_ERROR(Attention(l, rows[r],
                                  plan[r].bound > 0 ? d.row_lengths.as<int32_t>() + r : nullptr,
                                  plan[r].bound));
      }
    }
    RETURN_IF_ERROR(RunSegment(config_.num_layers, m, logits_rows));
  }
  // Rows on device lengths: their providers' host bookkeeping (Select skipped it).
  for (size_t r = 0; r < rows.size(); ++r) {
    if (plan[r].bound == 0) continue;
    for (int64_t l = 0; l < config_.num_layers; ++l) {
      plan[r].provider->AccountReplay(LayerQuery(l, rows[r]));
    }
  }
  for (const StepRow& r : rows) r.seq->length_ += r.count;
  last_logits_rows_ = logits_rows;
  return absl::OkStatus();
}

absl::Status CudaModel::Forward(CudaSequence* seq, absl::Span<const int32_t> tokens,
                                CudaAttentionProvider* attention, std::vector<float>* logits) {
  RETURN_IF_ERROR(EnqueueForward("Forward", seq, tokens, attention, logits != nullptr));
  if (logits == nullptr) return CudaStatus(cudaGetLastError(), "Forward");
  return CopyLastLogits(logits);
}

absl::Status CudaModel::EnqueueForward(const char* caller, CudaSequence* seq,
                                       absl::Span<const int32_t> tokens,
                                       CudaAttentionProvider* attention, bool logits) {
  if (seq == nullptr || seq->model_ != this) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaModel::", caller, ": the sequence belongs to no or another model"));
  }
  RETURN_IF_ERROR(cuda_model_internal::UseDevice(options_));
  RETURN_IF_ERROR(CheckTokens(tokens));
  if (seq->length_ + static_cast<int64_t>(tokens.size()) > seq->capacity()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("CudaModel::", caller, ": ", seq->length_ + tokens.size(),
                     " tokens exceed the sequence's capacity of ", seq->capacity()));
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t begin = 0; begin < n; begin += options_.max_chunk) {
    const int64_t len = std::min(options_.max_chunk, n - begin);
    const StepRow row{seq, 0, len, attention};
    const absl::Status step = Step(absl::MakeConstSpan(&row, 1), tokens.subspan(begin, len),
                                   logits && begin + len == n ? 1 : 0);
    if (!step.ok()) {
      cudaStreamSynchronize(dev_->stream);  // nothing of the failed step may still be running
      return step;
    }
  }
  // The end of a prompt (logits of a step of several tokens): decode steps follow.
  if (logits && n > 1) return CaptureNextStep(seq, attention);
  return absl::OkStatus();
}

absl::StatusOr<int32_t> CudaModel::ForwardGreedy(CudaSequence* seq,
                                                 absl::Span<const int32_t> tokens,
                                                 CudaAttentionProvider* attention) {
  RETURN_IF_ERROR(EnqueueForward("ForwardGreedy", seq, tokens, attention, /*logits=*/true));
  Device& d = *dev_;
  int32_t* picked = d.greedy.as<int32_t>();  // [0]: the id, [1]: refused
  RETURN_IF_ERROR(CudaStatus(kc::Argmax(picked, d.logits.as<float>(), 1, config_.vocab_size,
                                        d.stream, picked + 1),
                             "Argmax"));
  int32_t host[2] = {0, 0};
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(host, picked, sizeof(host), cudaMemcpyDeviceToHost, d.stream), "copy"));
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(d.stream), "ForwardGreedy"));
  return host[1] != 0 ? -1 : host[0];
}

absl::Status CudaModel::CopyLastLogits(std::vector<float>* logits) {
  if (last_logits_rows_ == 0) {
    return absl::FailedPreconditionError("CopyLastLogits: the last step produced no logits");
  }
  RETURN_IF_ERROR(cuda_model_internal::UseDevice(options_));
  logits->resize(static_cast<size_t>(config_.vocab_size));
  RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(logits->data(), dev_->logits.as<void>(), logits->size() * 4,
                                 cudaMemcpyDeviceToHost, dev_->stream),
                 "logits copy"));
  return CudaStatus(cudaStreamSynchronize(dev_->stream), "Forward");
}

absl::Status CudaModel::DecodeBatch(absl::Span<CudaSequence* const> seqs,
                                    absl::Span<const int32_t> tokens,
                                    absl::Span<CudaAttentionProvider* const> attention,
                                    std::vector<float>* logits) {
  const int64_t batch = static_cast<int64_t>(seqs.size());
  if (batch == 0 || batch > options_.max_batch ||
      static_cast<int64_t>(tokens.size()) != batch ||
      static_cast<int64_t>(attention.size()) != batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaModel::DecodeBatch: ", batch, " sequences, ", tokens.size(), " tokens and ",
        attention.size(), " providers (need equal sizes in [1, max_batch = ", options_.max_batch,
        "])"));
  }
  RETURN_IF_ERROR(CheckTokens(tokens));
  RETURN_IF_ERROR(cuda_model_internal::UseDevice(options_));
  std::vector<StepRow> rows;
  for (int64_t b = 0; b < batch; ++b) {
    CudaSequence* seq = seqs[b];
    if (seq == nullptr || seq->model_ != this) {
      return absl::InvalidArgumentError(
          absl::StrCat("CudaModel::DecodeBatch: sequence ", b, " belongs to no or another model"));
    }
    for (int64_t e = 0; e < b; ++e) {
      if (seqs[e] == seq) {
        return absl::InvalidArgumentError(
            absl::StrCat("CudaModel::DecodeBatch: sequence ", b, " is also row ", e));
      }
    }
    if (seq->length_ + 1 > seq->capacity()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "CudaModel::DecodeBatch: sequence ", b, " is full (", seq->capacity(), " tokens)"));
    }
    rows.push_back(StepRow{seq, b, 1, attention[b]});
  }
  const absl::Status step = Step(rows, tokens, logits != nullptr ? batch : 0);
  if (!step.ok()) {
    cudaStreamSynchronize(dev_->stream);
    return step;
  }
  if (logits == nullptr) return CudaStatus(cudaGetLastError(), "DecodeBatch");
  logits->resize(static_cast<size_t>(batch * config_.vocab_size));
  RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(logits->data(), dev_->logits.as<void>(), logits->size() * 4,
                                 cudaMemcpyDeviceToHost, dev_->stream),
                 "logits copy"));
  return CudaStatus(cudaStreamSynchronize(dev_->stream), "DecodeBatch");
}

absl::StatusOr<CudaSequence*> CudaModel::DefaultSequence() {
  if (default_seq_ == nullptr) {
    ASSIGN_OR_RETURN(default_seq_, NewSequence(options_.max_tokens));
  }
  return default_seq_.get();
}

absl::Status CudaModel::Forward(absl::Span<const int32_t> tokens,
                                CudaAttentionProvider* attention, std::vector<float>* logits) {
  ASSIGN_OR_RETURN(CudaSequence * seq, DefaultSequence());
  return Forward(seq, tokens, attention, logits);
}

void CudaModel::Reset() {
  if (default_seq_ != nullptr) default_seq_->Reset();
}

int64_t CudaModel::length() const { return default_seq_ != nullptr ? default_seq_->length() : 0; }

absl::StatusOr<std::vector<int32_t>> CudaModel::GreedyTokens() {
  if (last_logits_rows_ == 0) {
    return absl::FailedPreconditionError("GreedyToken: the last step produced no logits");
  }
  RETURN_IF_ERROR(cuda_model_internal::UseDevice(options_));
  Device& d = *dev_;
  RETURN_IF_ERROR(CudaStatus(kc::Argmax(d.greedy.as<int32_t>(), d.logits.as<float>(),
                                        last_logits_rows_, config_.vocab_size, d.stream),
                             "Argmax"));
  std::vector<int32_t> ids(static_cast<size_t>(last_logits_rows_));
  RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(ids.data(), d.greedy.as<void>(), ids.size() * 4,
                                             cudaMemcpyDeviceToHost, d.stream),
                             "copy"));
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(d.stream), "GreedyToken"));
  return ids;
}

absl::StatusOr<int32_t> CudaModel::GreedyToken() {
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, GreedyTokens());
  return ids[0];
}

}  // namespace tokenselect::engine
