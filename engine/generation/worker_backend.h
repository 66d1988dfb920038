// What a worker runs on, chosen by its --device / --gpu / --kv_* flags: the model, its KV pool and
// the GenerationBackend (backend.h) over them, loaded and owned together. The prefill and decode
// workers (and the all-in-one server, one per worker) hold one each.
//
//   device "cpu"   Model (fp32) + a PagePool of kv_pages x page_size slots + CpuBackend
//   device "cuda"  CudaModel (bf16) on GPU `gpu`, or with tp > 1 a TpCudaModel sharded over GPUs
//                  gpu .. gpu + tp - 1, + CudaBackend; KV capacity kv_pages x page_size token
//                  slots (on every GPU, each holding its KV heads), or, with kv_pages = 0,
//                  planned from the GPUs' free memory (PlanKvTokens below, for one rank's
//                  shard on the GPU with the least room). Only in builds with the CUDA backend;
//                  elsewhere Unimplemented naming --device.
#ifndef TOKENSELECT_ENGINE_GENERATION_WORKER_BACKEND_H_
#define TOKENSELECT_ENGINE_GENERATION_WORKER_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/generation/backend.h"
#include "engine/generation/model_loader.h"
#include "engine/kvcache/page_pool.h"
#include "engine/model/kv_cache_dtype.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"
#include "tokenizer/tokenizer.h"

namespace tokenselect::engine {

struct WorkerBackendOptions {
  std::string device = "cpu";  // cpu | cuda
  int gpu = 0;                 // cuda: the device ordinal (of the first rank)
  int tp = 1;                  // cuda: tensor-parallel size (GPUs gpu .. gpu + tp - 1)
  KvCacheDType kv_dtype = KvCacheDType::kBF16;  // cuda: the KV cache's element type
  // cuda: TP-invariant numerics (CudaModelOptions::invariant_shards): 0 off, or 1, 2, 4 (a
  // multiple of tp): logits bit for bit the same for every tp dividing it.
  int tp_invariant = 0;
  // KV capacity in pages of page_size token slots; cuda: 0 plans it from free memory.
  int64_t kv_pages = 4096;
  int64_t page_size = 16;
  // cuda: the largest prefill chunk (selection.chunk_size may not exceed it) and the most
  // sequences per decode step.
  int64_t max_chunk = 512;
  int64_t max_batch = 64;
  // cuda, kv_pages = 0: the fraction of the GPU's memory the worker may use in all.
  double gpu_memory_fraction = 0.9;
  uint64_t dummy_seed = 0;
};

// InvalidArgument naming the flag for a bad device, gpu, tp, tp_invariant, kv_pages, page_size,
// max_chunk, max_batch or gpu_memory_fraction (tp > 1, tp_invariant and kv_dtype fp8 need device
// cuda).
absl::Status ValidateWorkerBackendOptions(const WorkerBackendOptions& options);

class WorkerBackend {
 public:
  virtual ~WorkerBackend() = default;
  virtual GenerationBackend* backend() = 0;
  virtual const tokenizer::Tokenizer* tokenizer() const = 0;
  // The CPU backend's pool (tests check it for leaks); null on the GPU.
  virtual const PagePool* cpu_pool() const { return nullptr; }
  // One line for the start-up log: device, KV capacity, memory.
  virtual std::string Describe() const = 0;
};

// Loads `dir` for `options.device`. Errors of LoadModelDirectory / LoadTpCudaModelDirectory,
// ValidateWorkerBackendOptions; FailedPrecondition when the GPU cannot be used;
// ResourceExhausted when the weights or the KV do not fit.
absl::StatusOr<std::unique_ptr<WorkerBackend>> LoadWorkerBackend(const std::string& dir,
                                                                 LoadFormat format,
                                                                 const WorkerBackendOptions& options);

// A CPU backend over a model and tokenizer the caller owns (they must outlive it), with its own
// pool of options.kv_pages x options.page_size (all-in-one shares one CPU model between workers).
absl::StatusOr<std::unique_ptr<WorkerBackend>> CpuWorkerBackend(
    const Model* model, const tokenizer::Tokenizer* tokenizer, const WorkerBackendOptions& options);

// Memory planning for the GPU: how many KV token slots fit in `budget_bytes` (the part of the
// GPU's memory the worker may use) after the bf16 weights of `config`, the activations of
// max_chunk-token steps and max_batch logits rows, and per-token selection scratch (one request's
// scores and votes per KV slot, fp32 per query head), rounded down to pages. ResourceExhausted
// (saying what is needed) when not even one page fits.
// kv_element_bytes: 2 for bf16, 1 for an FP8 cache.
absl::StatusOr<int64_t> PlanKvTokens(const ModelConfig& config, int64_t budget_bytes,
                                     int64_t page_size, int64_t max_chunk, int64_t max_batch,
                                     int64_t kv_element_bytes = 2);

// Bytes of the bf16 weights of `config` on the GPU (fused projections, embedding, lm_head).
int64_t GpuWeightBytes(const ModelConfig& config);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_GENERATION_WORKER_BACKEND_H_
