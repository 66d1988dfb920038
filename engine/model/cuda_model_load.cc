// CudaModel construction: the device, the weights (from a ModelWeights or the dummy
// generator, uploaded slab by slab as bf16 with fused q|k|v and gate|up; under tensor
// parallelism only the rank's slice of each sharded tensor), the page pool and the activation
// buffers.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/model/cuda_model.h"
#include "engine/model/cuda_model_internal.h"
#include "engine/model/kv_scales.h"
#include "engine/model/tp_invariance.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/kernel_attributes.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/selection_list.h"
#include "kernels/ops.h"

namespace tokenselect::engine {
namespace {

namespace kc = kernels::cuda;
using cuda_model_internal::DeviceMemory;
using cuda_model_internal::LayerBuffers;
using kc::CudaStatus;

uint16_t ToBf16Bits(float f) {  // round to nearest even; NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

constexpr int64_t kSlabElements = int64_t{1} << 24;  // host staging per upload copy (64 MiB fp32)

}  // namespace

// Where weight values come from: a loaded ModelWeights, or the dummy generator. Fill writes
// elements [begin, begin + count) of the named tensor as fp32.
class CudaModel::TensorSource {
 public:
  using Fill = std::function<void(const WeightEntry& entry, int64_t begin, int64_t count,
                                  float* out)>;
  TensorSource(const ModelConfig& config, Fill fill) : fill_(std::move(fill)) {
    for (WeightEntry& e : ListWeights(config, nullptr)) entries_.emplace(e.name, std::move(e));
  }
  const WeightEntry* Find(const std::string& name) const {
    auto it = entries_.find(name);
    return it == entries_.end() ? nullptr : &it->second;
  }
  void Read(const WeightEntry& e, int64_t begin, int64_t count, float* out) const {
    fill_(e, begin, count, out);
  }

