// NcclKvLink throughput (engine/transfer/nccl_kv_link.h) against plain NCCL, two processes on two
// GPUs. The bench process is the receiver (rank 1, GPU 1) and prints the table; it starts itself
// again with --child as the sender (rank 0, GPU 0).
//
// Shape: Llama-3-8B K/V of a 128K-token prompt: 32 layers x {K, V} x 131072 tokens x kv_dim 1024
// bf16 = 16 GiB. Both sides keep the K/V in pages of 16 slots handed out in a shuffled order
// (different on each side), as a page pool does.
//
//   nccl contiguous   one ncclSend / ncclRecv of a contiguous 16 GiB buffer (the ceiling: the
//                     same bytes with no packing, no chunking, no scrambled slots)
//   nccl per slice    the same buffer as 256 back-to-back 64 MiB ncclSend / ncclRecv: the cost
//                     of chunking alone
//   ... registered    the same two with a buffer from ncclMemAlloc registered with
//                     ncclCommRegister on both sides (NCCL's zero-copy P2P, as the link uses)
//   link per chunk    SendChunk / RecvChunk per 512-token chunk (all layers, 64 MiB), i.e. gather
//                     out of scrambled slots, ncclSend, ncclRecv, scatter into scrambled slots,
//                     then Flush: time on the receiver from a barrier to the last byte in its
//                     slots; once per (NcclKvLinkOptions::copy_blocks: how many SMs the pack /
//                     scatter kernels may take from NCCL, staging_buffers: chunks in flight)
//   gather / scatter  the pack kernels alone on GPU 1 (the same 256 chunks, no NCCL): their
//                     bytes read + written / time against the device's copy bandwidth
// Each row: best and median of --reps timed runs after one warm-up run.
//
//   bench_nccl_kv [--tokens N] [--reps R]
//
// 2 x H200 (NV18), NCCL 2.28.3, 128K tokens, 5 reps (docs/kv_transfer.md explains the numbers):
//   path                                       best ms  median ms  best GB/s  vs nccl (best)
//   nccl send/recv, one contiguous buffer         46.1       46.2      372.7     100%
//   nccl send/recv per 64 MiB slice (no pack)     50.7       50.7      338.9     90.9%
//     the same, registered: one buffer            46.3       46.4      370.7     99.5%
//     the same, registered: per 64 MiB slice      49.8       49.8      345.0     92.6%
//   link, copy_blocks 0 (uncapped), 3 buffers     57.1       57.5      301.1     80.8%
//   link, copy_blocks 32, 3 buffers               54.4       55.9      315.7     84.7%
//   link, copy_blocks 64, 3 buffers               54.3       56.6      316.7     85.0%
//   link, copy_blocks 128, 3 buffers (default)    55.7       56.7      308.5     82.8%
//   link, copy_blocks 192, 3 buffers              55.4       56.0      310.0     83.2%
//   link, copy_blocks 128, 4 buffers              54.9       55.7      312.7     83.9%
//   link, copy_blocks 128, 2 buffers              59.0       59.5      291.0     78.1%
//   link, copy_blocks 64, 2 buffers (before)      60.4       62.1      284.5     76.3%
//   KvGather / KvScatter alone, uncapped           9.7 / 9.9 ms = 3.5 TB/s read + written
//   KvGather / KvScatter alone, 32 blocks         29.6 / 29.3 ms = 1.16 TB/s
//   cudaMemcpy D2D (copy ceiling)                  4.0 ms = 4.3 TB/s
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "bench/cuda_bench_util.h"
#include "engine/transfer/nccl_kv_link.h"
#include "kernels/cuda/kv_pack.h"

