// cudaError_t -> absl::Status at the kernels/ boundary (launchers return cudaError_t; whoever
// calls them from engine/ converts with CudaStatus).
#ifndef TOKENSELECT_KERNELS_CUDA_CUDA_STATUS_H_
#define TOKENSELECT_KERNELS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tokenselect::kernels::cuda {

// OK for cudaSuccess; otherwise Internal (ResourceExhausted for cudaErrorMemoryAllocation) with
// `what` and the CUDA error name and text in the message.
inline absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

}  // namespace tokenselect::kernels::cuda

// Inside launchers: returns the cudaError_t of `expr` when it is not cudaSuccess.
#define TS_CUDA_RETURN_IF_ERROR(expr)        \
  do {                                       \
    const cudaError_t ts_cuda_err_ = (expr); \
    if (ts_cuda_err_ != cudaSuccess) return ts_cuda_err_; \
  } while (0)

#endif  // TOKENSELECT_KERNELS_CUDA_CUDA_STATUS_H_
