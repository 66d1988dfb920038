// Internals shared by the CudaModel sources (cuda_model.cc: sequences and the forward pass;
// cuda_model_load.cc: construction and weight upload). Not part of the public API.
#ifndef TOKENSELECT_ENGINE_MODEL_CUDA_MODEL_INTERNAL_H_
#define TOKENSELECT_ENGINE_MODEL_CUDA_MODEL_INTERNAL_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model/cuda_attention.h"
#include "engine/model/cuda_model.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/gemm.h"

namespace tokenselect::engine::cuda_model_internal {

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
    return kernels::cuda::CudaStatus(err, "cudaMalloc");
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

// Makes options.device the calling thread's current device (nothing when it is -1). Every
// public CudaModel entry point calls it, so that the ranks of a tensor-parallel group can be
// driven from any thread.
inline absl::Status UseDevice(const CudaModelOptions& options) {
  if (options.device < 0) return absl::OkStatus();
  return kernels::cuda::CudaStatus(cudaSetDevice(options.device), "cudaSetDevice");
}

struct LayerBuffers {
  DeviceMemory input_norm, post_norm;  // bf16 [hidden]
  DeviceMemory qkv, qkv_bias;          // bf16 [q_dim + 2 kv_dim, hidden], [q_dim + 2 kv_dim]
  // Under tensor parallelism the rank's shard: q_dim, kv_dim and inter are the rank's, and the
  // row-parallel biases (o_bias, down_bias) are added by rank 0 only.
  DeviceMemory o, o_bias;              // bf16 [hidden, q_dim], fp32 [hidden]
  DeviceMemory gate_up, gate_up_bias;  // bf16 [2 inter, hidden], [2 inter]
  DeviceMemory down, down_bias;        // bf16 [hidden, inter], fp32 [hidden]
  DeviceMemory k_cache, v_cache;       // [num_slots, kv_dim] bf16, or e4m3 bytes (kv_dtype)
};

}  // namespace tokenselect::engine::cuda_model_internal

namespace tokenselect::engine {

struct CudaModel::Device {
  cudaStream_t stream = nullptr;
  std::unique_ptr<kernels::cuda::GemmRunner> gemm;
  std::vector<cuda_model_internal::LayerBuffers> layers;
  cuda_model_internal::DeviceMemory embed, lm_head, norm, inv_freq;
  // Activations for up to max_chunk rows; logits and greedy ids for up to max_batch rows.
  cuda_model_internal::DeviceMemory x, h, qkv, attn, gate_up, act, logits, tokens, new_slots,
      greedy;
  // fp32 [max_chunk, hidden]: a row-parallel GEMM's second pair of k-slices (TP-invariant
  // numerics with four slices on this rank); empty otherwise.
  cuda_model_internal::DeviceMemory partial;
  // iota[i] = i (dense lists' positions); q_indptr = {0, m} (prefill steps).
  cuda_model_internal::DeviceMemory iota, q_indptr, attention_workspace;
  // FP8 KV cache: the scales, fp32 [num_layers, 2, num_kv_heads] (kv_scales.h).
  cuda_model_internal::DeviceMemory kv_scales;
  int64_t num_pages = 0;
  std::vector<int32_t> free_pages;  // handed out from the front, in a scrambled order
  // Full attention for the rows of a step that have no provider (one per row: each keeps its
  // own indptr / positions buffers).
  std::vector<std::unique_ptr<CudaDenseAttention>> dense_rows;
  int num_sms = 0;
  bool tuned_attention = false;
  // Graphs of segments 0..num_layers (see EnqueueSegment), captured on first use: decode steps
  // of m rows at key m, prefill chunks of max_chunk tokens without logits at key -max_chunk.
  std::map<int64_t, std::vector<cudaGraphExec_t>> graphs;
  // Whole steps as one graph (cuda_model_step_graph.cc): the rows' current cache lengths
  // [max_batch] int32 (copied in before each launch), and per kind of step (decode steps, full
  // prefill chunks) the captured step, what it was captured for (CudaModel::StepGraphRow), the
  // last step seen that could have been (a step is captured the second time in a row its key
  // comes up) and a key whose capture failed.
  cuda_model_internal::DeviceMemory row_lengths;
  struct WholeStepGraph {
    std::vector<StepGraphRow> key, seen_key, failed_key;
    cudaGraphExec_t exec = nullptr;
  };
  WholeStepGraph whole[2];  // [CudaModel::kDecodeGraph], [CudaModel::kChunkGraph]
  bool capturing = false;   // a whole step is being captured: nothing may be allocated

  ~Device() {
    for (WholeStepGraph& g : whole) {
      if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
    }
    for (auto& [m, execs] : graphs) {
      for (cudaGraphExec_t g : execs) {
        if (g != nullptr) cudaGraphExecDestroy(g);
      }
    }
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_MODEL_CUDA_MODEL_INTERNAL_H_
