// Needs a GPU (label gpu): SimpleDecodeAttention (kernels/cuda/simple_attention.h) against
// cpu::GatherAttention on the same bf16-rounded inputs, fresh random data, head dims 32/64/96,
// groups 1..8, lists longer than one 256-entry tile, an empty list (zeros), NaN-poisoned output.
// Tolerance as for DecodeAttention: relative L2 per request <= 5e-3.
#include "kernels/cuda/simple_attention.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "tests/gpu/fresh_seed.h"
#include "tests/gpu/gpu_test_util.h"

namespace tokenselect::kernels::cuda {
namespace {

using gpu_test::DeviceBuffer;

struct SimpleCase {
  std::vector<int32_t> lengths;
  int64_t num_heads, num_kv_heads, head_dim;
};

class SimpleAttentionGpuTest : public ::testing::TestWithParam<SimpleCase> {};

TEST_P(SimpleAttentionGpuTest, MatchesCpuGatherAttention) {
  const SimpleCase c = GetParam();
  const gpu_test::FreshSeed seed;
  std::mt19937 rng(seed.value());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t batch = static_cast<int64_t>(c.lengths.size());
  std::vector<int32_t> indptr(1, 0);
  for (int32_t len : c.lengths) indptr.push_back(indptr.back() + len);
  const int64_t nnz = indptr.back(), num_slots = nnz + 77, row = c.num_kv_heads * c.head_dim;
  std::vector<float> k(static_cast<size_t>(num_slots * row)), v(k.size());
  std::vector<float> q(static_cast<size_t>(batch * c.num_heads * c.head_dim));
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  for (float& x : q) x = normal(rng);
  const auto k_bits = gpu_test::RoundToBf16(&k), v_bits = gpu_test::RoundToBf16(&v);
  const auto q_bits = gpu_test::RoundToBf16(&q);
  std::uniform_int_distribution<int32_t> any_slot(0, static_cast<int32_t>(num_slots - 1));
  std::vector<int32_t> slots(static_cast<size_t>(nnz)), positions(slots.size()), q_pos;
  for (int64_t b = 0; b < batch; ++b) {
    for (int32_t e = indptr[b]; e < indptr[b + 1]; ++e) {
      slots[e] = any_slot(rng);
      positions[e] = e - indptr[b];
    }
    q_pos.push_back(indptr[b + 1] - indptr[b]);
  }
  RopeParams rope;
  rope.head_dim = c.head_dim;
  rope.theta = 10000.0;
  const std::vector<float> inv_freq = RopeInverseFrequencies(rope);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  std::vector<float> ref(q.size(), 0.0f);
  const int64_t per = c.num_heads * c.head_dim;
  for (int64_t b = 0; b < batch; ++b) {
    GatherAttentionParams gp;
    gp.out = ref.data() + b * per;
    gp.q = q.data() + b * per;
    gp.q_positions = q_pos.data() + b;
    gp.k_cache = k.data();
    gp.v_cache = v.data();
    gp.kv_slots = slots.data() + indptr[b];
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
  DeviceBuffer<uint16_t> d_k(k_bits), d_v(v_bits), d_q(q_bits), d_out(q.size());
  DeviceBuffer<int32_t> d_indptr(indptr), d_slots(slots), d_positions(positions), d_qpos(q_pos);
  DeviceBuffer<float> d_inv_freq(inv_freq);
  d_out.Poison();
  DecodeAttentionParams p;
  p.out = reinterpret_cast<__nv_bfloat16*>(d_out.get());
  p.q = reinterpret_cast<const __nv_bfloat16*>(d_q.get());
  p.q_positions = d_qpos.get();
  p.k_cache = reinterpret_cast<const __nv_bfloat16*>(d_k.get());
  p.v_cache = reinterpret_cast<const __nv_bfloat16*>(d_v.get());
  p.indptr = d_indptr.get();
  p.indices = d_slots.get();
  p.kv_positions = d_positions.get();
  p.inv_freq = d_inv_freq.get();
  p.batch = batch;
  p.num_heads = c.num_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  p.scale = scale;
  ASSERT_EQ(SimpleDecodeAttention(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> out = d_out.Download();
  for (int64_t b = 0; b < batch; ++b) {
    double err2 = 0.0, ref2 = 0.0;
    for (int64_t i = b * per; i < (b + 1) * per; ++i) {
      const float got = gpu_test::Bf16BitsToFloat(out[i]);
      ASSERT_FALSE(std::isnan(got)) << "unwritten output at " << i;
      err2 += (got - ref[i]) * static_cast<double>(got - ref[i]);
      ref2 += ref[i] * static_cast<double>(ref[i]);
    }
    if (c.lengths[b] == 0) {
      EXPECT_EQ(err2, 0.0);
    } else {
      EXPECT_LE(std::sqrt(err2 / ref2), 5e-3) << "request " << b;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SimpleAttentionGpuTest,
                         ::testing::Values(SimpleCase{{1, 40, 600}, 8, 2, 32},
                                           SimpleCase{{0, 257}, 8, 4, 32},
                                           SimpleCase{{100, 513}, 8, 8, 64},
                                           SimpleCase{{300}, 16, 2, 96}));

}  // namespace
}  // namespace tokenselect::kernels::cuda
