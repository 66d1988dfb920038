#include "engine/model/cuda_model.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/selection_list.h"
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
    const cudaError_t err = cudaMalloc(&ptr_, bytes);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      ptr_ = nullptr;
      bytes_ = 0;
      return absl::ResourceExhaustedError(
          absl::StrCat("CudaModel: out of device memory allocating ", bytes, " bytes"));
    }
    return CudaStatus(err, "cudaMalloc");
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

struct LayerBuffers {
  DeviceMemory input_norm, post_norm;  // bf16 [hidden]
  DeviceMemory qkv, qkv_bias;          // bf16 [q_dim + 2 kv_dim, hidden], [q_dim + 2 kv_dim]
  DeviceMemory o, o_bias;              // bf16 [hidden, q_dim], fp32 [hidden]
  DeviceMemory gate_up, gate_up_bias;  // bf16 [2 inter, hidden], [2 inter]
  DeviceMemory down, down_bias;        // bf16 [hidden, inter], fp32 [hidden]
  DeviceMemory k_cache, v_cache;       // bf16 [num_slots, kv_dim]
};

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

// Uploads the concatenation of the named tensors (absent names, e.g. biases a model does not
// have, are skipped; all absent leaves `out` unallocated) as bf16, or as fp32 when `fp32`.
template <typename Source>
absl::Status UploadTensors(const Source& source, std::initializer_list<std::string> names,
                           bool fp32, DeviceMemory* out, int64_t* total_bytes) {
  std::vector<const WeightEntry*> parts;
  int64_t n = 0;
  for (const std::string& name : names) {
    if (const WeightEntry* e = source.Find(name)) {
      parts.push_back(e);
      n += e->num_elements();
    }
  }
  if (n == 0) return absl::OkStatus();
  const size_t elem = fp32 ? 4 : 2;
  RETURN_IF_ERROR(out->Allocate(static_cast<size_t>(n) * elem));
  *total_bytes += n * static_cast<int64_t>(elem);
  std::vector<float> slab;
  std::vector<uint16_t> bits;
  int64_t offset = 0;
  for (const WeightEntry* e : parts) {
    const int64_t count = e->num_elements();
    for (int64_t begin = 0; begin < count; begin += kSlabElements) {
      const int64_t len = std::min(kSlabElements, count - begin);
      slab.resize(static_cast<size_t>(len));
      source.Read(*e, begin, len, slab.data());
      char* dst = out->as<char>() + (offset + begin) * static_cast<int64_t>(elem);
      if (fp32) {
        RETURN_IF_ERROR(CudaStatus(cudaMemcpy(dst, slab.data(), len * 4, cudaMemcpyHostToDevice),
                                   "upload"));
      } else {
        bits.resize(static_cast<size_t>(len));
#pragma omp parallel for schedule(static) if (len >= (1 << 16))
        for (int64_t i = 0; i < len; ++i) bits[i] = ToBf16Bits(slab[i]);
        RETURN_IF_ERROR(CudaStatus(cudaMemcpy(dst, bits.data(), len * 2, cudaMemcpyHostToDevice),
                                   "upload"));
      }
    }
    offset += count;
  }
  return absl::OkStatus();
}

}  // namespace

struct CudaModel::Device {
  cudaStream_t stream = nullptr;
  std::unique_ptr<kc::GemmRunner> gemm;
  std::vector<LayerBuffers> layers;
  DeviceMemory embed, lm_head, norm, inv_freq;
  // Activations for up to max_chunk rows; logits and greedy ids for up to max_batch rows.
  DeviceMemory x, h, qkv, attn, gate_up, act, logits, tokens, new_slots, greedy;
  // iota[i] = i (dense lists' positions); q_indptr = {0, m} (prefill steps).
  DeviceMemory iota, q_indptr, attention_workspace;
  int64_t num_pages = 0;
  std::vector<int32_t> free_pages;  // handed out from the front, in a scrambled order
  // Full attention for the rows of a step that have no provider (one per row: each keeps its
  // own indptr / positions buffers).
  std::vector<std::unique_ptr<CudaDenseAttention>> dense_rows;
  int num_sms = 0;
  bool tuned_attention = false;
  // Decode-step graphs of segments 0..num_layers (see EnqueueSegment) per batch size m,
  // captured on first use.
  std::map<int64_t, std::vector<cudaGraphExec_t>> graphs;

