// KvGather / KvScatter (kernels/cuda/kv_pack.h) against a CPU reference: the staging layout
// [layers, 2, tokens, row], scrambled slots on both sides, a layer sub-range, the 16-byte and the
// element path, out-of-range slots, and argument checks.
#include "kernels/cuda/kv_pack.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace tokenselect::kernels::cuda {
namespace {

using gpu_test::DeviceBuffer;

// A paged cache of `num_layers` K and V arrays [num_slots, row] filled with random bf16 bits.
struct Cache {
  Cache(int64_t num_layers, int64_t num_slots, int64_t row, uint32_t seed)
      : num_slots(num_slots), row(row) {
    std::mt19937 rng(seed);
    for (int64_t a = 0; a < 2 * num_layers; ++a) {
      std::vector<uint16_t> h(num_slots * row);
      for (auto& x : h) x = static_cast<uint16_t>(rng());
      host.push_back(h);
      dev.push_back(std::make_unique<DeviceBuffer<uint16_t>>(h));
    }
  }
  // Device arrays of the layer pointers [first, last) for K (kv = 0) or V (kv = 1).
  DeviceBuffer<__nv_bfloat16*> Table(int kv, int64_t first, int64_t last) const {
    std::vector<__nv_bfloat16*> ptrs;
    for (int64_t l = first; l < last; ++l) {
      ptrs.push_back(reinterpret_cast<__nv_bfloat16*>(dev[2 * l + kv]->get()));
    }
    return DeviceBuffer<__nv_bfloat16*>(ptrs);
  }
  void Download() {
    for (size_t a = 0; a < dev.size(); ++a) host[a] = dev[a]->Download();
  }
  int64_t num_slots, row;
  std::vector<std::vector<uint16_t>> host;  // [2 * layer + kv][slot * row + j]
  std::vector<std::unique_ptr<DeviceBuffer<uint16_t>>> dev;
};

std::vector<int32_t> ScrambledSlots(int64_t count, int64_t num_slots, uint32_t seed) {
  std::vector<int32_t> all(num_slots);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), std::mt19937(seed));
  return std::vector<int32_t>(all.begin(), all.begin() + count);
}

void RoundTrip(int64_t row, int max_blocks) {
  SCOPED_TRACE(testing::Message() << "row " << row << ", max_blocks " << max_blocks);
  const int64_t num_layers = 5, layer_begin = 1, layer_end = 4, tokens = 77;
  const int64_t n = layer_end - layer_begin;
  Cache src(num_layers, 300, row, 1);
  Cache dst(num_layers, 500, row, 2);
  const Cache dst_before(num_layers, 500, row, 2);  // the same random fill, kept on the host
  std::vector<int32_t> src_slots = ScrambledSlots(tokens, src.num_slots, 3);
  std::vector<int32_t> dst_slots = ScrambledSlots(tokens, dst.num_slots, 4);
  src_slots[5] = -1;                                   // gather: a zero row
  dst_slots[9] = static_cast<int32_t>(dst.num_slots);  // scatter: skipped

  // CPU reference of the staging buffer.
  std::vector<uint16_t> want(n * 2 * tokens * row, 0);
  for (int64_t l = 0; l < n; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      for (int64_t t = 0; t < tokens; ++t) {
        if (src_slots[t] < 0) continue;
        const uint16_t* from = &src.host[2 * (layer_begin + l) + kv][src_slots[t] * row];
        std::copy(from, from + row, &want[((l * 2 + kv) * tokens + t) * row]);
      }
    }
  }

  DeviceBuffer<uint16_t> staging(want.size());
  staging.Poison();
  DeviceBuffer<int32_t> d_src_slots(src_slots), d_dst_slots(dst_slots);
  auto sk = src.Table(0, layer_begin, layer_end), sv = src.Table(1, layer_begin, layer_end);
  KvGatherParams g;
  g.staging = reinterpret_cast<__nv_bfloat16*>(staging.get());
  g.k_layers = sk.get();
  g.v_layers = sv.get();
  g.slots = d_src_slots.get();
  g.num_layers = n;
  g.num_tokens = tokens;
  g.row = row;
  g.num_slots = src.num_slots;
  g.max_blocks = max_blocks;
  ASSERT_EQ(KvGather(g, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(staging.Download(), want);

  auto dk = dst.Table(0, layer_begin, layer_end), dv = dst.Table(1, layer_begin, layer_end);
  KvScatterParams s;
  s.k_layers = dk.get();
  s.v_layers = dv.get();
  s.staging = reinterpret_cast<const __nv_bfloat16*>(staging.get());
  s.slots = d_dst_slots.get();
  s.num_layers = n;
  s.num_tokens = tokens;
  s.row = row;
  s.num_slots = dst.num_slots;
  s.max_blocks = max_blocks;
  ASSERT_EQ(KvScatter(s, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dst.Download();
  // Every row of every layer: the scattered tokens' rows hold the staged rows, all others
  // (other slots, layers outside the range, the skipped out-of-range token) are untouched.
  std::vector<int64_t> token_of(dst.num_slots, -1);
  for (int64_t t = 0; t < tokens; ++t) {
    if (dst_slots[t] >= 0 && dst_slots[t] < dst.num_slots) token_of[dst_slots[t]] = t;
  }
  int64_t bad = 0;
  for (int64_t l = 0; l < num_layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const auto& got = dst.host[2 * l + kv];
      const auto& before = dst_before.host[2 * l + kv];
      for (int64_t slot = 0; slot < dst.num_slots; ++slot) {
        const bool written = l >= layer_begin && l < layer_end && token_of[slot] >= 0;
        const uint16_t* expect =
            written ? &want[(((l - layer_begin) * 2 + kv) * tokens + token_of[slot]) * row]
                    : &before[slot * row];
        bad += !std::equal(expect, expect + row, &got[slot * row]);
      }
    }
  }
  EXPECT_EQ(bad, 0) << "cache rows differing from the reference";
}

// Llama-3-8B rows (8 heads x 128: the 16-byte path), a row longer than one unrolled step (2048),
// and 36-element rows (72 bytes: the element path); uncapped grids and a capped one (3 blocks:
// warps stride over rows).
TEST(KvPackTest, GatherScatterVectorRows) { RoundTrip(1024, 0); }
TEST(KvPackTest, GatherScatterLongRowsCappedGrid) { RoundTrip(2048, 3); }
TEST(KvPackTest, GatherScatterOddRows) { RoundTrip(36, 0); }
TEST(KvPackTest, GatherScatterOddRowsCappedGrid) { RoundTrip(36, 3); }

TEST(KvPackTest, ArgumentChecks) {
  KvGatherParams g;
  g.num_tokens = -1;
  EXPECT_EQ(KvGather(g, nullptr), cudaErrorInvalidValue);
  g.num_tokens = 4;
  g.num_layers = 1;
  g.row = 8;
  g.num_slots = 4;
  EXPECT_EQ(KvGather(g, nullptr), cudaErrorInvalidValue);  // null pointers
  KvScatterParams s;
  s.num_layers = 0;  // nothing to do: no launch, no pointers needed
  s.num_tokens = 4;
  EXPECT_EQ(KvScatter(s, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace tokenselect::kernels::cuda
