// CudaModel's K/V transfer access (cuda_model.h, "K/V transfer"): the host transport's copies in
// and out of a sequence's slots, through the kv_pack kernels and one staging buffer per call.
// Not the fast path (the NCCL link moves device to device, engine/transfer/nccl_kv_link.h), so
// each call allocates its device scratch and waits for its copy.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/model/cuda_model.h"
#include "engine/model/cuda_model_internal.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/kv_pack.h"

namespace tokenselect::engine {
namespace {

namespace kc = kernels::cuda;
using cuda_model_internal::DeviceMemory;

// Device scratch of one copy: the staging payload, the layers' K and V pointers, the slots.
struct KvCopyScratch {
  DeviceMemory staging, k_layers, v_layers, slots;
};

}  // namespace

__nv_bfloat16* CudaModel::k_cache(int64_t layer) const {
  return dev_->layers[static_cast<size_t>(layer)].k_cache.bf16();
}
__nv_bfloat16* CudaModel::v_cache(int64_t layer) const {
  return dev_->layers[static_cast<size_t>(layer)].v_cache.bf16();
}
int64_t CudaModel::num_slots() const { return dev_->num_pages * options_.page_size; }

absl::Status CudaModel::Synchronize() {
  return kc::CudaStatus(cudaStreamSynchronize(dev_->stream), "CudaModel::Synchronize");
}

absl::Status CudaModel::SetLength(CudaSequence* seq, int64_t length) {
  if (seq == nullptr || seq->model_ != this) {
    return absl::InvalidArgumentError("CudaModel::SetLength: the sequence is not this model's");
  }
  if (length < 0 || length > seq->capacity()) {
    return absl::InvalidArgumentError(absl::StrCat("CudaModel::SetLength: length ", length,
                                                   " outside [0, ", seq->capacity(), "]"));
  }
  seq->length_ = length;
  return absl::OkStatus();
}

namespace {

// Checks the ranges and prepares the scratch of a copy of layers [lb, le) x positions [tb, te).
absl::Status PrepareCopy(const CudaModel& model, const CudaSequence& seq, int64_t lb, int64_t le,
                         int64_t tb, int64_t te, KvCopyScratch* s, int64_t* bytes) {
  const ModelConfig& c = model.config();
  if (lb < 0 || le <= lb || le > c.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("K/V copy: layer range [", lb, ", ", le, ") outside [0, ", c.num_layers, ")"));
  }
  if (tb < 0 || te <= tb || te > seq.capacity()) {
    return absl::InvalidArgumentError(absl::StrCat("K/V copy: token range [", tb, ", ", te,
                                                   ") outside the sequence's ", seq.capacity(),
                                                   " slots"));
  }
  const int64_t layers = le - lb;
  const int64_t tokens = te - tb;
  const int64_t row = c.num_kv_heads * c.head_dim;
  *bytes = layers * 2 * tokens * row * model.kv_element_bytes();  // bf16 or FP8 elements
  RETURN_IF_ERROR(s->staging.Allocate(static_cast<size_t>(*bytes)));
  std::vector<__nv_bfloat16*> k(static_cast<size_t>(layers)), v(static_cast<size_t>(layers));
  for (int64_t l = 0; l < layers; ++l) {
    k[static_cast<size_t>(l)] = model.k_cache(lb + l);
    v[static_cast<size_t>(l)] = model.v_cache(lb + l);
  }
  RETURN_IF_ERROR(s->k_layers.Allocate(k.size() * sizeof(void*)));
  RETURN_IF_ERROR(s->v_layers.Allocate(v.size() * sizeof(void*)));
  RETURN_IF_ERROR(s->slots.Allocate(static_cast<size_t>(tokens) * sizeof(int32_t)));
  cudaStream_t stream = model.stream();
  RETURN_IF_ERROR(
      kc::CudaStatus(cudaMemcpyAsync(s->k_layers.as<void>(), k.data(), k.size() * sizeof(void*),
                                     cudaMemcpyHostToDevice, stream),
                     "K/V copy: layer pointers"));
  RETURN_IF_ERROR(
      kc::CudaStatus(cudaMemcpyAsync(s->v_layers.as<void>(), v.data(), v.size() * sizeof(void*),
                                     cudaMemcpyHostToDevice, stream),
                     "K/V copy: layer pointers"));
  RETURN_IF_ERROR(kc::CudaStatus(cudaMemcpyAsync(s->slots.as<void>(), seq.slots().data() + tb,
                                                 static_cast<size_t>(tokens) * sizeof(int32_t),
                                                 cudaMemcpyHostToDevice, stream),
                                 "K/V copy: slots"));
  return absl::OkStatus();
}

// The host side of a copy of `model`'s K/V: `bytes` of staging rows [layers * 2 * tokens][row]
// to or from the host buffer, whose rows hold slice.total_heads heads with ours at
// slice.head_begin.
absl::Status HostCopy(const CudaModel& model, KvHostSlice slice, int64_t bytes, void* host,
                      void* staging, cudaMemcpyKind kind) {
  const ModelConfig& c = model.config();
  cudaStream_t stream = model.stream();
  const int64_t heads = c.num_kv_heads;
  if (slice.total_heads == 0) slice.total_heads = heads;
  if (slice.head_begin < 0 || slice.head_begin + heads > slice.total_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("K/V copy: heads [", slice.head_begin, ", ", slice.head_begin + heads,
                     ") outside the host rows' ", slice.total_heads, " KV heads"));
  }
  if (slice.total_heads == heads) {
    return kc::CudaStatus(
        kind == cudaMemcpyDeviceToHost
            ? cudaMemcpyAsync(host, staging, static_cast<size_t>(bytes), kind, stream)
            : cudaMemcpyAsync(staging, host, static_cast<size_t>(bytes), kind, stream),
        "K/V copy: host");
  }
  const size_t head_bytes = static_cast<size_t>(c.head_dim * model.kv_element_bytes());
  const size_t width = head_bytes * static_cast<size_t>(heads);  // this model's part of a row
  const size_t rows = static_cast<size_t>(bytes) / width;
  const size_t pitch = head_bytes * static_cast<size_t>(slice.total_heads);
  char* host_at = static_cast<char*>(host) + head_bytes * static_cast<size_t>(slice.head_begin);
  return kc::CudaStatus(
      kind == cudaMemcpyDeviceToHost
          ? cudaMemcpy2DAsync(host_at, pitch, staging, width, width, rows, kind, stream)
          : cudaMemcpy2DAsync(staging, width, host_at, pitch, width, rows, kind, stream),
      "K/V copy: host (sliced by KV head)");
}

}  // namespace