  ~Device() {
    for (auto& [m, execs] : graphs) {
      for (cudaGraphExec_t g : execs) {
        if (g != nullptr) cudaGraphExecDestroy(g);
      }
    }
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

CudaModel::CudaModel(const ModelConfig& config, const CudaModelOptions& options)
    : config_(config), options_(options), dev_(std::make_unique<Device>()) {}
CudaModel::~CudaModel() { default_seq_.reset(); }

CudaSequence::~CudaSequence() {
  if (model_ != nullptr) model_->Release(this);
}

void CudaModel::Release(CudaSequence* seq) {
  if (seq->slots_ != nullptr) cudaFree(seq->slots_);  // waits for the device
  seq->slots_ = nullptr;
  dev_->free_pages.insert(dev_->free_pages.begin(), seq->pages_.begin(), seq->pages_.end());
  seq->pages_.clear();
  seq->model_ = nullptr;
}

int64_t CudaModel::num_pages() const { return dev_->num_pages; }
int64_t CudaModel::free_pages() const { return static_cast<int64_t>(dev_->free_pages.size()); }

absl::StatusOr<std::unique_ptr<CudaSequence>> CudaModel::NewSequence(int64_t max_tokens) {
  if (max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaModel::NewSequence: max_tokens must be >= 1, got ", max_tokens));
  }
  const int64_t page = options_.page_size;
  const int64_t needed = (max_tokens + page - 1) / page;
  Device& d = *dev_;
  if (needed > static_cast<int64_t>(d.free_pages.size())) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "CudaModel: a sequence of ", max_tokens, " tokens needs ", needed, " KV pages; ",
        d.free_pages.size(), " of ", d.num_pages, " are free"));
  }
  std::unique_ptr<CudaSequence> seq(new CudaSequence());
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
  std::unique_ptr<CudaModel> model(new CudaModel(config, options));
  Device& d = *model->dev_;
  const ModelConfig& c = config;
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
  const size_t kv_bytes = static_cast<size_t>(num_slots * c.kv_dim()) * 2;

  int64_t* wb = &model->weight_bytes_;
  const bool f32 = true, bf16 = false;
  d.layers.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerBuffers& b = d.layers[l];
    const std::string p = absl::StrCat("model.layers.", l, ".");
    const std::string a = p + "self_attn.", m = p + "mlp.";
    RETURN_IF_ERROR(UploadTensors(source, {p + "input_layernorm.weight"}, bf16, &b.input_norm, wb));
    RETURN_IF_ERROR(
        UploadTensors(source, {p + "post_attention_layernorm.weight"}, bf16, &b.post_norm, wb));
    RETURN_IF_ERROR(UploadTensors(
        source, {a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"}, bf16, &b.qkv,
        wb));
    RETURN_IF_ERROR(UploadTensors(source,
                                  {a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"}, bf16,
                                  &b.qkv_bias, wb));
    RETURN_IF_ERROR(UploadTensors(source, {a + "o_proj.weight"}, bf16, &b.o, wb));
    RETURN_IF_ERROR(UploadTensors(source, {a + "o_proj.bias"}, f32, &b.o_bias, wb));
    RETURN_IF_ERROR(UploadTensors(source, {m + "gate_proj.weight", m + "up_proj.weight"}, bf16,
                                  &b.gate_up, wb));
    RETURN_IF_ERROR(UploadTensors(source, {m + "gate_proj.bias", m + "up_proj.bias"}, bf16,
                                  &b.gate_up_bias, wb));
    RETURN_IF_ERROR(UploadTensors(source, {m + "down_proj.weight"}, bf16, &b.down, wb));
    RETURN_IF_ERROR(UploadTensors(source, {m + "down_proj.bias"}, f32, &b.down_bias, wb));
    RETURN_IF_ERROR(b.k_cache.Allocate(kv_bytes));
    RETURN_IF_ERROR(b.v_cache.Allocate(kv_bytes));
    model->kv_bytes_ += static_cast<int64_t>(2 * kv_bytes);
  }
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
  RETURN_IF_ERROR(d.h.Allocate(rows * c.hidden_size * 2));
  RETURN_IF_ERROR(d.qkv.Allocate(rows * qkv_dim * 2));
  RETURN_IF_ERROR(d.attn.Allocate(rows * c.q_dim() * 2));
  RETURN_IF_ERROR(d.gate_up.Allocate(rows * 2 * c.intermediate_size * 2));
  RETURN_IF_ERROR(d.act.Allocate(rows * c.intermediate_size * 2));
  RETURN_IF_ERROR(d.logits.Allocate(options.max_batch * c.vocab_size * 4));
  RETURN_IF_ERROR(d.tokens.Allocate(rows * 4));
  RETURN_IF_ERROR(d.new_slots.Allocate(rows * 4));
  RETURN_IF_ERROR(d.greedy.Allocate(options.max_batch * 4));
  RETURN_IF_ERROR(d.q_indptr.Allocate(2 * 4));
  const int64_t iota_len = options.max_tokens + options.max_chunk + 1;
  RETURN_IF_ERROR(d.iota.Allocate(iota_len * 4));
  RETURN_IF_ERROR(CudaStatus(kc::FillIota(d.iota.as<int32_t>(), iota_len, d.stream), "FillIota"));
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(d.stream), "CudaModel setup"));
  return model;
}

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
  auto linear = [&](void* y, const __nv_bfloat16* x, const DeviceMemory& w,
                    const DeviceMemory& bias, int64_t rows, int64_t k, int64_t n, bool fp32_out,
                    bool accumulate) {
    kc::LinearParams p;
    p.y = y;
    p.x = x;
    p.w = w.bf16();
    p.bias = bias.bytes() > 0 ? bias.as<void>() : nullptr;
    p.m = rows;
    p.k = k;
    p.n = n;
    p.out = fp32_out ? kc::GemmOutput::kFp32 : kc::GemmOutput::kBf16;
    p.accumulate = accumulate;
    return CudaStatus(d.gemm->Linear(p, s), "Linear");
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
  if (segment == 0) {
    kc::EmbeddingParams ep{d.x.as<float>(), d.embed.bf16(), d.tokens.as<int32_t>(), m,
                           hidden,          c.vocab_size};
    RETURN_IF_ERROR(CudaStatus(kc::Embedding(ep, s), "Embedding"));
  } else {
    LayerBuffers& b = d.layers[segment - 1];
    RETURN_IF_ERROR(
        linear(d.x.as<void>(), d.attn.bf16(), b.o, b.o_bias, m, q_dim, hidden, true, true));
    RETURN_IF_ERROR(rms_norm(b.post_norm, d.x.as<float>(), m));
    RETURN_IF_ERROR(linear(d.gate_up.as<void>(), d.h.bf16(), b.gate_up, b.gate_up_bias, m, hidden,
                           2 * inter, false, false));
    kc::SwiGluParams sp;
    sp.out = d.act.bf16();
    sp.gate = d.gate_up.bf16();
    sp.up = d.gate_up.bf16() + inter;
    sp.rows = m;
    sp.cols = inter;
    sp.in_stride = 2 * inter;
    RETURN_IF_ERROR(CudaStatus(kc::SwiGlu(sp, s), "SwiGlu"));
    RETURN_IF_ERROR(
        linear(d.x.as<void>(), d.act.bf16(), b.down, b.down_bias, m, inter, hidden, true, true));
  }
  if (segment == c.num_layers) {
    if (logits_rows == 0) return absl::OkStatus();
    RETURN_IF_ERROR(rms_norm(d.norm, d.x.as<float>() + (m - logits_rows) * hidden, logits_rows));
    const DeviceMemory& lm_head = d.lm_head.bytes() > 0 ? d.lm_head : d.embed;
    DeviceMemory no_bias;
    return linear(d.logits.as<void>(), d.h.bf16(), lm_head, no_bias, logits_rows, hidden,
                  c.vocab_size, true, false);
  }
  LayerBuffers& b = d.layers[segment];
  RETURN_IF_ERROR(rms_norm(b.input_norm, d.x.as<float>(), m));
  RETURN_IF_ERROR(
      linear(d.qkv.as<void>(), d.h.bf16(), b.qkv, b.qkv_bias, m, hidden, qkv_dim, false, false));
  kc::KvAppendParams kv;
  kv.k_cache = b.k_cache.bf16();
  kv.v_cache = b.v_cache.bf16();
  kv.k = d.qkv.bf16() + q_dim;
  kv.v = d.qkv.bf16() + q_dim + kv_dim;
  kv.slots = d.new_slots.as<int32_t>();
  kv.num_tokens = m;
  kv.row = kv_dim;
  kv.src_stride = qkv_dim;
  kv.num_slots = static_cast<int64_t>(b.k_cache.bytes() / 2) / kv_dim;
  return CudaStatus(kc::KvAppend(kv, s), "KvAppend");
}

