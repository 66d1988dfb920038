#include "engine/model/cuda_model.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/simple_attention.h"
#include "kernels/ops.h"

namespace tokenselect::engine {
namespace {

namespace kc = kernels::cuda;
using kc::CudaStatus;

// An owning device allocation (bytes).
class DeviceMemory {
 public:
  DeviceMemory() = default;
  ~DeviceMemory() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  DeviceMemory(DeviceMemory&& other) noexcept : ptr_(other.ptr_), bytes_(other.bytes_) {
    other.ptr_ = nullptr;
    other.bytes_ = 0;
  }
  absl::Status Allocate(size_t bytes) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = bytes;
    if (bytes == 0) return absl::OkStatus();
    return CudaStatus(cudaMalloc(&ptr_, bytes), "cudaMalloc");
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  __nv_bfloat16* bf16() const { return as<__nv_bfloat16>(); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

uint16_t ToBf16Bits(float f) {  // round to nearest even; NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Uploads the concatenation of `parts` (fp32 host) as bf16, or as fp32 when `fp32` is set.
// Empty parts (absent biases) leave the buffer unallocated.
absl::Status Upload(std::initializer_list<const std::vector<float>*> parts, bool fp32,
                    DeviceMemory* out) {
  size_t n = 0;
  for (const auto* p : parts) n += p->size();
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(out->Allocate(n * (fp32 ? 4 : 2)));
  if (fp32) {
    std::vector<float> host;
    host.reserve(n);
    for (const auto* p : parts) host.insert(host.end(), p->begin(), p->end());
    return CudaStatus(cudaMemcpy(out->as<void>(), host.data(), n * 4, cudaMemcpyHostToDevice),
                      "upload");
  }
  std::vector<uint16_t> host;
  host.reserve(n);
  for (const auto* p : parts) {
    for (float f : *p) host.push_back(ToBf16Bits(f));
  }
  return CudaStatus(cudaMemcpy(out->as<void>(), host.data(), n * 2, cudaMemcpyHostToDevice),
                    "upload");
}

struct LayerBuffers {
  DeviceMemory input_norm, post_norm;  // bf16 [hidden]
  DeviceMemory qkv, qkv_bias;          // bf16 [q_dim + 2 kv_dim, hidden], [q_dim + 2 kv_dim]
  DeviceMemory o, o_bias;              // bf16 [hidden, q_dim], fp32 [hidden]
  DeviceMemory gate_up, gate_up_bias;  // bf16 [2 inter, hidden], [2 inter]
  DeviceMemory down, down_bias;        // bf16 [hidden, inter], fp32 [hidden]
  DeviceMemory k_cache, v_cache;       // bf16 [num_slots, kv_dim]
};

}  // namespace

struct CudaModel::Device {
  cudaStream_t stream = nullptr;
  std::unique_ptr<kc::GemmRunner> gemm;
  std::vector<LayerBuffers> layers;
  DeviceMemory embed, lm_head, norm, inv_freq;
  // Per-step activations (one token).
  DeviceMemory x, h, qkv, attn, gate_up, act, logits, token, greedy;
  // The dense attention list: slot and position of every token so far, CSR indptr, q position.
  DeviceMemory list_slots, list_positions, indptr, q_position, attention_workspace;
  int num_sms = 0;
  bool tuned_attention = false;

  ~Device() {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

CudaModel::CudaModel(const ModelConfig& config, const CudaModelOptions& options)
    : config_(config), options_(options), dev_(std::make_unique<Device>()) {}
CudaModel::~CudaModel() = default;

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(const ModelConfig& config,
                                                             const ModelWeights& weights,
                                                             const CudaModelOptions& options) {
  RETURN_IF_ERROR(ValidateModelConfig(config));
  RETURN_IF_ERROR(CheckWeightShapes(config, weights));
  if (options.max_tokens <= 0 || options.page_size <= 0 ||
      options.max_tokens > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError("CudaModel: max_tokens and page_size must be positive");
  }
  std::unique_ptr<CudaModel> model(new CudaModel(config, options));
  Device& d = *model->dev_;
  const ModelConfig& c = config;
  RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  RETURN_IF_ERROR(CudaStatus(kc::GemmRunner::Create(&d.gemm), "cuBLASLt setup"));
  RETURN_IF_ERROR(CudaStatus(cudaDeviceGetAttribute(&d.num_sms, cudaDevAttrMultiProcessorCount, 0),
                             "device query"));
  const int64_t group = c.group_size();
  d.tuned_attention = (c.head_dim == 64 || c.head_dim == 128) &&
                      (group == 1 || group == 2 || group == 4 || group == 8);

  // Pages in a scrambled order (odd pages first, then even ones, each descending): slots of
  // consecutive tokens are not consecutive, as in a pool shared by many requests.
  const int64_t num_pages = (options.max_tokens + options.page_size - 1) / options.page_size;
  for (int64_t parity : {1, 0}) {
    for (int64_t p = num_pages - 1; p >= 0; --p) {
      if (p % 2 == parity) model->page_order_.push_back(static_cast<int32_t>(p));
    }
  }
  const int64_t num_slots = num_pages * options.page_size;
  const size_t kv_bytes = static_cast<size_t>(num_slots * c.kv_dim()) * 2;

  const bool f32 = true, bf16 = false;
  d.layers.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = weights.layers[l];
    LayerBuffers& b = d.layers[l];
    RETURN_IF_ERROR(Upload({&w.input_layernorm}, bf16, &b.input_norm));
    RETURN_IF_ERROR(Upload({&w.post_attention_layernorm}, bf16, &b.post_norm));
    RETURN_IF_ERROR(Upload({&w.q_proj, &w.k_proj, &w.v_proj}, bf16, &b.qkv));
    RETURN_IF_ERROR(Upload({&w.q_bias, &w.k_bias, &w.v_bias}, bf16, &b.qkv_bias));
    RETURN_IF_ERROR(Upload({&w.o_proj}, bf16, &b.o));
    RETURN_IF_ERROR(Upload({&w.o_bias}, f32, &b.o_bias));
    RETURN_IF_ERROR(Upload({&w.gate_proj, &w.up_proj}, bf16, &b.gate_up));
    RETURN_IF_ERROR(Upload({&w.gate_bias, &w.up_bias}, bf16, &b.gate_up_bias));
    RETURN_IF_ERROR(Upload({&w.down_proj}, bf16, &b.down));
    RETURN_IF_ERROR(Upload({&w.down_bias}, f32, &b.down_bias));
    RETURN_IF_ERROR(b.k_cache.Allocate(kv_bytes));
    RETURN_IF_ERROR(b.v_cache.Allocate(kv_bytes));
  }
  RETURN_IF_ERROR(Upload({&weights.embed_tokens}, bf16, &d.embed));
  RETURN_IF_ERROR(Upload({&weights.lm_head_weight}, bf16, &d.lm_head));  // empty when tied
  RETURN_IF_ERROR(Upload({&weights.norm}, bf16, &d.norm));
  const std::vector<float> inv_freq = kernels::RopeInverseFrequencies(ToRopeParams(c));
  RETURN_IF_ERROR(Upload({&inv_freq}, f32, &d.inv_freq));

  const int64_t qkv_dim = c.q_dim() + 2 * c.kv_dim();
  RETURN_IF_ERROR(d.x.Allocate(c.hidden_size * 4));
  RETURN_IF_ERROR(d.h.Allocate(c.hidden_size * 2));
  RETURN_IF_ERROR(d.qkv.Allocate(qkv_dim * 2));
  RETURN_IF_ERROR(d.attn.Allocate(c.q_dim() * 2));
  RETURN_IF_ERROR(d.gate_up.Allocate(2 * c.intermediate_size * 2));
  RETURN_IF_ERROR(d.act.Allocate(c.intermediate_size * 2));
  RETURN_IF_ERROR(d.logits.Allocate(c.vocab_size * 4));
  RETURN_IF_ERROR(d.token.Allocate(4));
  RETURN_IF_ERROR(d.greedy.Allocate(4));
  RETURN_IF_ERROR(d.list_slots.Allocate(options.max_tokens * 4));
  RETURN_IF_ERROR(d.list_positions.Allocate(options.max_tokens * 4));
  RETURN_IF_ERROR(d.indptr.Allocate(2 * 4));
  RETURN_IF_ERROR(d.q_position.Allocate(4));
  return model;
}

absl::Status CudaModel::Step(int32_t token) {
  const ModelConfig& c = config_;
  Device& d = *dev_;
  cudaStream_t s = d.stream;
  const int64_t pos = length_;
  const int32_t slot =
      page_order_[pos / options_.page_size] * static_cast<int32_t>(options_.page_size) +
      static_cast<int32_t>(pos % options_.page_size);
  // The step's small inputs: token id, the new list entry (slot, position), indptr, q position.
  // Pageable copies are staged before cudaMemcpyAsync returns, so locals are fine.
  const int32_t ints[4] = {token, slot, static_cast<int32_t>(pos), static_cast<int32_t>(pos + 1)};
  const int32_t indptr[2] = {0, ints[3]};
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(d.token.as<int32_t>(), &ints[0], 4, cudaMemcpyHostToDevice, s), "copy"));
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(d.list_slots.as<int32_t>() + pos, &ints[1], 4, cudaMemcpyHostToDevice, s),
      "copy"));
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(d.list_positions.as<int32_t>() + pos, &ints[2], 4, cudaMemcpyHostToDevice, s),
      "copy"));
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(d.q_position.as<int32_t>(), &ints[2], 4, cudaMemcpyHostToDevice, s), "copy"));
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(d.indptr.as<int32_t>(), indptr, 8, cudaMemcpyHostToDevice, s), "copy"));

  const int64_t hidden = c.hidden_size, q_dim = c.q_dim(), kv_dim = c.kv_dim();
  const int64_t inter = c.intermediate_size, qkv_dim = q_dim + 2 * kv_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  auto linear = [&](void* y, const DeviceMemory& x, const DeviceMemory& w, const DeviceMemory& bias,
                    int64_t k, int64_t n, bool fp32_out, bool accumulate) {
    kc::LinearParams p;
    p.y = y;
    p.x = x.bf16();
    p.w = w.bf16();
    p.bias = bias.bytes() > 0 ? bias.as<void>() : nullptr;
    p.m = 1;
    p.k = k;
    p.n = n;
    p.out = fp32_out ? kc::GemmOutput::kFp32 : kc::GemmOutput::kBf16;
    p.accumulate = accumulate;
    return CudaStatus(d.gemm->Linear(p, s), "Linear");
  };
  auto rms_norm = [&](const DeviceMemory& weight) {
    kc::RmsNormParams p;
    p.out = d.h.bf16();
    p.x = d.x.as<float>();
    p.weight = weight.bf16();
    p.rows = 1;
    p.dim = hidden;
    p.eps = eps;
    return CudaStatus(kc::RmsNorm(p, s), "RmsNorm");
  };

  kc::EmbeddingParams ep{d.x.as<float>(), d.embed.bf16(), d.token.as<int32_t>(), 1,
                         hidden,          c.vocab_size};
  RETURN_IF_ERROR(CudaStatus(kc::Embedding(ep, s), "Embedding"));
  const int num_splits =
      d.tuned_attention ? kc::PlanDecodeSplits(1, c.num_kv_heads, pos + 1, d.num_sms) : 1;
  const size_t ws_bytes =
      d.tuned_attention ? kc::DecodeAttentionWorkspaceBytes(1, c.num_heads, c.head_dim, num_splits)
                        : 0;
  if (ws_bytes > d.attention_workspace.bytes()) {
    RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(s), "sync"));
    RETURN_IF_ERROR(d.attention_workspace.Allocate(ws_bytes));
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerBuffers& b = d.layers[l];
    RETURN_IF_ERROR(rms_norm(b.input_norm));
    RETURN_IF_ERROR(
        linear(d.qkv.as<void>(), d.h, b.qkv, b.qkv_bias, hidden, qkv_dim, false, false));
    kc::KvAppendParams kv;
    kv.k_cache = b.k_cache.bf16();
    kv.v_cache = b.v_cache.bf16();
    kv.k = d.qkv.bf16() + q_dim;
    kv.v = d.qkv.bf16() + q_dim + kv_dim;
    kv.slots = d.list_slots.as<int32_t>() + pos;
    kv.num_tokens = 1;
    kv.row = kv_dim;
    kv.src_stride = qkv_dim;
    kv.num_slots = static_cast<int64_t>(b.k_cache.bytes() / 2) / kv_dim;
    RETURN_IF_ERROR(CudaStatus(kc::KvAppend(kv, s), "KvAppend"));

    kc::DecodeAttentionParams ap;
    ap.out = d.attn.bf16();
    ap.q = d.qkv.bf16();
    ap.q_positions = d.q_position.as<int32_t>();
    ap.k_cache = b.k_cache.bf16();
    ap.v_cache = b.v_cache.bf16();
    ap.indptr = d.indptr.as<int32_t>();
    ap.indices = d.list_slots.as<int32_t>();
    ap.kv_positions = d.list_positions.as<int32_t>();
    ap.inv_freq = d.inv_freq.as<float>();
    ap.workspace = d.attention_workspace.as<void>();
    ap.batch = 1;
    ap.num_heads = c.num_heads;
    ap.num_kv_heads = c.num_kv_heads;
    ap.head_dim = c.head_dim;
    ap.num_splits = num_splits;
    ap.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
    RETURN_IF_ERROR(CudaStatus(
        d.tuned_attention ? kc::DecodeAttention(ap, s) : kc::SimpleDecodeAttention(ap, s),
        "attention"));
    RETURN_IF_ERROR(linear(d.x.as<void>(), d.attn, b.o, b.o_bias, q_dim, hidden, true, true));
    RETURN_IF_ERROR(rms_norm(b.post_norm));
    RETURN_IF_ERROR(linear(d.gate_up.as<void>(), d.h, b.gate_up, b.gate_up_bias, hidden, 2 * inter,
                           false, false));
    kc::SwiGluParams sp;
    sp.out = d.act.bf16();
    sp.gate = d.gate_up.bf16();
    sp.up = d.gate_up.bf16() + inter;
    sp.rows = 1;
    sp.cols = inter;
    sp.in_stride = 2 * inter;
    RETURN_IF_ERROR(CudaStatus(kc::SwiGlu(sp, s), "SwiGlu"));
    RETURN_IF_ERROR(linear(d.x.as<void>(), d.act, b.down, b.down_bias, inter, hidden, true, true));
  }
  RETURN_IF_ERROR(rms_norm(d.norm));
  const DeviceMemory& lm_head = d.lm_head.bytes() > 0 ? d.lm_head : d.embed;
  DeviceMemory no_bias;
  RETURN_IF_ERROR(
      linear(d.logits.as<void>(), d.h, lm_head, no_bias, hidden, c.vocab_size, true, false));
  ++length_;
  return absl::OkStatus();
}

