// Needs a GPU (label gpu): CUDA split-KV decode attention (kernels/cuda/decode_attention.h)
// against cpu::GatherAttention (kernels/ops.h) on the same bf16-rounded inputs, per request.
// Fresh random inputs every run; batches mix an empty list, tiny lists and long ones; groups
// 1/2/4/8; head dims 64/128; compact positions and large true positions (RoPE angles ~1e6, where
// a naive fast sincos would be badly off); 1 split, the planned split count and an odd one; both
// split kernels (tensor cores and CUDA cores); a 200K-token list runs the tensor-core kernel's
// cp.async pipeline through hundreds of tiles per warp.
// The output is poisoned with NaN before every launch. Tolerance: relative L2 error per request
// <= 5e-3 and max abs error <= 2e-2 * max |ref| (bf16 output rounding is ~2e-3 relative).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/ops.h"
#include "tests/gpu/fresh_seed.h"
#include "tests/gpu/gpu_test_util.h"

namespace tokenselect::kernels::cuda {
namespace {

using gpu_test::DeviceBuffer;

struct DecodeCase {
  std::vector<int64_t> lengths;
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  bool true_positions;  // positions spread up to ~1M instead of 0..len-1
};

class DecodeAttentionGpuTest : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(DecodeAttentionGpuTest, MatchesCpuGatherAttention) {
  const DecodeCase c = GetParam();
  const gpu_test::FreshSeed seed;
  std::mt19937 rng(seed.value());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t batch = static_cast<int64_t>(c.lengths.size());
  std::vector<int32_t> indptr(1, 0);
  for (int64_t len : c.lengths) indptr.push_back(indptr.back() + static_cast<int32_t>(len));
  const int64_t nnz = indptr.back();
  const int64_t num_slots = nnz + 1001;
  const int64_t row = c.num_kv_heads * c.head_dim;
  std::vector<float> k_cache(static_cast<size_t>(num_slots * row));
  std::vector<float> v_cache(k_cache.size());
  for (float& x : k_cache) x = normal(rng);
  for (float& x : v_cache) x = normal(rng);
  std::vector<float> q(static_cast<size_t>(batch * c.num_heads * c.head_dim));
  for (float& x : q) x = normal(rng);
  const auto k_bits = gpu_test::RoundToBf16(&k_cache);
  const auto v_bits = gpu_test::RoundToBf16(&v_cache);
  const auto q_bits = gpu_test::RoundToBf16(&q);
  std::uniform_int_distribution<int32_t> any_slot(0, static_cast<int32_t>(num_slots - 1));
  std::vector<int32_t> indices(static_cast<size_t>(nnz)), positions(static_cast<size_t>(nnz));
  std::vector<int32_t> q_positions(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    int32_t pos = 0;
    std::uniform_int_distribution<int32_t> gap(1, 30);
    for (int32_t e = indptr[b]; e < indptr[b + 1]; ++e) {
      indices[e] = any_slot(rng);  // repeats allowed: a list may name a slot twice
      positions[e] = pos;
      pos += c.true_positions ? gap(rng) : 1;
    }
    q_positions[b] = pos;
  }
  RopeParams rope;
  rope.head_dim = c.head_dim;
  rope.theta = 500000.0;
  const std::vector<float> inv_freq = RopeInverseFrequencies(rope);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  // CPU reference, one request at a time.
  std::vector<float> ref(q.size(), 0.0f);
  for (int64_t b = 0; b < batch; ++b) {
    GatherAttentionParams gp;
    gp.out = ref.data() + b * c.num_heads * c.head_dim;
    gp.q = q.data() + b * c.num_heads * c.head_dim;
    gp.q_positions = q_positions.data() + b;
    gp.k_cache = k_cache.data();
    gp.v_cache = v_cache.data();
    gp.kv_slots = indices.data() + indptr[b];
    gp.kv_positions = positions.data() + indptr[b];
    gp.inv_freq = inv_freq.data();
    gp.num_queries = 1;
    gp.kv_len = indptr[b + 1] - indptr[b];
    gp.num_heads = c.num_heads;
    gp.num_kv_heads = c.num_kv_heads;
    gp.head_dim = c.head_dim;
    gp.scale = scale;
    cpu::GatherAttention(gp);
  }

