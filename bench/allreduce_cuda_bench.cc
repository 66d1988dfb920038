// Tensor-parallel all-reduce (sum, fp32, in place) through NcclTensorParallel, NCCL's ring
// against the peer-memory kernel (engine/parallel/peer_all_reduce.h), in the same process and
// the same run: per size, every rank captures 20 calls in one CUDA graph, replays it twice to
// warm up, then 10 times timed (host barrier before each launch, as the engine does); microseconds
// per call on rank 0. The sizes are the decode step's (hidden 4096 = 16 KiB; the soft vote over
// N cached tokens = 4N bytes) and a 512-token prefill chunk's residual (8 MiB).
//   bench_allreduce_cuda [--tp 2] [--floats 4096,262144,1048576,2097152]
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/parallel/nccl_tensor_parallel.h"
#include "engine/parallel/rank_barrier.h"
#include "engine/parallel/tp_cuda_model.h"

namespace tokenselect::engine {
namespace {

const bool kEagerLoading = [] {
  TpCudaModel::RequestEagerLoading(/*tp_size=*/2);
  return true;
}();

constexpr int kCallsPerGraph = 20;
constexpr int kReplays = 10;

using Group = std::vector<std::unique_ptr<NcclTensorParallel>>;

// Microseconds per all-reduce of `count` floats on rank 0 (negative on an error).
double TimeAllReduce(Group& group, int64_t count) {
  const int n = static_cast<int>(group.size());
  RankBarrier barrier(n);
  std::vector<double> us(n, -1.0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(r);
      cudaStream_t s;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      float* data = nullptr;
      cudaMalloc(reinterpret_cast<void**>(&data), count * 4);
      cudaMemset(data, 0, count * 4);
      // One call outside capture: NCCL connects lazily, and not while a stream captures.
      const absl::Status eager = group[r]->AllReduceSum(data, count, s);
      if (!eager.ok()) std::fprintf(stderr, "rank %d: %s\n", r, eager.ToString().c_str());
      cudaDeviceSynchronize();
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      bool ok = eager.ok() && barrier.Wait().ok() &&
                cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
      for (int c = 0; ok && c < kCallsPerGraph; ++c) {
        const absl::Status st = group[r]->AllReduceSum(data, count, s);
        if (!st.ok()) {
          std::fprintf(stderr, "rank %d: %s\n", r, st.ToString().c_str());
          ok = false;
        }
      }
      ok = cudaStreamEndCapture(s, &graph) == cudaSuccess && ok &&
           cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
      cudaEvent_t start, stop;
      cudaEventCreate(&start);
      cudaEventCreate(&stop);
      for (int rep = 0; ok && rep < 2 + kReplays; ++rep) {
        if (rep == 2) cudaEventRecord(start, s);
        ok = barrier.Wait().ok() && cudaGraphLaunch(exec, s) == cudaSuccess;
      }
      cudaEventRecord(stop, s);
      ok = cudaStreamSynchronize(s) == cudaSuccess && ok;
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, start, stop);
      if (ok) us[r] = 1000.0 * ms / (kReplays * kCallsPerGraph);
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
      if (exec != nullptr) cudaGraphExecDestroy(exec);
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaFree(data);
      cudaStreamDestroy(s);
    });
  }
  for (auto& t : threads) t.join();
  return us[0];
}

int Main(int argc, char** argv) {
  int tp = 2;
  std::vector<int64_t> sizes = {4096, 65536, 262144, 1048576, 2097152};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--tp") == 0) {
      tp = std::atoi(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--floats") == 0) {
      sizes.clear();
      std::stringstream in(argv[i + 1]);
      std::string item;
      while (std::getline(in, item, ',')) sizes.push_back(std::atoll(item.c_str()));
    } else {
      std::fprintf(stderr, "usage: bench_allreduce_cuda [--tp N] [--floats a,b,...]\n");
      return 2;
    }
  }
  int devices = 0;
  cudaGetDeviceCount(&devices);
  if (devices < tp || tp < 2) {
    std::printf("needs %d GPUs, %d present: skipped\n", tp, devices);
    return 0;
  }
  std::vector<int> ordinals;
  for (int r = 0; r < tp; ++r) ordinals.push_back(r);
  setenv("TS_TP_ALLREDUCE", "nccl", 1);
  auto nccl = NcclTensorParallel::CreateGroup(ordinals);
  unsetenv("TS_TP_ALLREDUCE");
  auto peer = NcclTensorParallel::CreateGroup(ordinals);
  if (!nccl.ok() || !peer.ok()) {
    std::fprintf(stderr, "group: %s / %s\n", nccl.status().ToString().c_str(),
                 peer.status().ToString().c_str());
    return 1;
  }
  // NCCL connects lazily per algorithm and protocol: one untimed pass first.
  for (int64_t count : sizes) TimeAllReduce(*nccl, count);
  std::printf("all-reduce, fp32 sum in place, TP=%d, us per call (graph of %d, %d replays)\n", tp,
              kCallsPerGraph, kReplays);
  std::printf("| floats | bytes | NCCL us | peer-memory us | NCCL / peer | peer bus GB/s |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (int64_t count : sizes) {
    const double a = TimeAllReduce(*nccl, count);
    const double b = TimeAllReduce(*peer, count);
    // Bytes each rank sends to its peers: count * 4 * (tp - 1).
    const double gbs = b > 0 ? count * 4.0 * (tp - 1) / (b * 1e3) : 0.0;
    const bool used = (*peer)[0]->UsesPeerMemory(count * 4);
    std::printf("| %lld | %lld | %.2f | %.2f%s | %.2fx | %.0f |\n", static_cast<long long>(count),
                static_cast<long long>(count * 4), a, b, used ? "" : " (NCCL: over the limit)",
                b > 0 ? a / b : 0.0, gbs);
  }
  // The communicators are destroyed on their ranks' devices.
  for (Group* g : {&*nccl, &*peer}) {
    for (int r = 0; r < tp; ++r) {
      cudaSetDevice(r);
      (*g)[r].reset();
    }
  }
  return 0;
}

}  // namespace
}  // namespace tokenselect::engine

int main(int argc, char** argv) { return tokenselect::engine::Main(argc, argv); }
