// The Llama-family forward pass on one GPU: the CUDA counterpart of Model (model.h), step for
// step, with bf16 weights and KV cache, an fp32 residual stream and fp32 accumulation:
//   x = embed(tokens)                                          (fp32, [m, hidden])
//   per layer:  h = RmsNorm(x)                                 (bf16)
//               qkv = h [Wq; Wk; Wv]^T + [bq; bk; bv]          (one fused GEMM, bf16)
//               write k, v (UN-rotated) into the tokens' slots (KvAppend, paged)
//               list = provider.Select(...)                    (cuda_attention.h, on the device)
//               a = attention(q over the list, RoPE at gather)  (decode kernel for m = 1,
//                                                                chunked-prefill kernel otherwise)
//               x += a Wo^T + bo                               (GEMM epilogue, fp32)
//               h = RmsNorm(x) ; gu = h [Wg; Wu]^T + [bg; bu]  (one fused GEMM)
//               x += (silu(g) * u) Wd^T + bd                   (GEMM epilogue, fp32)
//   logits = RmsNorm(x[last]) lm_head^T                        (fp32)
// A Forward call of m tokens runs them as one step (a prefill chunk: m rows per GEMM) when m <=
// max_chunk, and as consecutive steps of max_chunk otherwise. Decode steps (m = 1) and full
// prefill chunks without logits replay one CUDA graph of the whole step when every row's
// attention provider can take its cache length on the device (cuda_model_step_graph.cc), and
// otherwise graphs of the shape-static parts (everything between one layer's attention and the
// next's: o_proj, MLP, norms, qkv GEMM, KV append) with selection and attention launched one by
// one. Attention goes through the tuned kernels for head_dim 64/128 and group 1/2/4/8, and
// through the simple kernels otherwise (the tiny test presets).
//
// The KV cache is a pool of max_tokens slots in pages of page_size, shared by sequences
// (CudaSequence: one request's pages and token -> slot map); pages are handed out in a scrambled
// order, so slots are not positions. DecodeBatch advances several sequences by one token in one
// step: the GEMMs run once over all rows (the weights are read once per step, not once per
// request), attention runs per sequence over its own list. The Forward overloads without a
// sequence use a default sequence that takes the whole pool (one request at a time).
// Not thread-safe; everything runs on one stream owned by the model.
//
// Tensor parallelism (CudaModelOptions::tp, docs/parallel.md): one CudaModel per GPU holds its
// rank's heads and MLP columns; the partial o_proj and down_proj products are all-reduced (fp32)
// into the residual stream, so every rank keeps the same x and the same logits.
//
// FP8 KV cache (CudaModelOptions::kv_dtype, docs/fp8_kv.md): the pool holds e4m3 bytes, half of
// bf16's, so the same memory holds twice the tokens. KvAppend stores e4m3(k / s) with one
// power-of-two scale per (layer, KV head) for K and one for V, computed at construction from the
// device weights (engine/model/kv_scales.h; under tensor parallelism a rank's scales are its
// heads' slice of the whole model's); every kernel that reads the cache dequantizes as it reads.
#ifndef TOKENSELECT_ENGINE_MODEL_CUDA_MODEL_H_
#define TOKENSELECT_ENGINE_MODEL_CUDA_MODEL_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/cuda_attention.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/kv_cache_dtype.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"

