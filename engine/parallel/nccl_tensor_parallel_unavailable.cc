// NcclTensorParallel in CUDA builds without NCCL: one GPU works (TpCudaModel with one rank
// makes no group); a group of several is FailedPrecondition.
#include "absl/strings/str_cat.h"
#include "engine/parallel/nccl_tensor_parallel.h"

namespace tokenselect::engine {

absl::StatusOr<std::vector<std::unique_ptr<NcclTensorParallel>>> NcclTensorParallel::CreateGroup(
    const std::vector<int>& devices, bool fixed_tree) {
  return absl::FailedPreconditionError(absl::StrCat("tensor parallelism over ", devices.size(),
                                                    " GPUs needs NCCL, and this build has none"));
}

NcclTensorParallel::~NcclTensorParallel() = default;

void NcclTensorParallel::Abort() {}

absl::Status NcclTensorParallel::WaitForRanks() {
  return absl::FailedPreconditionError("this build has no NCCL");
}

bool NcclTensorParallel::Tracing() { return false; }

absl::Status NcclTensorParallel::AllReduce(void*, int64_t, int, cudaStream_t, const int32_t*) {
  return absl::FailedPreconditionError("this build has no NCCL");
}

absl::Status NcclTensorParallel::AllReduceSum(float* data, int64_t count, cudaStream_t stream) {
  return AllReduce(data, count, 0, stream);
}

absl::Status NcclTensorParallel::AllReduceSum(double* data, int64_t count, cudaStream_t stream) {
  return AllReduce(data, count, 0, stream);
}

absl::Status NcclTensorParallel::AllReduceSumUnless(float* data, int64_t count,
                                                    const int32_t* /*skip*/, cudaStream_t stream) {
  return AllReduce(data, count, 0, stream);
}

}  // namespace tokenselect::engine