absl::Status CudaModel::RunSegment(int64_t segment, int64_t m, int64_t logits_rows) {
  Device& d = *dev_;
  // Decode steps (every row is a sequence's one new token and gets logits) replay graphs.
  if (!(options_.use_graphs && logits_rows == m && m <= options_.max_batch)) {
    return EnqueueSegment(segment, m, logits_rows);
  }
  std::vector<cudaGraphExec_t>& execs = d.graphs[m];
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
  return CudaStatus(cudaGraphLaunch(exec, d.stream), "graph launch");
}

absl::Status CudaModel::Attention(int64_t layer, const StepRow& row) {
  const ModelConfig& c = config_;
  Device& d = *dev_;
  LayerBuffers& b = d.layers[layer];
  const int64_t m = row.count;
  const int64_t qkv_dim = c.q_dim() + 2 * c.kv_dim();
  const __nv_bfloat16* q = d.qkv.bf16() + row.row * qkv_dim;
  __nv_bfloat16* out = d.attn.bf16() + row.row * c.q_dim();
  CudaAttentionProvider* attention = row.attention;
  if (attention == nullptr) {
    while (static_cast<int64_t>(d.dense_rows.size()) <= row.row) {
      d.dense_rows.push_back(std::make_unique<CudaDenseAttention>());
      RETURN_IF_ERROR(CudaDenseAttention::Create(options_.max_chunk, d.dense_rows.back().get()));
    }
    attention = d.dense_rows[row.row].get();
  }
  CudaAttentionQuery query;
  query.layer = layer;
  query.cache_length = row.seq->length_;
  query.num_new = m;
  query.q = q;
  query.q_row_stride = qkv_dim;
  query.k_cache = b.k_cache.bf16();
  query.v_cache = b.v_cache.bf16();
  query.token_slots = row.seq->slots_;
  query.iota = d.iota.as<int32_t>();
  query.inv_freq = d.inv_freq.as<float>();
  query.config = &config_;
  query.stream = d.stream;
  CudaAttentionList list;
  RETURN_IF_ERROR(attention->Select(query, &list));
  if (list.max_kv_len < 0 || list.max_kv_len > row.seq->length_ + m) {
    return absl::InternalError(absl::StrCat("attention provider: max_kv_len ", list.max_kv_len,
                                            " is out of range"));
  }
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  if (m == 1) {
    kc::DecodeAttentionParams ap;
    ap.out = out;
    ap.q = q;
    ap.q_positions = list.q_positions;
    ap.k_cache = b.k_cache.bf16();
    ap.v_cache = b.v_cache.bf16();
    ap.indptr = list.kv_indptr;
    ap.indices = list.kv_indices;
    ap.kv_positions = list.kv_positions;
    ap.inv_freq = d.inv_freq.as<float>();
    ap.batch = 1;
    ap.num_heads = c.num_heads;
    ap.num_kv_heads = c.num_kv_heads;
    ap.head_dim = c.head_dim;
    ap.num_splits = d.tuned_attention ? kc::PlanDecodeSplits(1, c.num_kv_heads,
                                                             std::max<int64_t>(1, list.max_kv_len),
                                                             d.num_sms)
                                      : 1;
    ap.scale = scale;
    if (d.tuned_attention) {
      const size_t ws = kc::DecodeAttentionWorkspaceBytes(1, c.num_heads, c.head_dim,
                                                          ap.num_splits);
      if (ws > d.attention_workspace.bytes()) {
        RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(d.stream), "sync"));
        RETURN_IF_ERROR(d.attention_workspace.Allocate(ws));
      }
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
  pp.k_cache = b.k_cache.bf16();
  pp.v_cache = b.v_cache.bf16();
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
    pp.num_splits = kc::PlanPrefillSplits(1, c.num_heads, c.num_kv_heads, m, pp.max_kv_len,
                                          d.num_sms);
    const size_t ws = kc::PrefillAttentionWorkspaceBytes(m, c.num_heads, c.head_dim,
                                                         pp.num_splits);
    if (ws > d.attention_workspace.bytes()) {
      RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(d.stream), "sync"));
      RETURN_IF_ERROR(d.attention_workspace.Allocate(ws));
    }
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
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    RETURN_IF_ERROR(RunSegment(l, m, logits_rows));
    for (const StepRow& r : rows) RETURN_IF_ERROR(Attention(l, r));
  }
  RETURN_IF_ERROR(RunSegment(config_.num_layers, m, logits_rows));
  for (const StepRow& r : rows) r.seq->length_ += r.count;
  last_logits_rows_ = logits_rows;
  return absl::OkStatus();
}

