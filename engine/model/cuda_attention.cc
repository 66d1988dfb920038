#include "engine/model/cuda_attention.h"

#include <cuda_runtime_api.h>

#include "common/status.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/selection_list.h"

namespace tokenselect::engine {

namespace kc = kernels::cuda;
using kc::CudaStatus;

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
    p.device_num_cached.count = query.device_cache_length;
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