 private:
  std::map<std::string, WeightEntry> entries_;
  Fill fill_;
};

namespace {

// How a tensor is split across the ranks of a tensor-parallel group, viewing it as [rows, cols]
// (a 1-D tensor is [n, 1]): column-parallel layers (q/k/v, gate/up and their biases) give each
// rank a block of rows (output features), row-parallel ones (o_proj, down_proj) a block of
// columns (input features) of every row. kWhole: replicated (embeddings, norms, lm_head).
enum class Split { kWhole, kRows, kColumns };

struct Shard {
  int parts = 1;
  int index = 0;
};

// A contiguous run of a tensor's elements.
struct ElementRange {
  const WeightEntry* entry;
  int64_t begin;
  int64_t count;
};

void AppendRanges(const WeightEntry* e, Split split, const Shard& shard,
                  std::vector<ElementRange>* out) {
  const int64_t n = e->num_elements();
  const int64_t rows = e->shape.empty() ? 1 : e->shape[0];
  const int64_t cols = rows > 0 ? n / rows : 0;
  if (split == Split::kWhole || shard.parts == 1) {
    out->push_back({e, 0, n});
  } else if (split == Split::kRows) {
    const int64_t block = rows / shard.parts;
    out->push_back({e, shard.index * block * cols, block * cols});
  } else {
    const int64_t block = cols / shard.parts;
    for (int64_t r = 0; r < rows; ++r) out->push_back({e, r * cols + shard.index * block, block});
  }
}

// Uploads the concatenation of the named tensors' parts (absent names, e.g. biases a model does
// not have, are skipped; all absent leaves `out` unallocated) as bf16, or as fp32 when `fp32`.
// Ranges are gathered into host slabs of up to kSlabElements, one copy per slab.
template <typename Source>
absl::Status UploadTensors(const Source& source, std::initializer_list<std::string> names,
                           bool fp32, DeviceMemory* out, int64_t* total_bytes,
                           Split split = Split::kWhole, const Shard& shard = {}) {
  std::vector<ElementRange> ranges;
  for (const std::string& name : names) {
    if (const WeightEntry* e = source.Find(name)) AppendRanges(e, split, shard, &ranges);
  }
  int64_t n = 0;
  for (const ElementRange& r : ranges) n += r.count;
  if (n == 0) return absl::OkStatus();
  const size_t elem = fp32 ? 4 : 2;
  RETURN_IF_ERROR(out->Allocate(static_cast<size_t>(n) * elem));
  *total_bytes += n * static_cast<int64_t>(elem);
  std::vector<float> slab(static_cast<size_t>(std::min(n, kSlabElements)));
  std::vector<uint16_t> bits;
  // The slab's pieces: element runs of the ranges (cut at slab boundaries) and where they go in
  // the slab. Read in parallel: a row-parallel shard is thousands of short runs, each too short
  // for the generator's own threads.
  struct Piece {
    const WeightEntry* entry;
    int64_t begin, count, at;
  };
  std::vector<Piece> pieces;
  int64_t written = 0, staged = 0;
  auto flush = [&]() -> absl::Status {
    if (staged == 0) return absl::OkStatus();
    const int64_t num_pieces = static_cast<int64_t>(pieces.size());
#pragma omp parallel for schedule(dynamic, 16) if (num_pieces > 1)
    for (int64_t i = 0; i < num_pieces; ++i) {
      const Piece& p = pieces[i];
      source.Read(*p.entry, p.begin, p.count, slab.data() + p.at);
    }
    pieces.clear();
    char* dst = out->as<char>() + written * static_cast<int64_t>(elem);
    if (fp32) {
      RETURN_IF_ERROR(CudaStatus(
          cudaMemcpy(dst, slab.data(), staged * 4, cudaMemcpyHostToDevice), "upload"));
    } else {
      bits.resize(static_cast<size_t>(staged));
      const int64_t len = staged;
#pragma omp parallel for schedule(static) if (len >= (1 << 16))
      for (int64_t i = 0; i < len; ++i) bits[i] = ToBf16Bits(slab[i]);
      RETURN_IF_ERROR(CudaStatus(cudaMemcpy(dst, bits.data(), len * 2, cudaMemcpyHostToDevice),
                                 "upload"));
    }
    written += staged;
    staged = 0;
    return absl::OkStatus();
  };
  const int64_t capacity = static_cast<int64_t>(slab.size());
  for (const ElementRange& r : ranges) {
    for (int64_t off = 0; off < r.count;) {
      const int64_t len = std::min(r.count - off, capacity - staged);
      pieces.push_back({r.entry, r.begin + off, len, staged});
      staged += len;
      off += len;
      if (staged == capacity) RETURN_IF_ERROR(flush());
    }
  }
  return flush();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(const ModelConfig& config,
                                                             const ModelWeights& weights,
                                                             const CudaModelOptions& options) {
  RETURN_IF_ERROR(ValidateModelConfig(config));
  RETURN_IF_ERROR(CheckWeightShapes(config, weights));
  std::map<std::string, const std::vector<float>*> data;
  for (const ConstWeightEntry& e : ListWeights(config, weights)) data[e.name] = e.data;
  TensorSource source(config, [&data](const WeightEntry& e, int64_t begin, int64_t count,
                                      float* out) {
    std::memcpy(out, data.at(e.name)->data() + begin, static_cast<size_t>(count) * 4);
  });
  return Build(config, source, options);
}

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::CreateDummy(
    const ModelConfig& config, const DummyWeightOptions& dummy, const CudaModelOptions& options) {
  RETURN_IF_ERROR(ValidateModelConfig(config));
  TensorSource source(config, [&dummy](const WeightEntry& e, int64_t begin, int64_t count,
                                       float* out) {
    FillDummyTensor(e.name, e.kind, e.fan_in, dummy, begin, count, out);
  });
  return Build(config, source, options);
}

absl::StatusOr<ModelConfig> CudaModel::ShardConfig(const ModelConfig& config, int tp_size) {
  if (tp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel size must be >= 1, got ", tp_size));
  }
  for (const auto& [field, value] :
       {std::pair<const char*, int64_t>{"num_attention_heads", config.num_heads},
        {"num_key_value_heads", config.num_kv_heads},
        {"intermediate_size", config.intermediate_size}}) {
    if (value % tp_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor-parallel size ", tp_size,
                                                     " does not divide ", field, " (", value,
                                                     ")"));
    }
  }
  ModelConfig shard = config;
  shard.num_heads /= tp_size;
  shard.num_kv_heads /= tp_size;
  shard.intermediate_size /= tp_size;
  return shard;
}

absl::Status CudaModel::CheckDevice() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear it
    return absl::FailedPreconditionError(absl::StrCat(
        "no usable CUDA device (", err != cudaSuccess ? cudaGetErrorString(err) : "0 devices",
        "); run on a GPU host or use the CPU backend"));
  }
  return absl::OkStatus();
}