namespace tokenselect::engine {

struct CudaModelOptions {
  int64_t max_tokens = 4096;  // KV capacity of the pool, in tokens (rounded up to pages)
  int64_t page_size = 16;
  int64_t max_chunk = 512;    // most tokens per step (prefill chunk, or rows of a decode batch)
  int64_t max_batch = 64;     // most sequences per DecodeBatch (rows of logits kept)
  bool use_graphs = true;     // CUDA graphs for decode steps
  // With use_graphs, also for full prefill chunks (max_chunk tokens, no logits: every chunk of a
  // prompt but its last): the whole chunk as one graph where the provider takes the length on
  // the device (cuda_model_step_graph.cc; TokenSelect, top-k and streaming past their budget),
  // otherwise its shape-static segments, with selection and attention between them launched
  // one by one.
  bool graph_prefill_chunks = true;
  // Cache lengths one capture of a whole step serves (cuda_model_step_graph.cc): a sequence's
  // step graph is captured again (or the graph held updated) each time its length passes a
  // multiple of this.
  int64_t step_graph_bucket = 16384;
  // Capture a whole-step graph the first time its key (rows, providers, bounds) is seen rather
  // than the second. Off by default: a batch whose composition changes every step would pay a
  // capture per step. On for one-request generation (`tokenselect generate`), where the rows
  // never change and the first decode step would otherwise run by segments. Then also a
  // Forward or ForwardGreedy of several tokens with logits (a prompt's end) captures the next
  // one-token step's graph before it waits for the GPU: the capture's host time overlaps the
  // prompt's last chunk instead of delaying the first decode step.
  bool capture_on_first_sight = false;
  // Element type of the KV cache (kv_cache_dtype.h): bf16, or e4m3 with per-head scales.
  KvCacheDType kv_dtype = KvCacheDType::kBF16;
  // Tensor parallelism (docs/parallel.md; engine/parallel/tp_cuda_model.h drives N of these).
  int device = -1;                  // CUDA device of the model; -1: the caller's current device
  CudaTensorParallel* tp = nullptr;  // the rank's group (not owned); null or size 1: no sharding
  // TP-invariant numerics (docs/parallel.md): 0 off; S in {1, 2, 4}: the logits do not depend
  // on the tensor-parallel size T, bit for bit, for every T dividing S. The row-parallel GEMMs
  // (o_proj, down_proj) sum S k-slices in a fixed binary tree (T = 1 runs S GEMMs per layer, T
  // = S one per rank and the all-reduce adds the tree's top), the column-parallel GEMMs run the
  // algorithm chosen for the whole model's shape (kernels/cuda/gemm.h plan_n), and the
  // attention kernels split their lists as a shard of S would (DecodeSplits). Selection
  // providers need the same S (CudaSelectionAttention::Create's invariant_shards; CudaBackend
  // passes it). Over more than 2 GPUs the group must sum in a fixed tree (TpCudaModel makes
  // one). Costs S - 1 more GEMM launches per row-parallel GEMM at T = 1 (docs/parallel.md).
  int invariant_shards = 0;
};

class CudaModel;

// Where a model's KV heads go in host K/V rows that hold more heads (CudaModel::ReadKv /
// WriteKv): under tensor parallelism rank r of N holds KV heads [r H/N, (r+1) H/N) of H, and the
// host rows (the transfer's wire format) hold all H; the rank's heads go to [head_begin,
// head_begin + its num_kv_heads), the other heads' bytes are left as they are (ReadKv) or not
// read (WriteKv). total_heads 0: the rows hold this model's heads only.
struct KvHostSlice {
  int64_t head_begin = 0;
  int64_t total_heads = 0;
};

// One request's KV in a CudaModel's pool: its pages and the slot of every position. Returns its
// pages to the pool when destroyed; must not outlive its model.
class CudaSequence {
 public:
  ~CudaSequence();
  CudaSequence(const CudaSequence&) = delete;
  CudaSequence& operator=(const CudaSequence&) = delete;
  int64_t length() const { return length_; }
  int64_t capacity() const { return static_cast<int64_t>(host_slots_.size()); }
  // Forgets the tokens (the pages stay reserved).
  void Reset() { length_ = 0; }
  // The cache slot of every position [0, capacity) (for K/V transfer).
  absl::Span<const int32_t> slots() const { return host_slots_; }

