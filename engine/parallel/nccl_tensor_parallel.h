// CudaTensorParallel (engine/model/cuda_attention.h) over NCCL: one communicator per rank of a
// group of GPUs in this process, made together by ncclCommInitAll. AllReduceSum is one
// ncclAllReduce (sum) on the caller's stream, so it can be captured in a CUDA graph; NCCL
// returns the same reduced values on every rank. docs/parallel.md.
//
// Each rank's calls must come from a thread whose current device is that rank's device (the
// rank threads of rank_threads.h); the ranks' calls must match in order and size, as NCCL
// requires. NVLink multicast (NVLS) is left to the environment: the device hosts set
// NCCL_NVLS_ENABLE=0, and nothing here turns it on.
#ifndef TOKENSELECT_ENGINE_PARALLEL_NCCL_TENSOR_PARALLEL_H_
#define TOKENSELECT_ENGINE_PARALLEL_NCCL_TENSOR_PARALLEL_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/cuda_attention.h"

namespace tokenselect::engine {

class NcclTensorParallel : public CudaTensorParallel {
 public:
  // One rank per entry of `devices` (distinct CUDA device ordinals, at least one), in that
  // order. InvalidArgument for an empty or repeated list; Internal naming the NCCL error.
  static absl::StatusOr<std::vector<std::unique_ptr<NcclTensorParallel>>> CreateGroup(
      const std::vector<int>& devices);
  // Destroys the communicator; call it on the rank's thread once its work has finished.
  ~NcclTensorParallel() override;
  NcclTensorParallel(const NcclTensorParallel&) = delete;
  NcclTensorParallel& operator=(const NcclTensorParallel&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduceSum(float* data, int64_t count, cudaStream_t stream) override;
  absl::Status AllReduceSum(double* data, int64_t count, cudaStream_t stream) override;

 private:
  NcclTensorParallel(ncclComm_t comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  absl::Status AllReduce(void* data, int64_t count, ncclDataType_t type, cudaStream_t stream);

  ncclComm_t comm_;
  const int rank_;
  const int size_;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_PARALLEL_NCCL_TENSOR_PARALLEL_H_