absl::Status CudaModel::Forward(absl::Span<const int32_t> tokens, std::vector<float>* logits) {
  if (tokens.empty()) return absl::InvalidArgumentError("CudaModel::Forward: no tokens");
  for (int32_t id : tokens) {
    if (id < 0 || id >= config_.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("CudaModel::Forward: token id ", id, " outside the vocabulary"));
    }
  }
  if (length_ + static_cast<int64_t>(tokens.size()) > options_.max_tokens) {
    return absl::ResourceExhaustedError(
        absl::StrCat("CudaModel::Forward: ", length_ + tokens.size(), " tokens exceed max_tokens ",
                     options_.max_tokens));
  }
  for (int32_t id : tokens) RETURN_IF_ERROR(Step(id));
  logits->resize(static_cast<size_t>(config_.vocab_size));
  RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(logits->data(), dev_->logits.as<void>(), logits->size() * 4,
                                 cudaMemcpyDeviceToHost, dev_->stream),
                 "logits copy"));
  return CudaStatus(cudaStreamSynchronize(dev_->stream), "Forward");
}

absl::StatusOr<int32_t> CudaModel::GreedyToken() {
  if (length_ == 0) return absl::FailedPreconditionError("GreedyToken: no Forward yet");
  Device& d = *dev_;
  RETURN_IF_ERROR(CudaStatus(
      kc::Argmax(d.greedy.as<int32_t>(), d.logits.as<float>(), 1, config_.vocab_size, d.stream),
      "Argmax"));
  int32_t id = -1;
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(&id, d.greedy.as<void>(), 4, cudaMemcpyDeviceToHost, d.stream), "copy"));
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(d.stream), "GreedyToken"));
  return id;
}

}  // namespace tokenselect::engine