 private:
  friend class CudaModel;
  CudaSequence() = default;
  CudaModel* model_ = nullptr;
  uint64_t id_ = 0;  // unique over the process's lifetime (whole-step graphs are keyed by it)
  std::vector<int32_t> pages_;
  std::vector<int32_t> host_slots_;  // [capacity]: slot of position i
  int32_t* slots_ = nullptr;         // the same on the device
  int64_t length_ = 0;
};

class CudaModel {
 public:
  // Uploads `weights` (rounded to bf16; fused q|k|v and gate|up) and allocates the KV cache.
  // InvalidArgument for a config/weights mismatch or bad options (with an FP8 KV cache also for
  // k/v weights whose scale bound is not finite, naming the layer); ResourceExhausted when device
  // memory runs out; Internal for other CUDA or cuBLASLt errors.
  static absl::StatusOr<std::unique_ptr<CudaModel>> Create(const ModelConfig& config,
                                                           const ModelWeights& weights,
                                                           const CudaModelOptions& options = {});
  // The same with LoadDummyWeights' values (rounded to bf16), generated slab by slab on the host
  // so that 8B-scale shapes never need their fp32 weights in host memory.
  static absl::StatusOr<std::unique_ptr<CudaModel>> CreateDummy(
      const ModelConfig& config, const DummyWeightOptions& dummy,
      const CudaModelOptions& options = {});
  // OK when a CUDA device can be used; FailedPrecondition naming the CUDA error otherwise (no GPU,
  // or a driver older than the runtime). Create and CreateDummy check it first.
  static absl::Status CheckDevice();
  // Tensor parallelism: the config one rank of a tp_size-way group runs (num_heads, num_kv_heads
  // and intermediate_size divided by tp_size; everything else unchanged). InvalidArgument naming
  // the config.json field that tp_size does not divide, or for tp_size < 1. With options.tp set,
  // Create/CreateDummy take the whole model's config and weights, upload only the rank's shard
  // (its q/k/v/gate/up rows, its o_proj/down_proj columns; embeddings, norms and lm_head whole)
  // and config() is this shard config.
  static absl::StatusOr<ModelConfig> ShardConfig(const ModelConfig& config, int tp_size);

  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  // Reserves pages for a sequence of up to max_tokens tokens. ResourceExhausted (saying how many
  // pages are free) when the pool cannot hold it; InvalidArgument for max_tokens < 1.
  absl::StatusOr<std::unique_ptr<CudaSequence>> NewSequence(int64_t max_tokens);

  // Appends `tokens` to `seq`, attending through `attention` (nullptr: dense), and, when `logits`
  // is not null, writes the last token's logits ([vocab], fp32; waits for the GPU).
  // InvalidArgument for no tokens, an id outside the vocabulary or a sequence of another model;
  // ResourceExhausted when the sequence would pass its capacity (nothing is appended then); the
  // provider's errors as they are.
  absl::Status Forward(CudaSequence* seq, absl::Span<const int32_t> tokens,
                       CudaAttentionProvider* attention, std::vector<float>* logits);
  // Forward whose last token's logits stay on the device: only their greedy token crosses to
  // the host - the lowest id holding the largest logit, as the CPU sampler picks at temperature
  // 0 - or -1 when the logits hold a NaN or +inf or only -inf (which the CPU sampler refuses;
  // CopyLastLogits gives them). Errors as Forward's.
  absl::StatusOr<int32_t> ForwardGreedy(CudaSequence* seq, absl::Span<const int32_t> tokens,
                                        CudaAttentionProvider* attention);
  // Row 0 of the last step's logits ([vocab], fp32; waits for the GPU). FailedPrecondition when
  // the last step produced none.
  absl::Status CopyLastLogits(std::vector<float>* logits);

  // One decode step of several sequences: row b appends tokens[b] to seqs[b], attending through
  // attention[b] (nullptr: dense). When `logits` is not null it gets [batch, vocab]. Errors as
  // Forward's, checked for every row before anything runs; InvalidArgument also for a batch that
  // is empty, larger than max_batch, of mismatched sizes, or that names a sequence twice.
  absl::Status DecodeBatch(absl::Span<CudaSequence* const> seqs, absl::Span<const int32_t> tokens,
                           absl::Span<CudaAttentionProvider* const> attention,
                           std::vector<float>* logits);