// The scale rule of kv_scales.h over the device's bf16 weights (exactly the values the CPU model
// rounds to): per layer the row bounds of the fused qkv weight's k and v rows (KvRowBounds, in
// double), then on the host the per-head maximum and the power of two (KvScaleFromBound, the
// CPU's own function). Under tensor parallelism the buffers hold the rank's rows, so the scales
// are the rank's heads' slice of the whole model's.
absl::Status CudaModel::ComputeKvScales() {
  const ModelConfig& c = config_;
  Device& d = *dev_;
  const int64_t q_dim = c.q_dim(), kv_dim = c.kv_dim(), hkv = c.num_kv_heads, hd = c.head_dim;
  DeviceMemory bounds;
  RETURN_IF_ERROR(bounds.Allocate(static_cast<size_t>(2 * kv_dim) * sizeof(double)));
  std::vector<double> host(static_cast<size_t>(2 * kv_dim));
  kv_scales_.assign(static_cast<size_t>(c.num_layers * 2 * hkv), 1.0f);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerBuffers& b = d.layers[static_cast<size_t>(l)];
    kc::KvRowBoundsParams p;
    p.out = bounds.as<double>();
    p.w = b.qkv.bf16() + q_dim * c.hidden_size;  // the k rows, then the v rows
    p.norm = b.input_norm.bf16();
    p.bias = b.qkv_bias.bytes() > 0 ? b.qkv_bias.bf16() + q_dim : nullptr;
    p.rows = 2 * kv_dim;
    p.hidden = c.hidden_size;
    RETURN_IF_ERROR(CudaStatus(kc::KvRowBounds(p, d.stream), "KvRowBounds"));
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(host.data(), bounds.as<void>(),
                                               host.size() * sizeof(double),
                                               cudaMemcpyDeviceToHost, d.stream),
                               "KV bounds copy"));
    RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(d.stream), "KV bounds copy"));
    for (int v = 0; v < 2; ++v) {
      for (int64_t h = 0; h < hkv; ++h) {
        double bound = 0.0;
        bool finite = true;
        for (int64_t i = 0; i < hd; ++i) {
          const double row = host[static_cast<size_t>(v * kv_dim + h * hd + i)];
          finite = finite && std::isfinite(row);
          bound = std::max(bound, row);
        }
        if (!finite) {
          return absl::InvalidArgumentError(absl::StrCat(
              "FP8 KV scales: model.layers.", l, ".self_attn.", v == 0 ? "k" : "v",
              "_proj (or its bias, or input_layernorm) of KV head ", h,
              IsSharded(options_.tp) ? " of this tensor-parallel rank" : "",
              " has non-finite values"));
        }
        kv_scales_[static_cast<size_t>(KvScaleIndex(l, v, h, hkv))] = KvScaleFromBound(bound);
      }
    }
  }
  RETURN_IF_ERROR(d.kv_scales.Allocate(kv_scales_.size() * sizeof(float)));
  return CudaStatus(cudaMemcpy(d.kv_scales.as<void>(), kv_scales_.data(),
                               kv_scales_.size() * sizeof(float), cudaMemcpyHostToDevice),
                    "KV scales upload");
}

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Build(const ModelConfig& config,
                                                            const TensorSource& source,
                                                            const CudaModelOptions& options) {
  RETURN_IF_ERROR(CheckDevice());
  if (options.max_tokens <= 0 || options.page_size <= 0 || options.max_chunk <= 0 ||
      options.max_batch <= 0 || options.max_batch > options.max_chunk ||
      options.max_tokens > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        "CudaModel: max_tokens, page_size, max_chunk and max_batch must be positive, max_batch <= "
        "max_chunk and max_tokens <= 2^30");
  }
  Shard shard;
  if (options.tp != nullptr) {
    shard.parts = options.tp->size();
    shard.index = options.tp->rank();
    if (shard.index < 0 || shard.index >= shard.parts) {
      return absl::InvalidArgumentError(absl::StrCat("CudaModel: tensor-parallel rank ",
                                                     shard.index, " outside [0, ", shard.parts,
                                                     ")"));
    }
  }
  // Everything below is sized by the rank's shard; `config` still names and shapes the tensors
  // the source reads from.
  ASSIGN_OR_RETURN(const ModelConfig c, ShardConfig(config, shard.parts));
  const int64_t shards = options.invariant_shards;
  if (shards != 0) {
    if (!ValidInvariantShards(shards, shard.parts)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CudaModel: invariant_shards must be 0, 1, 2 or 4 and a multiple of the tensor-parallel "
          "size ",
          shard.parts, ", got ", shards));
    }
    if (shard.parts > 2 && !options.tp->SumsInFixedTree()) {
      // Two ranks add their subtrees exactly in either order; more need an all-reduce that
      // sums in the fixed tree (NCCL's ring order varies with the message).
      return absl::InvalidArgumentError(absl::StrCat(
          "CudaModel: invariant_shards with tensor-parallel size ", shard.parts,
          " needs a group whose all-reduce sums in a fixed tree (TpCudaModel makes one when "
          "its model options ask for invariant_shards)"));
    }
    const int64_t slices = shards / shard.parts;
    if (c.q_dim() % (8 * slices) != 0 || c.intermediate_size % (8 * slices) != 0 ||
        c.hidden_size % 8 != 0) {
      return absl::InvalidArgumentError(absl::StrCat("CudaModel: invariant_shards ", shards,
                                                     " needs q_dim and intermediate_size per rank "
                                                     "divisible by 8 x ",
                                                     slices, " slices and hidden_size by 8 (got ",
                                                     c.q_dim(), ", ", c.intermediate_size, ", ",
                                                     c.hidden_size, ")"));
    }
  }
  RETURN_IF_ERROR(cuda_model_internal::UseDevice(options));
  std::unique_ptr<CudaModel> model(new CudaModel(c, options));
  Device& d = *model->dev_;
  RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  RETURN_IF_ERROR(CudaStatus(kc::GemmRunner::Create(&d.gemm), "cuBLASLt setup"));
  int device = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device), "device query"));
  RETURN_IF_ERROR(CudaStatus(
      cudaDeviceGetAttribute(&d.num_sms, cudaDevAttrMultiProcessorCount, device), "device query"));
  const int64_t group = c.group_size();
  d.tuned_attention = (c.head_dim == 64 || c.head_dim == 128) &&
                      (group == 1 || group == 2 || group == 4 || group == 8);
  // The tuned kernels' shared-memory opt-ins, now: never inside a step (kernel_attributes.h).
  if (d.tuned_attention) {
    RETURN_IF_ERROR(CudaStatus(kc::PrepareAttentionKernels(), "attention kernel setup"));
  }

  // Pages in a scrambled order (odd pages first, then even ones, each descending): slots of
  // consecutive tokens are not consecutive, as in a pool shared by many requests.
  const int64_t num_pages = (options.max_tokens + options.page_size - 1) / options.page_size;
  d.num_pages = num_pages;
  for (int64_t parity : {1, 0}) {
    for (int64_t p = num_pages - 1; p >= 0; --p) {
      if (p % 2 == parity) d.free_pages.push_back(static_cast<int32_t>(p));
    }
  }
  const int64_t num_slots = num_pages * options.page_size;
  const size_t kv_bytes =
      static_cast<size_t>(num_slots * c.kv_dim() * KvCacheElementBytes(options.kv_dtype));

  int64_t* wb = &model->weight_bytes_;
  const bool f32 = true, bf16 = false;
  const bool lead = shard.index == 0;  // adds the row-parallel biases (cuda_model.cc)
  d.layers.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerBuffers& b = d.layers[l];
    const std::string p = absl::StrCat("model.layers.", l, ".");
    const std::string a = p + "self_attn.", m = p + "mlp.";
    RETURN_IF_ERROR(UploadTensors(source, {p + "input_layernorm.weight"}, bf16, &b.input_norm, wb));
    RETURN_IF_ERROR(
        UploadTensors(source, {p + "post_attention_layernorm.weight"}, bf16, &b.post_norm, wb));
    const Split rows = Split::kRows, cols = Split::kColumns;
    RETURN_IF_ERROR(UploadTensors(source,
                                  {a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
                                  bf16, &b.qkv, wb, rows, shard));
    RETURN_IF_ERROR(UploadTensors(source, {a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"},
                                  bf16, &b.qkv_bias, wb, rows, shard));
    RETURN_IF_ERROR(UploadTensors(source, {a + "o_proj.weight"}, bf16, &b.o, wb, cols, shard));
    if (lead) RETURN_IF_ERROR(UploadTensors(source, {a + "o_proj.bias"}, f32, &b.o_bias, wb));
    RETURN_IF_ERROR(UploadTensors(source, {m + "gate_proj.weight", m + "up_proj.weight"}, bf16,
                                  &b.gate_up, wb, rows, shard));
    RETURN_IF_ERROR(UploadTensors(source, {m + "gate_proj.bias", m + "up_proj.bias"}, bf16,
                                  &b.gate_up_bias, wb, rows, shard));
    RETURN_IF_ERROR(
        UploadTensors(source, {m + "down_proj.weight"}, bf16, &b.down, wb, cols, shard));
    if (lead) RETURN_IF_ERROR(UploadTensors(source, {m + "down_proj.bias"}, f32, &b.down_bias, wb));
    RETURN_IF_ERROR(b.k_cache.Allocate(kv_bytes));
    RETURN_IF_ERROR(b.v_cache.Allocate(kv_bytes));
    model->kv_bytes_ += static_cast<int64_t>(2 * kv_bytes);
  }
  if (options.kv_dtype == KvCacheDType::kFP8E4M3) RETURN_IF_ERROR(model->ComputeKvScales());
  RETURN_IF_ERROR(UploadTensors(source, {"model.embed_tokens.weight"}, bf16, &d.embed, wb));
  RETURN_IF_ERROR(UploadTensors(source, {"lm_head.weight"}, bf16, &d.lm_head, wb));  // or tied
  RETURN_IF_ERROR(UploadTensors(source, {"model.norm.weight"}, bf16, &d.norm, wb));
  const std::vector<float> inv_freq = kernels::RopeInverseFrequencies(ToRopeParams(c));
  RETURN_IF_ERROR(d.inv_freq.Allocate(inv_freq.size() * 4));
  RETURN_IF_ERROR(CudaStatus(cudaMemcpy(d.inv_freq.as<void>(), inv_freq.data(),
                                        inv_freq.size() * 4, cudaMemcpyHostToDevice),
                             "upload"));

  const int64_t rows = options.max_chunk;
  const int64_t qkv_dim = c.q_dim() + 2 * c.kv_dim();
  RETURN_IF_ERROR(d.x.Allocate(rows * c.hidden_size * 4));
  if (shards / shard.parts == 4) RETURN_IF_ERROR(d.partial.Allocate(rows * c.hidden_size * 4));
  RETURN_IF_ERROR(d.h.Allocate(rows * c.hidden_size * 2));
  RETURN_IF_ERROR(d.qkv.Allocate(rows * qkv_dim * 2));
  RETURN_IF_ERROR(d.attn.Allocate(rows * c.q_dim() * 2));
  RETURN_IF_ERROR(d.gate_up.Allocate(rows * 2 * c.intermediate_size * 2));
  RETURN_IF_ERROR(d.act.Allocate(rows * c.intermediate_size * 2));
  RETURN_IF_ERROR(d.logits.Allocate(options.max_batch * c.vocab_size * 4));
  RETURN_IF_ERROR(d.tokens.Allocate(rows * 4));
  RETURN_IF_ERROR(d.new_slots.Allocate(rows * 4));
  // Greedy ids of up to max_batch rows; ForwardGreedy's (id, refused) pair uses the first two.
  RETURN_IF_ERROR(d.greedy.Allocate((options.max_batch + 1) * 4));
  RETURN_IF_ERROR(d.row_lengths.Allocate(options.max_batch * 4));
  RETURN_IF_ERROR(d.q_indptr.Allocate(2 * 4));
  const int64_t iota_len = options.max_tokens + options.max_chunk + 1;
  RETURN_IF_ERROR(d.iota.Allocate(iota_len * 4));
  RETURN_IF_ERROR(CudaStatus(kc::FillIota(d.iota.as<int32_t>(), iota_len, d.stream), "FillIota"));
  if (IsSharded(options.tp)) {
    // Tensor parallelism allocates nothing inside a step (see CudaModel::Attention): reserve the
    // attention workspace of the largest plan and the dense rows of a full batch. Splits only
    // grow with the list length, so the longest list bounds the split partials; a gathered list
    // (kernels/cuda/prefill_attention.h) adds its copy up to kPrefillGatherMaxEntries, so the
    // longest list that may still be gathered is the other candidate.
    const int64_t max_kv = options.max_tokens + options.max_chunk;
    size_t ws = 0;
    if (d.tuned_attention) {
      ws = kc::DecodeAttentionWorkspaceBytes(1, c.num_heads, c.head_dim,
                                             model->DecodeSplits(max_kv));
      kc::PrefillAttentionParams pp;
      pp.batch = 1;
      pp.num_heads = c.num_heads;
      pp.num_kv_heads = c.num_kv_heads;
      pp.head_dim = c.head_dim;
      for (int64_t q = 2; q <= options.max_chunk; ++q) {
        pp.total_q = pp.max_q_len = q;
        for (int64_t kv : {std::min(max_kv, kc::kPrefillGatherMaxEntries), max_kv}) {
          pp.max_kv_len = kv;
          pp.num_splits = model->PrefillSplits(q, kv);
          ws = std::max(ws, kc::PrefillAttentionWorkspaceBytes(pp));
        }
      }
    }
    RETURN_IF_ERROR(d.attention_workspace.Allocate(ws));
    for (int64_t r = 0; r < options.max_batch; ++r) {
      d.dense_rows.push_back(std::make_unique<CudaDenseAttention>());
      RETURN_IF_ERROR(CudaDenseAttention::Create(options.max_chunk, d.dense_rows.back().get()));
    }
  }
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(d.stream), "CudaModel setup"));
  return model;
}

}  // namespace tokenselect::engine
