// The GPU counterpart of attention_list.h: the hook through which a selection policy chooses, per
// layer, the tokens the new tokens attend to, with everything in device memory so that a step
// never waits for the host. CudaModel (cuda_model.h) writes the new tokens' K/V, asks the
// request's CudaAttentionProvider for the list, and runs the CSR attention kernels over it
// (kernels/cuda/decode_attention.h for one new token, prefill_attention.h for a chunk).
//
// The list is the kernels' index form for one request:
//   kv_indptr      device [2]: 0 and the list length (may be decided on the device)
//   kv_indices     cache slot of each entry; kv_positions: its RoPE position
//   q_positions    RoPE position of new token i; visible: new token i attends entries
//                  [0, visible[i]) (causal masks are prefixes)
//   max_kv_len     a host-side bound on the length, for the launch plan
// CudaDenseAttention is full attention; engine/selection/cuda_selection.h implements the
// selection policies.
//
// Tensor parallelism (docs/parallel.md): a model sharded over N GPUs runs one CudaModel and one
// provider per rank, each seeing only its rank's query and KV heads (the rank's ModelConfig has
// num_heads / N and num_kv_heads / N). The query then carries the rank's CudaTensorParallel, and
// a provider whose choice depends on sums over heads (votes, cosines, page bounds) all-reduces
// those sums before choosing, so that every rank attends to exactly the same tokens.
#ifndef TOKENSELECT_ENGINE_MODEL_CUDA_ATTENTION_H_
#define TOKENSELECT_ENGINE_MODEL_CUDA_ATTENTION_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "engine/model/kv_cache_dtype.h"
#include "engine/model/model_config.h"
#include "kernels/cuda/kv_cache_type.h"

namespace tokenselect::engine {

// One rank's handle on a tensor-parallel group (engine/parallel/nccl_tensor_parallel.h
// implements it over NCCL). The model and the providers call AllReduceSum at the same points in
// the same order on every rank; the calls only enqueue work on `stream` (they may be captured in
// a CUDA graph) and every rank gets bitwise the same sums.
class CudaTensorParallel {
 public:
  virtual ~CudaTensorParallel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sums `count` values of `data` (this rank's device memory) over the ranks, in place.
  // Internal naming the collective's error.
  virtual absl::Status AllReduceSum(float* data, int64_t count, cudaStream_t stream) = 0;
  virtual absl::Status AllReduceSum(double* data, int64_t count, cudaStream_t stream) = 0;
  // The same, except that an implementation may leave the values alone when *skip != 0
  // (device memory, equal on every rank): for sums whose result is then unused, as the votes
  // on a selection-cache hit. The default always sums.
  virtual absl::Status AllReduceSumUnless(float* data, int64_t count, const int32_t* skip,
                                          cudaStream_t stream) {
    return AllReduceSum(data, count, stream);
  }
  // Returns once every rank's thread has called it (as often): call it before launching a CUDA
  // graph that holds collectives. AllReduceSum does the same itself outside graph capture.
  // With several GPUs in one process, a CUDA memory operation (an allocation, a module load)
  // on one GPU may wait for every peer GPU to go idle; a peer spinning in a collective that
  // waits for this rank's launch never does. Launching no collective before every rank has
  // reached it rules that deadlock out. FailedPrecondition once the group was aborted.
  virtual absl::Status WaitForRanks() { return absl::OkStatus(); }
  // Whether every sum adds the ranks' values in one fixed binary tree ((r0 + r1) + (r2 + r3)
  // for 4), whatever the message size: what TP-invariant numerics (CudaModelOptions::
  // invariant_shards) need. Two ranks always do (a + b is exact in either order).
  virtual bool SumsInFixedTree() const { return size() <= 2; }
};

// The kernels' name for a cache element type (kernels/cuda/kv_cache_type.h).
inline kernels::cuda::KvCacheType KernelKvType(KvCacheDType dtype) {
  return dtype == KvCacheDType::kFP8E4M3 ? kernels::cuda::KvCacheType::kFp8E4M3
                                         : kernels::cuda::KvCacheType::kBf16;
}

// True when `tp` shards the model over more than one rank (null or size 1: one GPU, and no
// collective is ever called).
inline bool IsSharded(const CudaTensorParallel* tp) { return tp != nullptr && tp->size() > 1; }

// What a provider sees for one layer of one forward step. All pointers are device memory.
struct CudaAttentionQuery {
  int64_t layer = 0;
  int64_t cache_length = 0;  // tokens cached before this step
  int64_t num_new = 0;       // their K/V are already written
  const __nv_bfloat16* q = nullptr;  // row i at q + i * q_row_stride: [num_heads, head_dim]
  int64_t q_row_stride = 0;
  // This layer's [num_slots, num_kv_heads, head_dim] of kv_dtype (bf16, or e4m3 with the
  // layer's per-KV-head scales k_scale / v_scale, [num_kv_heads] fp32; null for bf16).
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  KvCacheDType kv_dtype = KvCacheDType::kBF16;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  // Set when the step is captured once in a CUDA graph and replayed while the sequence grows
  // (CudaModel's whole-step graphs): the current cache length is device_cache_length[0]
  // and cache_length is a bound on it, for sizes and launch grids (see
  // CudaAttentionProvider::SupportsDeviceLength).
  const int32_t* device_cache_length = nullptr;
  const int32_t* token_slots = nullptr;    // [cache_length + num_new]: slot of every token
  const int32_t* iota = nullptr;           // [>= cache_length + num_new + 1]: iota[i] = i
  const float* inv_freq = nullptr;         // [head_dim / 2]
  const ModelConfig* config = nullptr;    // the rank's shard under tensor parallelism
  cudaStream_t stream = nullptr;
  CudaTensorParallel* tp = nullptr;       // the rank's group; null on one GPU (IsSharded)
};

struct CudaAttentionList {
  const int32_t* kv_indptr = nullptr;
  const int32_t* kv_indices = nullptr;
  const int32_t* kv_positions = nullptr;
  const int32_t* q_positions = nullptr;
  const int32_t* visible = nullptr;
  int64_t max_kv_len = 0;
};

// One per request; called for layers 0, 1, ... in order on each step, from one thread. Work is
// enqueued on query.stream; the list's buffers must stay valid (and unchanged) until the step's
// attention for that layer has run, i.e. until the next Select call on the same stream.
class CudaAttentionProvider {
 public:
  CudaAttentionProvider() : id_(NextId()) {}
  virtual ~CudaAttentionProvider() = default;
  virtual absl::Status Select(const CudaAttentionQuery& query, CudaAttentionList* list) = 0;