  DeviceBuffer<uint16_t> d_k(k_bits), d_v(v_bits), d_q(q_bits);
  DeviceBuffer<int32_t> d_indptr(indptr), d_indices(indices), d_positions(positions);
  DeviceBuffer<int32_t> d_q_positions(q_positions);
  DeviceBuffer<float> d_inv_freq(inv_freq);
  DeviceBuffer<uint16_t> d_out(q.size());
  int num_sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const int64_t max_len = *std::max_element(c.lengths.begin(), c.lengths.end());
  const int planned = PlanDecodeSplits(batch, c.num_kv_heads, max_len, num_sms);
  double worst[2] = {0.0, 0.0};  // relative L2 error: CUDA cores, tensor cores
  for (int variant = 0; variant < 6; ++variant) {
    const int splits = variant % 3 == 0 ? 1 : variant % 3 == 1 ? planned : 7;
    const bool tensor_cores = variant < 3;
    SCOPED_TRACE(testing::Message() << "splits=" << splits << " tensor_cores=" << tensor_cores);
    DeviceBuffer<char> ws(
        DecodeAttentionWorkspaceBytes(batch, c.num_heads, c.head_dim, splits));
    ws.Poison();
    d_out.Poison();
    DecodeAttentionParams p;
    p.out = reinterpret_cast<__nv_bfloat16*>(d_out.get());
    p.q = reinterpret_cast<const __nv_bfloat16*>(d_q.get());
    p.q_positions = d_q_positions.get();
    p.k_cache = reinterpret_cast<const __nv_bfloat16*>(d_k.get());
    p.v_cache = reinterpret_cast<const __nv_bfloat16*>(d_v.get());
    p.indptr = d_indptr.get();
    p.indices = d_indices.get();
    p.kv_positions = d_positions.get();
    p.inv_freq = d_inv_freq.get();
    p.workspace = ws.get();
    p.batch = batch;
    p.num_heads = c.num_heads;
    p.num_kv_heads = c.num_kv_heads;
    p.head_dim = c.head_dim;
    p.num_splits = splits;
    p.scale = scale;
    p.use_tensor_cores = tensor_cores;
    ASSERT_EQ(DecodeAttention(p, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> out_bits = d_out.Download();
    const int64_t per_request = c.num_heads * c.head_dim;
    for (int64_t b = 0; b < batch; ++b) {
      gpu_test::Bf16Error e;
      e.Add(out_bits.data(), ref.data(), b * per_request, (b + 1) * per_request);
      ASSERT_EQ(e.first_nan, -1) << "unwritten or NaN output at " << e.first_nan;
      if (c.lengths[b] == 0) {
        EXPECT_EQ(e.max_err, 0.0) << "empty list must give zeros, request " << b;
        continue;
      }
      EXPECT_LE(e.relative_l2(), 5e-3) << "request " << b << " len " << c.lengths[b];
      EXPECT_LE(e.max_err, 2e-2 * e.max_ref) << "request " << b;
      worst[tensor_cores] = std::max(worst[tensor_cores], e.relative_l2());
    }
  }
  // Printed for the record (the error budget is spent mostly by the bf16 output and P).
  std::printf("worst relative L2 error: CUDA cores %.3e, tensor cores %.3e\n", worst[0],
              worst[1]);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, DecodeAttentionGpuTest,
    ::testing::Values(
        DecodeCase{{2688}, 32, 8, 128, false},                   // sparse decode, Llama-3-8B
        DecodeCase{{0, 1, 37, 2689, 513}, 32, 8, 128, false},    // batch with an empty list
        DecodeCase{{70001}, 32, 8, 128, true},                   // dense, positions up to ~1M
        DecodeCase{{200003, 3}, 32, 8, 128, true},               // long pipeline + a tiny list
        DecodeCase{{1000, 3001}, 32, 4, 128, false},             // g = 8
        DecodeCase{{999, 5}, 8, 8, 128, true},                   // g = 1
        DecodeCase{{777, 2050}, 12, 6, 64, false},               // g = 2, d = 64
        DecodeCase{{4099}, 12, 3, 64, true},                     // g = 4, odd kv heads
        DecodeCase{{33, 1234}, 16, 2, 64, false}));              // g = 8, d = 64

TEST(DecodeAttentionGpuTest, RejectsUnsupportedShapes) {
  DecodeAttentionParams p;
  p.batch = 1;
  p.num_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim = 96;
  EXPECT_EQ(DecodeAttention(p, nullptr), cudaErrorInvalidValue);
  p.head_dim = 128;
  p.num_kv_heads = 2;  // group 16
  EXPECT_EQ(DecodeAttention(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tokenselect::kernels::cuda
