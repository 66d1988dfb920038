// Read-pattern study for the key-reading kernels (selection scoring, decode attention), which
// stop at 3.4-3.6 TB/s on an H200 while a plain streaming read reaches ~4.5 TB/s
// (docs/performance.md). The KV cache stores a token's keys as one 2 KiB row
// [num_kv_heads = 8][head_dim = 128] bf16; the kernels give each block one KV head, so a block
// reads 256-byte pieces 2 KiB apart. This bench times pure reads (a checksum, so nothing is
// optimised away) of 1M such rows in four patterns:
//   rows        each block streams whole 2 KiB rows of a contiguous token range
//   head-slice  block (range, head) reads only its head's 256 B of each row (the kernels' pattern)
//   rows-paged  whole rows through a scrambled slot list (pages of 16 tokens)
//   slice-paged the kernels' real pattern: head slices through the scrambled slot list
// and prints GB/s against a device-to-device copy measured in the same run.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

namespace {

constexpr int64_t kTokens = int64_t{1} << 20;
constexpr int kHeads = 8;
constexpr int kRowBytes = 2048;            // 8 heads x 128 x bf16
constexpr int kSliceBytes = kRowBytes / kHeads;
constexpr int kThreads = 256;

#define CHECK(x)                                                                  \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));               \
      return 1;                                                                   \
    }                                                                             \
  } while (0)

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

template <typename Fn>
float MedianMs(Fn&& fn) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ms;
  for (int i = 0; i < 25; ++i) {
    cudaEventRecord(a);
    fn();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    if (i >= 5) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms[ms.size() / 2];
}

int Main() {
  const size_t bytes = static_cast<size_t>(kTokens) * kRowBytes;  // 2 GiB
  void *data = nullptr, *copy = nullptr;
  unsigned* out = nullptr;
  int32_t* slots = nullptr;
  CHECK(cudaMalloc(&data, bytes));
  CHECK(cudaMalloc(&copy, bytes));
  CHECK(cudaMalloc(&out, 1 << 20));
  CHECK(cudaMemset(data, 7, bytes));
  std::vector<int32_t> pages(kTokens / 16);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), std::mt19937(1));
  std::vector<int32_t> host(kTokens);
  for (int64_t t = 0; t < kTokens; ++t) host[t] = pages[t / 16] * 16 + static_cast<int32_t>(t % 16);
  CHECK(cudaMalloc(&slots, kTokens * 4));
  CHECK(cudaMemcpy(slots, host.data(), kTokens * 4, cudaMemcpyHostToDevice));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));

  const float copy_ms = MedianMs([&] { cudaMemcpyAsync(copy, data, bytes, cudaMemcpyDeviceToDevice); });
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
    for (const Case& c : {Case{"rows", false, nullptr}, Case{"head-slice", true, nullptr},
                          Case{"rows-paged", false, slots}, Case{"slice-paged", true, slots}}) {
      const float ms = MedianMs([&] {
        if (c.slice) {
          ReadSlices<<<static_cast<unsigned>(blocks), kThreads>>>(
              static_cast<const uint4*>(data), c.slots, slice_tokens, out);
        } else {
          ReadRows<<<static_cast<unsigned>(blocks), kThreads>>>(static_cast<const uint4*>(data),
                                                               c.slots, row_tokens, out);
        }
      });
      CHECK(cudaGetLastError());
      const double gbs = bytes / (ms * 1e-3) / 1e9;
      std::printf("%-12s %-10lld %10.3f %10.0f %7.1f%%\n", c.name, static_cast<long long>(blocks),
                  ms, gbs, 100.0 * gbs / copy_gbs);
    }
  }
  return 0;
}

}  // namespace

int main() { return Main(); }