absl::Status CudaModel::Forward(CudaSequence* seq, absl::Span<const int32_t> tokens,
                                CudaAttentionProvider* attention, std::vector<float>* logits) {
  if (seq == nullptr || seq->model_ != this) {
    return absl::InvalidArgumentError("CudaModel::Forward: the sequence belongs to no or another model");
  }
  RETURN_IF_ERROR(CheckTokens(tokens));
  if (seq->length_ + static_cast<int64_t>(tokens.size()) > seq->capacity()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("CudaModel::Forward: ", seq->length_ + tokens.size(),
                     " tokens exceed the sequence's capacity of ", seq->capacity()));
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t begin = 0; begin < n; begin += options_.max_chunk) {
    const int64_t len = std::min(options_.max_chunk, n - begin);
    const StepRow row{seq, 0, len, attention};
    const absl::Status step = Step(absl::MakeConstSpan(&row, 1), tokens.subspan(begin, len),
                                   logits != nullptr && begin + len == n ? 1 : 0);
    if (!step.ok()) {
      cudaStreamSynchronize(dev_->stream);  // nothing of the failed step may still be running
      return step;
    }
  }
  if (logits == nullptr) return CudaStatus(cudaGetLastError(), "Forward");
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

// CudaDenseAttention ---------------------------------------------------------------------------