  // Whole-step graphs (CudaModel: decode steps, and full prefill chunks when query.num_new > 1):
  // true when Select can take the cache length on the device (query.device_cache_length) and
  // enqueue the same work, graph-capturable (no host synchronisation, no allocation, no host
  // state that depends on the length), with the same list bound (max_kv_len), for every current
  // length from query.cache_length up to `bound`. The default: no (the model then runs the
  // step's attention eagerly).
  virtual bool SupportsDeviceLength(const CudaAttentionQuery& query, int64_t bound) const {
    return false;
  }
  // The host-side bookkeeping (statistics) Select would have done for `query` (with its true
  // cache_length), for a step whose Select work was captured earlier and is replayed.
  virtual void AccountReplay(const CudaAttentionQuery& query) {}
  // Unique over the process's lifetime (a graph captured with this provider's buffers is never
  // replayed for another provider at the same address).
  uint64_t id() const { return id_; }

 private:
  static uint64_t NextId() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }
  const uint64_t id_;
};

// Full causal attention: every cached token at its true position, then the new tokens. The
// entries are the token slots themselves (kv_positions = iota), so only indptr, q_positions and
// visible are written (into the provider's own small device buffers).
class CudaDenseAttention : public CudaAttentionProvider {
 public:
  // ResourceExhausted/Internal when the device buffers cannot be allocated.
  static absl::Status Create(int64_t max_new, CudaDenseAttention* out);
  CudaDenseAttention() = default;
  ~CudaDenseAttention() override;
  CudaDenseAttention(const CudaDenseAttention&) = delete;
  CudaDenseAttention& operator=(const CudaDenseAttention&) = delete;

  absl::Status Select(const CudaAttentionQuery& query, CudaAttentionList* list) override;
  // Decode steps only: a dense list of several new tokens grows with the length, and with it the
  // prefill kernel's launch plan.
  bool SupportsDeviceLength(const CudaAttentionQuery& query, int64_t bound) const override {
    return query.num_new == 1;
  }

 private:
  int32_t* buffer_ = nullptr;  // indptr [2] | q_positions [max_new] | visible [max_new]
  int64_t max_new_ = 0;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_MODEL_CUDA_ATTENTION_H_