namespace tokenselect {
namespace {

using engine::KvChunkRange;
using engine::NcclKvLink;

constexpr int64_t kLayers = 32;
constexpr int64_t kRow = 1024;
constexpr int64_t kChunk = 512;
constexpr int64_t kPage = 16;

#define NCCL_CHECK(expr)                                                                         \
  do {                                                                                           \
    const ncclResult_t r_ = (expr);                                                              \
    if (r_ != ncclSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, ncclGetErrorString(r_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Stats {
  double best = 0, median = 0;
};
Stats Summarize(std::vector<double> seconds) {
  std::sort(seconds.begin(), seconds.end());
  return {seconds.front(), seconds[seconds.size() / 2]};
}

// One side: the paged cache (16 GiB for 128K tokens), its shuffled slots, a raw blocking NCCL
// communicator for the baseline and barriers, and the contiguous baseline buffer.
struct Side {
  int rank = 0;
  int64_t tokens = 0;
  std::vector<__nv_bfloat16*> k, v;
  std::vector<int32_t> slots;  // [tokens]
  ncclComm_t raw = nullptr;
  cudaStream_t stream = nullptr;
  float* flag = nullptr;
  char* id_buffer = nullptr;  // a link's unique id travels over the raw communicator
  void* contiguous = nullptr;
  void* registered = nullptr;  // ncclMemAlloc, registered with `raw`
  void* registration = nullptr;

  int64_t bytes() const { return kLayers * 2 * tokens * kRow * 2; }

  void Init(int r, int64_t n, const std::string& raw_id) {
    rank = r;
    tokens = n;
    TS_CUDA_CHECK(cudaSetDevice(rank));
    const int64_t num_slots = tokens;
    for (int64_t l = 0; l < kLayers; ++l) {
      for (auto* list : {&k, &v}) {
        void* p = nullptr;
        TS_CUDA_CHECK(cudaMalloc(&p, num_slots * kRow * 2));
        TS_CUDA_CHECK(cudaMemset(p, rank == 0 ? 0x3c : 0, num_slots * kRow * 2));
        list->push_back(static_cast<__nv_bfloat16*>(p));
      }
    }
    std::mt19937 rng(rank + 7);
    slots = bench::PagedSlots(num_slots, 0, &rng);
    TS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    TS_CUDA_CHECK(cudaMalloc(&flag, sizeof(float)));
    TS_CUDA_CHECK(cudaMalloc(&id_buffer, NCCL_UNIQUE_ID_BYTES));
    TS_CUDA_CHECK(cudaMalloc(&contiguous, bytes()));
    TS_CUDA_CHECK(cudaMemset(contiguous, 0x3c, bytes()));
    ncclUniqueId id;
    std::memcpy(id.internal, raw_id.data(), NCCL_UNIQUE_ID_BYTES);
    NCCL_CHECK(ncclCommInitRank(&raw, 2, id, rank));
    NCCL_CHECK(ncclMemAlloc(&registered, bytes()));
    TS_CUDA_CHECK(cudaMemset(registered, 0x3c, bytes()));
    NCCL_CHECK(ncclCommRegister(raw, registered, bytes(), &registration));
  }

  engine::NcclKvCache Cache() const {
    engine::NcclKvCache c;
    c.k_layers = k;
    c.v_layers = v;
    c.num_slots = tokens;
    c.row = kRow;
    return c;
  }

  // A fresh unique id for a link, made by the receiver (rank 1) and sent to the sender (in the
  // service it travels over worker.proto).
  std::string ShareId() {
    std::string id(NCCL_UNIQUE_ID_BYTES, '\0');
    if (rank == 1) {
      auto made = NcclKvLink::CreateUniqueId();
      if (!made.ok()) std::exit(1);
      id = *made;
      TS_CUDA_CHECK(cudaMemcpy(id_buffer, id.data(), id.size(), cudaMemcpyHostToDevice));
      NCCL_CHECK(ncclSend(id_buffer, id.size(), ncclUint8, 0, raw, stream));
    } else {
      NCCL_CHECK(ncclRecv(id_buffer, id.size(), ncclUint8, 1, raw, stream));
    }
    TS_CUDA_CHECK(cudaStreamSynchronize(stream));
    TS_CUDA_CHECK(cudaMemcpy(id.data(), id_buffer, id.size(), cudaMemcpyDeviceToHost));
    return id;
  }

  void Barrier() {
    NCCL_CHECK(ncclAllReduce(flag, flag, 1, ncclFloat32, ncclSum, raw, stream));
    TS_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  // One ncclSend / ncclRecv of the whole contiguous (or registered) buffer; seconds.
  double Contiguous(bool use_registered) {
    void* buffer = use_registered ? registered : contiguous;
    Barrier();
    const double t0 = Now();
    if (rank == 0) {
      NCCL_CHECK(ncclSend(buffer, bytes(), ncclUint8, 1, raw, stream));
    } else {
      NCCL_CHECK(ncclRecv(buffer, bytes(), ncclUint8, 0, raw, stream));
    }
    TS_CUDA_CHECK(cudaStreamSynchronize(stream));
    return Now() - t0;
  }

  // The contiguous buffer as one ncclSend / ncclRecv per chunk-sized slice (64 MiB), back to
  // back on one stream: what chunking alone costs NCCL, without packing or scrambled slots.
  double ContiguousChunked(bool use_registered) {
    const int64_t slice = kLayers * 2 * kChunk * kRow * 2;
    Barrier();
    const double t0 = Now();
    for (int64_t off = 0; off < bytes(); off += slice) {
      char* p = static_cast<char*>(use_registered ? registered : contiguous) + off;
      const size_t n = static_cast<size_t>(std::min(slice, bytes() - off));
      if (rank == 0) {
        NCCL_CHECK(ncclSend(p, n, ncclUint8, 1, raw, stream));
      } else {
        NCCL_CHECK(ncclRecv(p, n, ncclUint8, 0, raw, stream));
      }
    }
    TS_CUDA_CHECK(cudaStreamSynchronize(stream));
    return Now() - t0;
  }

  // The first `tokens` tokens through the link, chunk by chunk; seconds.
  double Link(NcclKvLink* link, int64_t n) {
    Barrier();
    const double t0 = Now();
    for (int64_t t = 0; t < n; t += kChunk) {
      const KvChunkRange r{0, kLayers, t, std::min(n, t + kChunk)};
      const absl::Span<const int32_t> s(slots.data() + r.token_begin, r.token_end - r.token_begin);
      const absl::Status st = rank == 0 ? link->SendChunk(r, s) : link->RecvChunk(r, s);
      if (!st.ok()) {
        std::fprintf(stderr, "rank %d chunk at %ld: %s\n", rank, static_cast<long>(t),
                     st.ToString().c_str());
        std::exit(1);
      }
    }
    const absl::Status st = link->Flush();
    if (!st.ok()) {
      std::fprintf(stderr, "rank %d flush: %s\n", rank, st.ToString().c_str());
      std::exit(1);
    }
    return Now() - t0;
  }
};

// NcclKvLinkOptions swept: {copy_blocks, staging_buffers}.
struct Variant {
  int copy_blocks;
  int staging_buffers;
};
// {64, 2} was the first design's default.
constexpr Variant kVariants[] = {{0, 3},   {32, 3},  {64, 3},  {128, 3},
                                 {192, 3}, {128, 4}, {128, 2}, {64, 2}};

int Run(int rank, int64_t tokens, int reps, const std::string& raw_id, pid_t child) {
  Side side;
  side.Init(rank, tokens, raw_id);
  // [registered?]
  std::vector<double> contiguous[2], chunked[2];
  std::vector<std::vector<double>> linked;
  for (int reg = 0; reg < 2; ++reg) {
    side.Contiguous(reg);  // warm-up (NCCL connects p2p peers and maps registrations lazily)
    for (int i = 0; i < reps; ++i) contiguous[reg].push_back(side.Contiguous(reg));
    side.ContiguousChunked(reg);
    for (int i = 0; i < reps; ++i) chunked[reg].push_back(side.ContiguousChunked(reg));
  }
  for (const Variant& variant : kVariants) {
    engine::NcclKvLinkOptions options;
    options.max_chunk_tokens = kChunk;
    options.copy_blocks = variant.copy_blocks;
    options.staging_buffers = variant.staging_buffers;
    auto link = NcclKvLink::Connect(side.ShareId(), rank, rank, side.Cache(), options);
    if (!link.ok()) {
      std::fprintf(stderr, "rank %d connect: %s\n", rank, link.status().ToString().c_str());
      return 1;
    }
    side.Link(link->get(), 4 * kChunk);  // warm-up
    linked.emplace_back();
    for (int i = 0; i < reps; ++i) linked.back().push_back(side.Link(link->get(), tokens));
  }
  if (rank == 0) return 0;

  // The pack kernels alone on this GPU, over the same chunks (staging of one chunk, reused).
  const int64_t chunk_bytes = kLayers * 2 * kChunk * kRow * 2;
  bench::DeviceBuffer<char> staging_buffer(static_cast<size_t>(chunk_bytes));
  void* staging = staging_buffer.get();
  bench::DeviceBuffer<int32_t> slots_buffer(side.slots);
  const int32_t* d_slots = slots_buffer.get();
  std::vector<__nv_bfloat16*> host_tables(side.k);  // [K of each layer, V of each layer]
  host_tables.insert(host_tables.end(), side.v.begin(), side.v.end());
  bench::DeviceBuffer<__nv_bfloat16*> tables_buffer(host_tables);
  __nv_bfloat16** tables = tables_buffer.get();
  // Launches the pack kernels over all chunks (gather or scatter).
  auto run_kernels = [&](bool gather, int max_blocks) {
    for (int64_t t = 0; t < tokens; t += kChunk) {
      const int64_t n = std::min(kChunk, tokens - t);
      if (gather) {
        kernels::cuda::KvGatherParams g;
        g.staging = static_cast<__nv_bfloat16*>(staging);
        g.k_layers = tables;
        g.v_layers = tables + kLayers;
        g.slots = d_slots + t;
        g.num_layers = kLayers;
        g.num_tokens = n;
        g.row = kRow;
        g.num_slots = tokens;
        g.max_blocks = max_blocks;
        TS_CUDA_CHECK(kernels::cuda::KvGather(g, side.stream));
      } else {
        kernels::cuda::KvScatterParams s;
        s.k_layers = tables;
        s.v_layers = tables + kLayers;
        s.staging = static_cast<const __nv_bfloat16*>(staging);
        s.slots = d_slots + t;
        s.num_layers = kLayers;
        s.num_tokens = n;
        s.row = kRow;
        s.num_slots = tokens;
        s.max_blocks = max_blocks;
        TS_CUDA_CHECK(kernels::cuda::KvScatter(s, side.stream));
      }
    }
  };
  // Seconds of each of `reps` timed runs of fn (CUDA events on side.stream, each waited for).
  auto timed_s = [&](const std::function<void()>& fn, int warmup) {
    std::vector<double> t =
        bench::EventTimesMs(side.stream, [&](int) { fn(); }, {reps, warmup, /*sync_each=*/true});
    for (double& x : t) x /= 1e3;
    return t;
  };
  std::vector<double> gathers[2], scatters[2];  // uncapped, 32 blocks
  run_kernels(true, 0);
  for (int c = 0; c < 2; ++c) {
    gathers[c] = timed_s([&] { run_kernels(true, c == 0 ? 0 : 32); }, 0);
    scatters[c] = timed_s([&] { run_kernels(false, c == 0 ? 0 : 32); }, 0);
  }
  // Device copy ceiling: cudaMemcpy device to device of the contiguous buffer onto itself's half.
  const int64_t half = side.bytes() / 2;
  const std::vector<double> copies = timed_s(
      [&] {
        TS_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(side.contiguous) + half, side.contiguous,
                                      half, cudaMemcpyDeviceToDevice, side.stream));
      },
      /*warmup=*/1);

  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "the sender failed: wait status %d\n", status);
    return 1;
  }

  int nccl_version = 0;
  ncclGetVersion(&nccl_version);
  cudaDeviceProp prop;
  TS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 1));
  const double gb = side.bytes() / 1e9;
  std::printf(
      "NcclKvLink vs plain NCCL: %s x2, NCCL %d, %ld tokens x %ld layers x 2 x %ld bf16 = "
      "%.2f GiB, chunks of %ld tokens (%.0f MiB), pages of %ld shuffled slots, %d reps\n",
      prop.name, nccl_version, static_cast<long>(tokens), static_cast<long>(kLayers),
      static_cast<long>(kRow), side.bytes() / 1073741824.0, static_cast<long>(kChunk),
      chunk_bytes / 1048576.0, static_cast<long>(kPage), reps);
  for (const char* env :
       {"NCCL_LOCAL_REGISTER", "NCCL_P2P_LEVEL", "NCCL_P2P_NET_CHUNKSIZE", "NCCL_P2P_NVL_CHUNKSIZE",
        "NCCL_NCHANNELS_PER_PEER", "NCCL_P2P_USE_CUDA_MEMCPY", "NCCL_P2P_READ_ENABLE"}) {
    if (const char* v = std::getenv(env)) std::printf("  (diagnosis run: %s=%s)\n", env, v);
  }
  std::printf("%-44s %10s %10s %10s %10s %9s\n", "path", "best ms", "median ms", "best GB/s",
              "med GB/s", "vs nccl");
  const Stats c = Summarize(contiguous[0]), m = Summarize(copies);
  auto row = [&](const std::string& name, const Stats& st, double bytes, const std::string& note) {
    std::printf("%-44s %10.1f %10.1f %10.1f %10.1f %9s\n", name.c_str(), st.best * 1e3,
                st.median * 1e3, bytes / st.best / 1e9, bytes / st.median / 1e9, note.c_str());
  };
  auto ratio = [&](const Stats& st) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.1f%%", 100.0 * c.best / st.best);
    return std::string(text);
  };
  row("nccl send/recv, one contiguous buffer", c, side.bytes(), "100%");
  row("nccl send/recv per 64 MiB slice (no pack)", Summarize(chunked[0]), side.bytes(),
      ratio(Summarize(chunked[0])));
  row("  the same, registered: one buffer", Summarize(contiguous[1]), side.bytes(),
      ratio(Summarize(contiguous[1])));
  row("  the same, registered: per 64 MiB slice", Summarize(chunked[1]), side.bytes(),
      ratio(Summarize(chunked[1])));
  double best_link = 1e30;
  for (size_t i = 0; i < linked.size(); ++i) {
    const Stats l = Summarize(linked[i]);
    best_link = std::min(best_link, l.best);
    row("link, copy_blocks " + std::to_string(kVariants[i].copy_blocks) +
            (kVariants[i].copy_blocks == 0 ? " (uncapped)" : "") + ", " +
            std::to_string(kVariants[i].staging_buffers) + " buffers",
        l, side.bytes(), ratio(l));
  }
  std::printf("local kernels on GPU 1, no NCCL running (bytes read + written):\n");
  for (int cap = 0; cap < 2; ++cap) {
    const std::string suffix = cap == 0 ? ", uncapped" : ", 32 blocks";
    row("  KvGather, 256 chunks" + suffix, Summarize(gathers[cap]), 2 * side.bytes(), "");
    row("  KvScatter, 256 chunks" + suffix, Summarize(scatters[cap]), 2 * side.bytes(), "");
  }
  row("  cudaMemcpy D2D (copy ceiling)", m, 2.0 * half, "");
  std::printf(
      "napkin: %.2f GB at %.1f GB/s (nccl) = %.1f ms; best link %.1f ms = %.1f GB/s, "
      "overhead %.1f ms (target: link >= 80%% of nccl: %s)\n",
      gb, gb / c.best, c.best * 1e3, best_link * 1e3, gb / best_link, (best_link - c.best) * 1e3,
      best_link <= c.best / 0.8 ? "met" : "NOT met");
  return 0;
}

}  // namespace
}  // namespace tokenselect

int main(int argc, char** argv) {
  using tokenselect::Run;
  if (argc == 5 && std::strcmp(argv[1], "--child") == 0) {
    return Run(0, std::atoll(argv[3]), std::atoi(argv[4]), absl::HexStringToBytes(argv[2]), 0);
  }
  int64_t tokens = 131072;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--tokens") == 0) tokens = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
  }
  if (tokens <= 0 || tokens % tokenselect::kPage != 0 || reps <= 0) {
    std::fprintf(stderr, "--tokens must be a positive multiple of 16, --reps positive\n");
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    std::fprintf(stderr, "bench_nccl_kv needs 2 GPUs; found %d\n", devices);
    return 2;
  }
  auto raw_id = tokenselect::engine::NcclKvLink::CreateUniqueId();
  if (!raw_id.ok()) {
    std::fprintf(stderr, "ncclGetUniqueId failed\n");
    return 1;
  }
  const std::string a = absl::BytesToHexString(*raw_id);
  const std::string n = std::to_string(tokens), r = std::to_string(reps);
  const pid_t child = fork();
  if (child == 0) {
    execl("/proc/self/exe", "bench_nccl_kv", "--child", a.c_str(), n.c_str(), r.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  return Run(1, tokens, reps, *raw_id, child);
}
