// Read-pattern study for the key-reading kernels (selection scoring, decode attention), which
// stop at 3.4-3.6 TB/s on an H200 while a plain streaming read reaches ~4.5 TB/s
// (docs/kernel_tuning_log.md). The KV cache stores a token's keys as one 2 KiB row
// [num_kv_heads = 8][head_dim = 128] bf16; the kernels give each block one KV head, so a block
// reads 256-byte pieces 2 KiB apart. This bench times pure reads (a checksum, so nothing is
// optimised away) of 1M such rows in four patterns:
//   rows        each block streams whole 2 KiB rows of a contiguous token range
//   head-slice  block (range, head) reads only its head's 256 B of each row (the kernels' pattern)
//   rows-paged  whole rows through a scrambled slot list (pages of 16 tokens)
//   slice-paged the kernels' real pattern: head slices through the scrambled slot list
// and prints GB/s against a device-to-device copy measured in the same run. A second table
// mixes writes into the rows' read stream at 1/16 .. 1/1024 of its bytes (the scoring kernel
// writes 1/16: its fp32 logits), in block bursts and in warp runs, and prints the time they add
// next to writing them alone.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "bench/cuda_bench_util.h"

namespace {

constexpr int64_t kTokens = int64_t{1} << 20;
constexpr int kHeads = 8;
constexpr int kRowBytes = 2048;            // 8 heads x 128 x bf16
constexpr int kSliceBytes = kRowBytes / kHeads;
constexpr int kThreads = 256;

using tokenselect::bench::DeviceBuffer;

// Every thread loads 16-byte words and folds them into a per-block xor written at the end.
__global__ void ReadRows(const uint4* __restrict__ data, const int32_t* __restrict__ slots,
                         int64_t tokens_per_block, unsigned* out) {
  const int64_t first = blockIdx.x * tokens_per_block;
  constexpr int kWords = kRowBytes / 16;  // 128 words per row
  unsigned acc = 0;
  for (int64_t i = threadIdx.x; i < tokens_per_block * kWords; i += blockDim.x) {
    const int64_t t = first + i / kWords;
    const int64_t row = slots != nullptr ? slots[t] : t;
    const uint4 w = data[row * kWords + i % kWords];
    acc ^= w.x ^ w.y ^ w.z ^ w.w;
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;  // practically never: keeps the loads
}

__global__ void ReadSlices(const uint4* __restrict__ data, const int32_t* __restrict__ slots,
                           int64_t tokens_per_block, unsigned* out) {
  const int head = blockIdx.x % kHeads;
  const int64_t first = (blockIdx.x / kHeads) * tokens_per_block;
  constexpr int kWords = kSliceBytes / 16;  // 16 words per slice
  unsigned acc = 0;
  for (int64_t i = threadIdx.x; i < tokens_per_block * kWords; i += blockDim.x) {
    const int64_t t = first + i / kWords;
    const int64_t row = slots != nullptr ? slots[t] : t;
    const uint4 w = data[row * (kRowBytes / 16) + head * kWords + i % kWords];
    acc ^= w.x ^ w.y ^ w.z ^ w.w;
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

// ReadRows (no slot list) that also writes 1 word per 2^kShift words the block reads, into the
// block's own region of `wout`, in runs of kRun contiguous words (32: a warp's 512-byte store,
// the block's warps taking the runs in turn; kThreads: every thread a word at once, a 4 KiB
// burst per block): a run each time the block has read kRun << kShift words, and the words still
// due at the end (fewer than a run) after the loop, so exactly 2^-kShift of the bytes read are
// written, at any ratio. kShift 4 is the scoring kernel's ratio (fp32 logits of 32 heads, 128
// bytes, per 2 KiB token row of keys; its warps store a 16-token tile's logits together, 2 KiB
// per block per 32 KiB of keys); kShift -1 writes nothing. Compile-time ratios and runs keep the
// loop as lean as ReadRows'. Launch with kThreads threads.
template <int kShift, int kRun>
__global__ void ReadRowsWriting(const uint4* __restrict__ data, int64_t tokens_per_block,
                                uint4* __restrict__ wout, unsigned* out) {
  constexpr bool kWrites = kShift >= 0;
  constexpr int kRatio = kWrites ? kShift : 0;
  static_assert(kThreads % kRun == 0 && (kRun << kRatio) >= kThreads);
  constexpr int kWords = kRowBytes / 16;
  constexpr int kGroups = kThreads / kRun;  // a group of kRun threads stores a run
  constexpr int kPassesPerRun = (kRun << kRatio) / kThreads;
  const int64_t words = tokens_per_block * kWords;
  const uint4* in = data + blockIdx.x * words;
  const int64_t due = kWrites ? words >> kRatio : 0;  // words to write
  uint4* w = wout + blockIdx.x * due;
  const int64_t runs = due / kRun;
  unsigned acc = 0;
  int64_t i = threadIdx.x;
  for (int64_t r = 0; r < runs; ++r) {
    for (int p = 0; p < kPassesPerRun; ++p, i += kThreads) {
      const uint4 v = in[i];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (r % kGroups == threadIdx.x / kRun) {
      w[r * kRun + threadIdx.x % kRun] = make_uint4(acc, acc, acc, acc);
    }
  }
  for (; i < words; i += kThreads) {
    const uint4 v = in[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  for (int64_t j = runs * kRun + threadIdx.x; j < due; j += kThreads) {
    w[j] = make_uint4(acc, acc, acc, acc);
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

// Median of 20 timed runs after 5 warm-ups, each waited for (default stream).
float MedianMs(const std::function<void()>& fn) {
  return static_cast<float>(
      tokenselect::bench::MedianMs(nullptr, [&](int) { fn(); }, {20, 5, /*sync_each=*/true}));
}

int Main() {
  const size_t bytes = static_cast<size_t>(kTokens) * kRowBytes;  // 2 GiB
  DeviceBuffer<char> data(bytes), copy(bytes);
  DeviceBuffer<unsigned> out((1 << 20) / sizeof(unsigned));
  TS_CUDA_CHECK(cudaMemset(data.get(), 7, bytes));
  std::mt19937 rng(1);
  DeviceBuffer<int32_t> slots(tokenselect::bench::PagedSlots(kTokens, 0, &rng));
  int sms = 0;
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));

  const float copy_ms = static_cast<float>(
      tokenselect::bench::CopyMs(nullptr, copy.get(), data.get(), bytes, {20, 5, true}));
  const double copy_gbs = 2.0 * bytes / (copy_ms * 1e-3) / 1e9;
  std::printf("copy 2 GiB d2d: %.3f ms = %.0f GB/s (read + write)\n", copy_ms, copy_gbs);
  std::printf("%-12s %-10s %10s %10s %8s\n", "pattern", "blocks", "ms", "GB/s", "% copy");
  for (int per_sm : {4, 8, 16, 32}) {
    const int64_t blocks = static_cast<int64_t>(sms) * per_sm;
    const int64_t row_tokens = kTokens / blocks;  // rows: a block per token range
    const int64_t slice_tokens = kTokens * kHeads / blocks;
    struct Case {
      const char* name;
      bool slice;
      const int32_t* slots;
    };
    for (const Case& c :
         {Case{"rows", false, nullptr}, Case{"head-slice", true, nullptr},
          Case{"rows-paged", false, slots.get()}, Case{"slice-paged", true, slots.get()}}) {
      const float ms = MedianMs([&] {
        if (c.slice) {
          ReadSlices<<<static_cast<unsigned>(blocks), kThreads>>>(
              reinterpret_cast<const uint4*>(data.get()), c.slots, slice_tokens, out.get());
        } else {
          ReadRows<<<static_cast<unsigned>(blocks), kThreads>>>(
              reinterpret_cast<const uint4*>(data.get()), c.slots, row_tokens, out.get());
        }
      });
      TS_CUDA_CHECK(cudaGetLastError());
      // The bytes read: the block count need not divide the rows (up to 0.1% are left out).
      const double read_bytes = static_cast<double>(blocks) *
                                (c.slice ? slice_tokens * kSliceBytes : row_tokens * kRowBytes);
      const double gbs = read_bytes / (ms * 1e-3) / 1e9;
      std::printf("%-12s %-10lld %10.3f %10.0f %7.1f%%\n", c.name, static_cast<long long>(blocks),
                  ms, gbs, 100.0 * gbs / copy_gbs);
    }
  }

  // What a write stream mixed into a full-rate read stream costs, against its bytes: the rows
  // read at 8 blocks per SM, with one byte written per 2^shift read, in 4 KiB block bursts or
  // 512-byte warp runs. "+us" is the time over the reads alone; "memset us" the same bytes
  // written alone by cudaMemset, for scale.
  const int64_t blocks = static_cast<int64_t>(sms) * 8;
  const int64_t row_tokens = kTokens / blocks;
  const size_t read_bytes = static_cast<size_t>(blocks * row_tokens) * kRowBytes;
  const auto time_writing = [&](auto kernel) {
    return MedianMs([&] {
      kernel<<<static_cast<unsigned>(blocks), kThreads>>>(
          reinterpret_cast<const uint4*>(data.get()), row_tokens,
          reinterpret_cast<uint4*>(copy.get()), out.get());
    });
  };
  const float reads_ms = time_writing(ReadRowsWriting<-1, kThreads>);  // no writes
  TS_CUDA_CHECK(cudaGetLastError());
  std::printf("\nrows read with writes mixed in (%lld blocks): reads alone %.4f ms = %.0f GB/s\n",
              static_cast<long long>(blocks), reads_ms, read_bytes / (reads_ms * 1e-3) / 1e9);
  std::printf("%-14s %8s %10s %12s %10s %12s %10s\n", "written/read", "MiB", "memset us",
              "bursts ms", "+us", "warp runs ms", "+us");
  const auto row = [&](int shift, float burst_ms, float runs_ms) {
    TS_CUDA_CHECK(cudaGetLastError());
    const size_t wbytes = read_bytes >> shift;
    const float set_ms = MedianMs([&] { TS_CUDA_CHECK(cudaMemset(copy.get(), 1, wbytes)); });
    std::printf("1/%-12d %8.1f %10.1f %12.4f %10.1f %12.4f %10.1f\n", 1 << shift,
                wbytes / 1048576.0, set_ms * 1e3, burst_ms, (burst_ms - reads_ms) * 1e3, runs_ms,
                (runs_ms - reads_ms) * 1e3);
  };
  row(4, time_writing(ReadRowsWriting<4, kThreads>), time_writing(ReadRowsWriting<4, 32>));
  row(5, time_writing(ReadRowsWriting<5, kThreads>), time_writing(ReadRowsWriting<5, 32>));
  row(6, time_writing(ReadRowsWriting<6, kThreads>), time_writing(ReadRowsWriting<6, 32>));
  row(7, time_writing(ReadRowsWriting<7, kThreads>), time_writing(ReadRowsWriting<7, 32>));
  row(8, time_writing(ReadRowsWriting<8, kThreads>), time_writing(ReadRowsWriting<8, 32>));
  row(10, time_writing(ReadRowsWriting<10, kThreads>), time_writing(ReadRowsWriting<10, 32>));
  return 0;
}

}  // namespace

int main() { return Main(); }