absl::Status CudaModel::ReadKv(const CudaSequence& seq, int64_t layer_begin, int64_t layer_end,
                               int64_t token_begin, int64_t token_end, void* out,
                               KvHostSlice slice) {
  if (seq.model_ != this) {
    return absl::InvalidArgumentError("CudaModel::ReadKv: the sequence is not this model's");
  }
  KvCopyScratch s;
  int64_t bytes = 0;
  RETURN_IF_ERROR(
      PrepareCopy(*this, seq, layer_begin, layer_end, token_begin, token_end, &s, &bytes));
  kc::KvGatherParams p;
  p.staging = s.staging.bf16();
  p.k_layers = s.k_layers.as<const __nv_bfloat16* const>();
  p.v_layers = s.v_layers.as<const __nv_bfloat16* const>();
  p.slots = s.slots.as<const int32_t>();
  p.num_layers = layer_end - layer_begin;
  p.num_tokens = token_end - token_begin;
  p.row = config_.num_kv_heads * config_.head_dim;
  p.num_slots = num_slots();
  p.elem_bytes = static_cast<int>(kv_element_bytes());
  RETURN_IF_ERROR(kc::CudaStatus(kc::KvGather(p, dev_->stream), "ReadKv: KvGather"));
  RETURN_IF_ERROR(HostCopy(*this, slice, bytes, out, s.staging.as<void>(), cudaMemcpyDeviceToHost));
  return Synchronize();  // before the scratch goes
}

absl::Status CudaModel::WriteKv(CudaSequence* seq, int64_t layer_begin, int64_t layer_end,
                                int64_t token_begin, int64_t token_end, const void* in,
                                KvHostSlice slice) {
  if (seq == nullptr || seq->model_ != this) {
    return absl::InvalidArgumentError("CudaModel::WriteKv: the sequence is not this model's");
  }
  KvCopyScratch s;
  int64_t bytes = 0;
  RETURN_IF_ERROR(
      PrepareCopy(*this, *seq, layer_begin, layer_end, token_begin, token_end, &s, &bytes));
  RETURN_IF_ERROR(HostCopy(*this, slice, bytes, const_cast<void*>(in), s.staging.as<void>(),
                           cudaMemcpyHostToDevice));
  kc::KvScatterParams p;
  p.k_layers = s.k_layers.as<__nv_bfloat16* const>();
  p.v_layers = s.v_layers.as<__nv_bfloat16* const>();
  p.staging = s.staging.bf16();
  p.slots = s.slots.as<const int32_t>();
  p.num_layers = layer_end - layer_begin;
  p.num_tokens = token_end - token_begin;
  p.row = config_.num_kv_heads * config_.head_dim;
  p.num_slots = num_slots();
  p.elem_bytes = static_cast<int>(kv_element_bytes());
  RETURN_IF_ERROR(kc::CudaStatus(kc::KvScatter(p, dev_->stream), "WriteKv: KvScatter"));
  return Synchronize();
}

}  // namespace tokenselect::engine
