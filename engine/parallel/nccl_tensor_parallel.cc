#include "engine/parallel/nccl_tensor_parallel.h"

#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/parallel/rank_barrier.h"
#include "kernels/cuda/cuda_status.h"

namespace tokenselect::engine {
namespace {

absl::Status NcclStatus(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", ncclGetErrorString(r), " (", ncclGetLastError(nullptr), ")"));
}

}  // namespace

bool NcclTensorParallel::Tracing() {
  static const bool trace = [] {
    const char* v = std::getenv("TS_TP_TRACE");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  return trace;
}

absl::StatusOr<std::vector<std::unique_ptr<NcclTensorParallel>>> NcclTensorParallel::CreateGroup(
    const std::vector<int>& devices, bool fixed_tree) {
  if (devices.empty()) {
    return absl::InvalidArgumentError("NcclTensorParallel: no devices");
  }
  std::vector<int> sorted = devices;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() || sorted[0] < 0) {
    return absl::InvalidArgumentError(
        "NcclTensorParallel: devices must be distinct non-negative ordinals");
  }
  const int n = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(static_cast<size_t>(n), nullptr);
  const absl::Status made =
      NcclStatus(ncclCommInitAll(comms.data(), n, devices.data()), "ncclCommInitAll");
  if (!made.ok()) return made;
  std::vector<std::unique_ptr<NcclTensorParallel>> group;
  auto barrier = std::make_shared<RankBarrier>(n);
  std::shared_ptr<PeerAllReduceGroup> peer;
  // A fixed tree over more than 2 ranks needs the peer group for every message.
  const bool tree_needs_peer = fixed_tree && n > 2;
  if (n > 1) {
    auto made_peer =
        PeerAllReduceGroup::Create(devices, tree_needs_peer ? kFixedTreeMaxBytes * (n - 1) : 0);
    if (made_peer.ok()) {
      peer = *std::move(made_peer);
    } else if (!absl::IsUnavailable(made_peer.status()) || tree_needs_peer) {
      for (ncclComm_t comm : comms) ncclCommDestroy(comm);
      return made_peer.status();
    }
  }
  for (int r = 0; r < n; ++r) {
    group.push_back(std::unique_ptr<NcclTensorParallel>(
        new NcclTensorParallel(comms[r], r, n, barrier, peer, fixed_tree)));
  }
  return group;
}

NcclTensorParallel::~NcclTensorParallel() {
  absl::MutexLock lock(&mu_);
  if (comm_ != nullptr && !aborted_) ncclCommDestroy(comm_);
}

absl::Status NcclTensorParallel::WaitForRanks() { return barrier_->Wait(); }

void NcclTensorParallel::Abort() {
  barrier_->Abort();  // first: a rank waiting in the barrier holds no lock of this rank
  if (peer_ != nullptr) peer_->Abort();  // ends the peer kernels' waits on every rank
  absl::MutexLock lock(&mu_);
  if (aborted_ || comm_ == nullptr) return;
  int device = -1;
  cudaGetDevice(&device);
  ncclCommAbort(comm_);  // frees the communicator
  if (device >= 0) cudaSetDevice(device);
  aborted_ = true;
  comm_ = nullptr;
}

absl::Status NcclTensorParallel::AllReduce(void* data, int64_t count, int type,
                                           cudaStream_t stream, const int32_t* skip) {
  if (count < 0) return absl::InvalidArgumentError("AllReduceSum: negative count");
  if (count == 0) return absl::OkStatus();
  // Outside graph capture the collective is launched now: only once every rank got here
  // (CudaTensorParallel::WaitForRanks). A captured one is launched with its graph, after the
  // caller's WaitForRanks.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    return absl::InternalError("ncclAllReduce: cudaStreamIsCapturing failed");
  }
  if (capture == cudaStreamCaptureStatusNone) {
    const absl::Status all_here = barrier_->Wait();
    if (!all_here.ok()) return all_here;
  }
  absl::MutexLock lock(&mu_);
  const int64_t bytes = count * (type == ncclFloat64 ? 8 : 4);
  const bool peer = UsesPeerMemory(bytes);
  if (!peer && fixed_tree_ && size_ > 2) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "fixed-tree all-reduce: a message of ", bytes, " bytes exceeds the peer group's ",
        kFixedTreeMaxBytes, " (TP-invariant numerics over ", size_, " GPUs)"));
  }
  if (Tracing()) {
    std::fprintf(stderr, "[tp] rank %d all-reduce #%lld: %lld values (%s)\n", rank_,
                 static_cast<long long>(calls_), static_cast<long long>(count),
                 peer ? "peer" : "nccl");
  }
  ++calls_;
  if (aborted_) {
    return absl::FailedPreconditionError(
        absl::StrCat("ncclAllReduce: rank ", rank_, "'s communicator was aborted after an error"));
  }
  if (peer) {
    const kernels::cuda::PeerAllReduceView& view = peer_->view(rank_);
    const cudaError_t err =
        type == ncclFloat64
            ? kernels::cuda::PeerAllReduceSum(static_cast<double*>(data), count, view, stream,
                                              skip)
            : kernels::cuda::PeerAllReduceSum(static_cast<float*>(data), count, view, stream,
                                              skip);
    return kernels::cuda::CudaStatus(err, "peer all-reduce");
  }
  return NcclStatus(ncclAllReduce(data, data, static_cast<size_t>(count),
                                  static_cast<ncclDataType_t>(type), ncclSum, comm_, stream),
                    "ncclAllReduce");
}

absl::Status NcclTensorParallel::AllReduceSum(float* data, int64_t count, cudaStream_t stream) {
  return AllReduce(data, count, ncclFloat32, stream);
}

absl::Status NcclTensorParallel::AllReduceSum(double* data, int64_t count, cudaStream_t stream) {
  return AllReduce(data, count, ncclFloat64, stream);
}

absl::Status NcclTensorParallel::AllReduceSumUnless(float* data, int64_t count,
                                                    const int32_t* skip, cudaStream_t stream) {
  return AllReduce(data, count, ncclFloat32, stream, skip);
}

}  // namespace tokenselect::engine