  // The default sequence (the whole pool, created on first use): one request at a time.
  absl::Status Forward(absl::Span<const int32_t> tokens, CudaAttentionProvider* attention,
                       std::vector<float>* logits);
  // Dense attention, logits of the last token.
  absl::Status Forward(absl::Span<const int32_t> tokens, std::vector<float>* logits) {
    return Forward(tokens, nullptr, logits);
  }
  // Forgets the default sequence's tokens.
  void Reset();
  int64_t length() const;

  // The greedy token of each of the last step's logits rows (row 0 after a Forward; rows
  // [0, batch) after a DecodeBatch), chosen on the GPU (lowest id on ties).
  absl::StatusOr<int32_t> GreedyToken();
  absl::StatusOr<std::vector<int32_t>> GreedyTokens();

  int64_t num_pages() const;
  int64_t free_pages() const;
  const ModelConfig& config() const { return config_; }  // the shard's under tensor parallelism
  const CudaModelOptions& options() const { return options_; }
  cudaStream_t stream() const;
  // Bytes of device memory held for weights and for the KV cache (num_slots x 2 x layers x
  // kv_dim x kv_element_bytes(); the FP8 scales are not counted).
  int64_t weight_bytes() const { return weight_bytes_; }
  int64_t kv_bytes() const { return kv_bytes_; }
  // Whole-step graphs (cuda_model_step_graph.cc): decode steps captured and replayed; full
  // prefill chunks captured (updated: a capture applied to the graph held, no new
  // instantiation) and replayed.
  struct StepGraphCounts {
    int64_t captures = 0;
    int64_t replays = 0;
    int64_t chunk_captures = 0;
    int64_t chunk_updates = 0;
    int64_t chunk_replays = 0;
  };
  const StepGraphCounts& step_graph_counts() const { return step_graph_counts_; }
  // The KV cache's element type and its size in bytes (2 for bf16, 1 for FP8).
  KvCacheDType kv_dtype() const { return options_.kv_dtype; }
  int64_t kv_element_bytes() const { return KvCacheElementBytes(options_.kv_dtype); }
  // FP8 only: a host copy of the scales, [num_layers, 2, num_kv_heads] (kv_scales.h; this rank's
  // KV heads under tensor parallelism); empty for bf16.
  const std::vector<float>& kv_scales() const { return kv_scales_; }

  // --- K/V transfer (cuda_model_kv.cc; engine/transfer, docs/kv_transfer.md) ---
  // Copies layers [layer_begin, layer_end) x positions [token_begin, token_end) of `seq` to the
  // host buffer `out` in the kv_pack staging layout [layers, 2, tokens, num_kv_heads * head_dim]
  // of the cache's elements (the KvChunk payload: bf16, or for an FP8 cache its raw e4m3 bytes,
  // kv_element_bytes() each), after the work queued so far; waits for the copy.
  // InvalidArgument for ranges outside the layers or the sequence's capacity, or a sequence of
  // another model.
  // `slice` places this model's KV heads among more (KvHostSlice above).
  absl::Status ReadKv(const CudaSequence& seq, int64_t layer_begin, int64_t layer_end,
                      int64_t token_begin, int64_t token_end, void* out,
                      KvHostSlice slice = KvHostSlice());
  // The reverse: writes `in` (same layout) into the positions' slots; waits for the copy.
  absl::Status WriteKv(CudaSequence* seq, int64_t layer_begin, int64_t layer_end,
                       int64_t token_begin, int64_t token_end, const void* in,
                       KvHostSlice slice = KvHostSlice());
  // Makes positions [0, length) of `seq` its tokens (their K/V arrived by WriteKv or a device
  // link). InvalidArgument beyond its capacity or for a sequence of another model.
  absl::Status SetLength(CudaSequence* seq, int64_t length);
  // Blocks until the work queued on the model's stream has run.
  absl::Status Synchronize();
  // Layer `layer`'s K or V cache: [num_slots, num_kv_heads * head_dim] on the device, bf16 (for
  // an FP8 cache the same address holds e4m3 bytes: use the untyped accessors and
  // kv_element_bytes()).
  __nv_bfloat16* k_cache(int64_t layer) const;
  __nv_bfloat16* v_cache(int64_t layer) const;
  void* k_cache_data(int64_t layer) const;
  void* v_cache_data(int64_t layer) const;
  // FP8 only: layer `layer`'s K or V scales on the device, [num_kv_heads] fp32 (null for bf16).
  const float* k_scale(int64_t layer) const;
  const float* v_scale(int64_t layer) const;
  int64_t num_slots() const;

