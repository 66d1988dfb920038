#include "engine/parallel/peer_all_reduce.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/cuda_status.h"

namespace tokenselect::engine {
namespace {

using kernels::cuda::CudaStatus;
using kernels::cuda::kPeerBlocks;
using kernels::cuda::kPeerMaxRanks;

// TS_TP_PEER_MAX_BYTES, or the default: 8 MiB on 2 GPUs, none on more (measured on 4 x H200,
// bench_allreduce_cuda: no faster than NCCL at 16 KiB, slower from 256 KiB).
int64_t MaxPushBytes(int ranks) {
  const char* v = std::getenv("TS_TP_PEER_MAX_BYTES");
  if (v != nullptr && v[0] != '\0') return std::strtoll(v, nullptr, 10);
  return ranks == 2 ? PeerAllReduceGroup::kDefaultMaxPushBytes : 0;
}

// TS_TP_PEER_SMALL_BYTES, or the default: messages up to this many bytes take the marker
// protocol (0: none do).
int64_t SmallSlotBytes(int64_t slot_bytes) {
  const char* v = std::getenv("TS_TP_PEER_SMALL_BYTES");
  const int64_t bytes = v != nullptr && v[0] != '\0' ? std::strtoll(v, nullptr, 10)
                                                      : PeerAllReduceGroup::kDefaultSmallBytes;
  return std::max<int64_t>(0, std::min(bytes, slot_bytes)) / 16 * 16;
}

bool DisabledByEnv() {
  const char* v = std::getenv("TS_TP_ALLREDUCE");
  return v != nullptr && std::strcmp(v, "nccl") == 0;
}

// Restores the calling thread's current device when it goes out of scope.
class DeviceRestorer {
 public:
  DeviceRestorer() { cudaGetDevice(&device_); }
  ~DeviceRestorer() {
    if (device_ >= 0) cudaSetDevice(device_);
  }

 private:
  int device_ = -1;
};

}  // namespace

absl::StatusOr<std::shared_ptr<PeerAllReduceGroup>> PeerAllReduceGroup::Create(
    const std::vector<int>& devices, int64_t max_push_bytes) {
  const int n = static_cast<int>(devices.size());
  if (DisabledByEnv()) return absl::UnavailableError("TS_TP_ALLREDUCE=nccl");
  if (n < 2 || n > kPeerMaxRanks) {
    return absl::UnavailableError(
        absl::StrCat("peer all-reduce: needs 2 to ", kPeerMaxRanks, " GPUs, got ", n));
  }
  if (max_push_bytes <= 0) max_push_bytes = MaxPushBytes(n);
  const int64_t slot_bytes = max_push_bytes / (n - 1) / 16 * 16;
  if (slot_bytes <= 0) {
    return absl::UnavailableError(absl::StrCat(
        "peer all-reduce: off for ", n, " GPUs (TS_TP_PEER_MAX_BYTES turns it on)"));
  }
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      int can = 0;
      RETURN_IF_ERROR(CudaStatus(cudaDeviceCanAccessPeer(&can, devices[a], devices[b]),
                                 "cudaDeviceCanAccessPeer"));
      if (!can) {
        return absl::UnavailableError(absl::StrCat("peer all-reduce: GPU ", devices[a],
                                                   " cannot access GPU ", devices[b]));
      }
    }
  }
  DeviceRestorer restore;
  std::shared_ptr<PeerAllReduceGroup> group(new PeerAllReduceGroup());
  group->devices_ = devices;
  group->buffers_.assign(static_cast<size_t>(n), nullptr);
  void* abort_word = nullptr;
  RETURN_IF_ERROR(CudaStatus(
      cudaHostAlloc(&abort_word, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable),
      "cudaHostAlloc (peer all-reduce abort word)"));
  group->abort_ = static_cast<volatile int*>(abort_word);
  *group->abort_ = 0;
  void* abort_device = nullptr;
  RETURN_IF_ERROR(CudaStatus(cudaHostGetDevicePointer(&abort_device, abort_word, 0),
                             "cudaHostGetDevicePointer"));

  // Per rank: the two areas' call counters, then the receive area, then the small one.
  const int64_t counter_bytes = 2 * int64_t{kPeerBlocks} * 4;
  const int64_t recv_offset = (counter_bytes + 255) / 256 * 256;
  const int64_t recv_bytes = 2 * n * slot_bytes;
  const int64_t small_slot_bytes = SmallSlotBytes(slot_bytes);
  const int64_t small_offset = recv_offset + recv_bytes;
  const int64_t total = small_offset + 2 * n * small_slot_bytes;
  for (int r = 0; r < n; ++r) {
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(devices[r]), "cudaSetDevice"));
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      const cudaError_t err = cudaDeviceEnablePeerAccess(devices[p], 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // NCCL (or an earlier group) enabled it: fine
      } else if (err != cudaSuccess) {
        return CudaStatus(err, absl::StrCat("cudaDeviceEnablePeerAccess(", devices[p], ")"));
      }
    }
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(&group->buffers_[r], static_cast<size_t>(total)),
                               "cudaMalloc (peer all-reduce buffers)"));
    // The counters start at 0, every byte of both receive areas at the marker.
    unsigned char* base = static_cast<unsigned char*>(group->buffers_[r]);
    RETURN_IF_ERROR(CudaStatus(cudaMemset(base, 0, static_cast<size_t>(recv_offset)),
                               "cudaMemset (peer all-reduce counters)"));
    RETURN_IF_ERROR(CudaStatus(
        cudaMemset(base + recv_offset, 0xff, static_cast<size_t>(total - recv_offset)),
        "cudaMemset (peer all-reduce receive areas)"));
    RETURN_IF_ERROR(CudaStatus(kernels::cuda::PeerAllReducePrepare(), "peer all-reduce kernels"));
    RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "peer all-reduce set-up"));
  }
  group->views_.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    kernels::cuda::PeerAllReduceView& v = group->views_[r];
    for (int p = 0; p < n; ++p) {
      v.recv[p] = static_cast<unsigned char*>(group->buffers_[p]) + recv_offset;
    }
    unsigned char* own = static_cast<unsigned char*>(group->buffers_[r]);
    v.epochs = reinterpret_cast<uint32_t*>(own);
    if (small_slot_bytes > 0) {
      for (int p = 0; p < n; ++p) {
        v.small[p] = static_cast<unsigned char*>(group->buffers_[p]) + small_offset;
      }
      v.small_epochs = reinterpret_cast<uint32_t*>(own) + kPeerBlocks;
      v.small_slot_bytes = small_slot_bytes;
    }
    v.abort = static_cast<const volatile int*>(abort_device);
    v.slot_bytes = slot_bytes;
    v.rank = r;
    v.size = n;
  }
  return group;
}

PeerAllReduceGroup::~PeerAllReduceGroup() {
  DeviceRestorer restore;
  for (size_t r = 0; r < buffers_.size(); ++r) {
    if (buffers_[r] == nullptr) continue;
    cudaSetDevice(devices_[r]);
    cudaFree(buffers_[r]);
  }
  if (abort_ != nullptr) cudaFreeHost(const_cast<int*>(abort_));
}

void PeerAllReduceGroup::Abort() {
  if (abort_ != nullptr) *abort_ = 1;
}

}  // namespace tokenselect::engine
