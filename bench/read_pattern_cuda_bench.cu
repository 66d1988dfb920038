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
// and prints GB/s against a device-to-device copy measured in the same run.
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
      const double gbs = bytes / (ms * 1e-3) / 1e9;
      std::printf("%-12s %-10lld %10.3f %10.0f %7.1f%%\n", c.name, static_cast<long long>(blocks),
                  ms, gbs, 100.0 * gbs / copy_gbs);
    }
  }
  return 0;
}

}  // namespace

int main() { return Main(); }