 private:
  friend class CudaSequence;
  struct Device;
  class TensorSource;
  // A step's rows: row r of the activations belongs to rows[r].seq.
  struct StepRow {
    CudaSequence* seq;
    int64_t row;      // first activation row
    int64_t count;    // new tokens of this sequence in the step
    CudaAttentionProvider* attention;
  };
  CudaModel(const ModelConfig& config, const CudaModelOptions& options);
  static absl::StatusOr<std::unique_ptr<CudaModel>> Build(const ModelConfig& config,
                                                          const TensorSource& source,
                                                          const CudaModelOptions& options);
  absl::Status CheckTokens(absl::Span<const int32_t> tokens) const;
  absl::Status Step(absl::Span<const StepRow> rows, absl::Span<const int32_t> tokens,
                    int64_t logits_rows);
  absl::Status EnqueueSegment(int64_t segment, int64_t m, int64_t logits_rows);
  absl::Status RunSegment(int64_t segment, int64_t m, int64_t logits_rows);
  // A row's attention for one layer. device_length (with bound): the row's cache length is on
  // the device, for capture in a whole-step graph (CudaAttentionQuery::device_cache_length).
  absl::Status Attention(int64_t layer, const StepRow& row, const int32_t* device_length = nullptr,
                         int64_t bound = 0);
  CudaAttentionQuery LayerQuery(int64_t layer, const StepRow& row) const;
  // The tensor-parallel size this model is a rank of (1: not sharded).
  int64_t TpSize() const;
  // KV splits of the tuned attention kernels for lists of up to max_kv_len tokens (prefill: q
  // queries), planned for this shard's KV heads, or with TP-invariant numerics for those of a
  // shard of S (so every tensor-parallel size splits a list alike, as TP=S would on its own).
  // Every caller that sizes a workspace or launches uses these, so the two always agree.
  int DecodeSplits(int64_t max_kv_len) const;
  int PrefillSplits(int64_t q, int64_t max_kv_len) const;
  // Grows the attention workspace to `bytes` (after waiting for the stream). Where nothing may be
  // allocated inside a step (!may_allocate: tensor parallelism, where Build reserved it, or a
  // whole-step capture, which PlanRows or the chunk's first step reserved for) a shortfall is
  // Internal.
  absl::Status ReserveAttentionWorkspace(size_t bytes, bool may_allocate);
  absl::StatusOr<CudaAttentionProvider*> RowProvider(const StepRow& row);
  // How a step runs a row's attention: rows of one new token, and the one row of a full chunk
  // (max_chunk tokens), whose provider supports it take their cache length from the device
  // (copied in before the step) with a bound, in graphs and eagerly alike, so that both enqueue
  // the same work (cuda_model_step_graph.cc).
  struct RowPlan {
    CudaAttentionProvider* provider;
    int64_t bound;  // > 0: the length is device_lengths[row], at most bound
  };
  // The plan without the lengths' copy (CaptureNextStep plans a step before it runs).
  absl::StatusOr<std::vector<RowPlan>> PlanRowBounds(absl::Span<const StepRow> rows);
  absl::StatusOr<std::vector<RowPlan>> PlanRows(absl::Span<const StepRow> rows);
  // What a whole-step graph serves, per row: empty when some row is not on a device length.
  struct StepGraphRow {
    uint64_t seq_id;
    uint64_t provider_id;
    int64_t bound;  // the cache lengths the graph serves: up to this
    int64_t count;  // new tokens
    bool operator==(const StepGraphRow& o) const {
      return seq_id == o.seq_id && provider_id == o.provider_id && bound == o.bound &&
             count == o.count;
    }
  };
  // The two kinds of whole-step graph held (Device::whole).
  static constexpr int kDecodeGraph = 0;  // one new token per row, logits for every row
  static constexpr int kChunkGraph = 1;   // one row of max_chunk new tokens, no logits
  // Which graphs a step of m new tokens with logits_rows rows of logits replays: kDecodeGraph for
  // a decode step (every row one new token with logits), kChunkGraph for a full prefill chunk
  // without logits (a prompt's chunks but its last), -1 for none (use_graphs off, or any other
  // step). RunSegment replays that kind's segment graphs; Step tries the whole-step graph first.
  int GraphKind(int64_t m, int64_t logits_rows) const;
  static std::vector<StepGraphRow> StepGraphKey(absl::Span<const StepRow> rows,
                                                absl::Span<const RowPlan> plan);
  // Captures the step's graph of kind `kind` for `key`: the graph held of that kind is updated
  // with it where the topology allows (no wait: launches in flight keep their parameters),
  // replaced otherwise. On one GPU a failed capture is reported on stderr and the key marked
  // never to capture (OK, no graph held), under tensor parallelism it is an error.
  absl::Status CaptureStepGraph(int kind, absl::Span<const StepRow> rows,
                                absl::Span<const RowPlan> plan, int64_t logits_rows,
                                const std::vector<StepGraphRow>& key);
  // Destroys the held whole-step graph of kind `kind` after waiting for the stream (none held:
  // nothing).
  absl::Status DropStepGraph(int kind);
  // With capture_on_first_sight: captures the graph of the next one-token step of `seq` now,
  // while the GPU may still run the steps just enqueued (EnqueueForward calls it after a
  // prompt's last chunk), so that the first decode step replays at once.
  absl::Status CaptureNextStep(CudaSequence* seq, CudaAttentionProvider* attention);
  // Forward's checks (errors name `caller`), then its steps (chunks of max_chunk), the last one
  // with logits when `logits`; nothing is copied to the host.
  absl::Status EnqueueForward(const char* caller, CudaSequence* seq,
                              absl::Span<const int32_t> tokens, CudaAttentionProvider* attention,
                              bool logits);
  // A decode step (one new token per row, logits for every row) or a full prefill chunk (kind
  // kChunkGraph: one row, max_chunk tokens, no logits), every row on device lengths, as one
  // replayed CUDA graph; *ran false: nothing was enqueued, run the step by segments.
  absl::Status RunStepGraph(int kind, absl::Span<const StepRow> rows,
                            absl::Span<const RowPlan> plan, int64_t logits_rows, bool* ran);
  // FP8: kv_scales_ from the uploaded weights, and their device copy.
  absl::Status ComputeKvScales();
  absl::StatusOr<CudaSequence*> DefaultSequence();
  void Release(CudaSequence* seq);

  const ModelConfig config_;
  const CudaModelOptions options_;
  std::unique_ptr<Device> dev_;
  std::unique_ptr<CudaSequence> default_seq_;
  int64_t last_logits_rows_ = 0;
  StepGraphCounts step_graph_counts_;
  int64_t weight_bytes_ = 0;
  int64_t kv_bytes_ = 0;
  std::vector<float> kv_scales_;  // FP8: host copy of Device::kv_scales
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_MODEL_CUDA_MODEL_H_