absl::Status CudaDenseAttention::Create(int64_t max_new, CudaDenseAttention* out) {
  if (max_new < 1) return absl::InvalidArgumentError("CudaDenseAttention: max_new must be >= 1");
  if (out->buffer_ != nullptr) cudaFree(out->buffer_);
  out->buffer_ = nullptr;
  void* buffer = nullptr;
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&buffer, (2 + 2 * max_new) * 4), "cudaMalloc"));
  out->buffer_ = static_cast<int32_t*>(buffer);
  out->max_new_ = max_new;
  return absl::OkStatus();
}

CudaDenseAttention::~CudaDenseAttention() {
  if (buffer_ != nullptr) cudaFree(buffer_);
}

absl::Status CudaDenseAttention::Select(const CudaAttentionQuery& query, CudaAttentionList* list) {
  if (buffer_ == nullptr || query.num_new > max_new_) {
    return absl::FailedPreconditionError("CudaDenseAttention: not created for this step size");
  }
  if (query.layer == 0) {  // the same list serves every layer of a step
    kc::DenseListParams p;
    p.kv_indptr = buffer_;
    p.q_positions = buffer_ + 2;
    p.visible = buffer_ + 2 + max_new_;
    p.num_cached = query.cache_length;
    p.num_new = query.num_new;
    RETURN_IF_ERROR(CudaStatus(kc::FillDenseList(p, query.stream), "FillDenseList"));
  }
  list->kv_indptr = buffer_;
  list->kv_indices = query.token_slots;
  list->kv_positions = query.iota;
  list->q_positions = buffer_ + 2;
  list->visible = buffer_ + 2 + max_new_;
  list->max_kv_len = query.cache_length + query.num_new;
  return absl::OkStatus();
}

}  // namespace tokenselect::engine
