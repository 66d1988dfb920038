// Needs a GPU (label gpu): the forward pass's row-wise ops (kernels/cuda/model_ops.h) against the
// CPU ops of kernels/ops.h on the same bf16-rounded inputs; fresh random inputs every run, odd
// sizes, outputs NaN-poisoned before each launch.
// Tolerances: Embedding, AddInPlace and KvAppend exact; RmsNorm and SwiGlu write bf16, so each
// element may differ from the fp32 reference by at most one bf16 ulp (2^-7 relative: the bf16
// rounding of an fp32 value that is itself within a few fp32 ulps of the reference).
#include "kernels/cuda/model_ops.h"

#include <algorithm>
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

using gpu_test::Bf16BitsToFloat;
using gpu_test::DeviceBuffer;

const __nv_bfloat16* Bf16(const DeviceBuffer<uint16_t>& b) {
  return reinterpret_cast<const __nv_bfloat16*>(b.get());
}
__nv_bfloat16* Bf16Out(DeviceBuffer<uint16_t>& b) {
  return reinterpret_cast<__nv_bfloat16*>(b.get());
}

std::vector<float> RandomVector(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Every bf16 output within one bf16 ulp of the fp32 reference.
void ExpectWithinBf16Ulp(const std::vector<uint16_t>& got, const std::vector<float>& ref) {
  ASSERT_EQ(got.size(), ref.size());
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const float g = Bf16BitsToFloat(got[i]);
    ASSERT_FALSE(std::isnan(g)) << "unwritten output at " << i;
    if (std::fabs(g - ref[i]) > std::ldexp(std::fabs(ref[i]), -7) + 1e-30f && ++bad <= 5) {
      ADD_FAILURE() << "at " << i << ": got " << g << " want " << ref[i];
    }
  }
}

class ModelOpsGpuTest : public ::testing::TestWithParam<int64_t> {
 protected:
  gpu_test::FreshSeed seed_;
  std::mt19937 rng_{seed_.value()};
};

TEST_P(ModelOpsGpuTest, Embedding) {
  const int64_t dim = GetParam(), vocab = 1003, n = 37;
  std::vector<float> table = RandomVector(rng_, static_cast<size_t>(vocab * dim));
  const auto table_bits = gpu_test::RoundToBf16(&table);
  std::uniform_int_distribution<int32_t> any_id(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = any_id(rng_);
  ids[3] = ids[5];  // a repeated token
  std::vector<float> ref(static_cast<size_t>(n * dim));
  cpu::Embedding(ref.data(), table.data(), ids.data(), n, dim);
  DeviceBuffer<uint16_t> d_table(table_bits);
  DeviceBuffer<int32_t> d_ids(ids);
  DeviceBuffer<float> d_out(ref.size());
  d_out.Poison();
  EmbeddingParams p{d_out.get(), Bf16(d_table), d_ids.get(), n, dim, vocab};
  ASSERT_EQ(Embedding(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d_out.Download(), ref);
}

TEST_P(ModelOpsGpuTest, RmsNormWithAndWithoutResidual) {
  const int64_t dim = GetParam(), rows = 13;
  const float eps = 1e-5f;
  std::vector<float> x = RandomVector(rng_, static_cast<size_t>(rows * dim), 3.0f);
  std::vector<float> add = RandomVector(rng_, x.size());
  std::vector<float> weight = RandomVector(rng_, static_cast<size_t>(dim));
  const auto weight_bits = gpu_test::RoundToBf16(&weight);
  DeviceBuffer<uint16_t> d_weight(weight_bits), d_out(x.size());
  DeviceBuffer<float> d_x(x), d_add(add);
  for (bool with_add : {false, true}) {
    SCOPED_TRACE(with_add ? "with add" : "plain");
    std::vector<float> x_ref = x;
    if (with_add) cpu::AddInPlace(x_ref.data(), add.data(), static_cast<int64_t>(x.size()));
    std::vector<float> ref(x.size());
    cpu::RmsNorm(ref.data(), x_ref.data(), weight.data(), rows, dim, eps);
    d_x.Upload(x);
    d_out.Poison();
    RmsNormParams p;
    p.out = Bf16Out(d_out);
    p.x = d_x.get();
    p.add = with_add ? d_add.get() : nullptr;
    p.weight = Bf16(d_weight);
    p.rows = rows;
    p.dim = dim;
    p.eps = eps;
    ASSERT_EQ(RmsNorm(p, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ExpectWithinBf16Ulp(d_out.Download(), ref);
    EXPECT_EQ(d_x.Download(), x_ref);  // the residual sum is written back (or x untouched)
  }
}

TEST_P(ModelOpsGpuTest, AddInPlace) {
  const int64_t n = GetParam() * 7 + 1;
  std::vector<float> x = RandomVector(rng_, static_cast<size_t>(n));
  const std::vector<float> y = RandomVector(rng_, x.size());
  DeviceBuffer<float> d_x(x), d_y(y);
  cpu::AddInPlace(x.data(), y.data(), n);
  ASSERT_EQ(AddInPlace(d_x.get(), d_y.get(), n, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d_x.Download(), x);
}

TEST_P(ModelOpsGpuTest, SwiGluReadsAFusedGateUpBuffer) {
  const int64_t cols = GetParam(), rows = 5;
  std::vector<float> fused = RandomVector(rng_, static_cast<size_t>(rows * 2 * cols), 2.0f);
  const auto fused_bits = gpu_test::RoundToBf16(&fused);
  std::vector<float> gate(static_cast<size_t>(rows * cols)), up(gate.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      gate[r * cols + j] = fused[r * 2 * cols + j];
      up[r * cols + j] = fused[r * 2 * cols + cols + j];
    }
  }
  std::vector<float> ref(gate.size());
  cpu::SwiGlu(ref.data(), gate.data(), up.data(), static_cast<int64_t>(ref.size()));
  DeviceBuffer<uint16_t> d_in(fused_bits), d_out(ref.size());
  d_out.Poison();
  SwiGluParams p;
  p.out = Bf16Out(d_out);
  p.gate = Bf16(d_in);
  p.up = Bf16(d_in) + cols;
  p.rows = rows;
  p.cols = cols;
  p.in_stride = 2 * cols;
  ASSERT_EQ(SwiGlu(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpectWithinBf16Ulp(d_out.Download(), ref);
}

// row = GetParam(): multiples of 8 take the 16-byte path, others the 2-byte one.
TEST_P(ModelOpsGpuTest, KvAppendWritesOnlyTheNewSlots) {
  const int64_t row = GetParam(), n = 11, num_slots = 97;
  for (int64_t src_stride : {row, 3 * row}) {  // plain k/v buffers, or slices of a fused qkv
    SCOPED_TRACE(testing::Message() << "src_stride " << src_stride);
    std::vector<uint16_t> k(static_cast<size_t>(n * src_stride)), v(k.size());
    std::uniform_int_distribution<int> bits(0, 0x7f7f);
    for (uint16_t& b : k) b = static_cast<uint16_t>(bits(rng_));
    for (uint16_t& b : v) b = static_cast<uint16_t>(bits(rng_));
    std::vector<int32_t> slots(static_cast<size_t>(n));
    std::vector<int32_t> all(static_cast<size_t>(num_slots));
    for (int32_t i = 0; i < num_slots; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng_);
    for (int64_t i = 0; i < n; ++i) slots[i] = all[i];
    slots[n - 1] = static_cast<int32_t>(num_slots + 5);  // outside the cache: skipped
    DeviceBuffer<uint16_t> d_k(k), d_v(v);
    DeviceBuffer<uint16_t> d_kc(static_cast<size_t>(num_slots * row)), d_vc(d_kc.size());
    DeviceBuffer<int32_t> d_slots(slots);
    d_kc.Poison();
    d_vc.Poison();
    KvAppendParams p;
    p.k_cache = Bf16Out(d_kc);
    p.v_cache = Bf16Out(d_vc);
    p.k = Bf16(d_k);
    p.v = Bf16(d_v);
    p.slots = d_slots.get();
    p.num_tokens = n;
    p.row = row;
    p.src_stride = src_stride;
    p.num_slots = num_slots;
    ASSERT_EQ(KvAppend(p, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint16_t> k_ref(d_kc.size(), 0xffff), v_ref(d_vc.size(), 0xffff);
    for (int64_t i = 0; i + 1 < n; ++i) {
      for (int64_t j = 0; j < row; ++j) {
        k_ref[slots[i] * row + j] = k[i * src_stride + j];
        v_ref[slots[i] * row + j] = v[i * src_stride + j];
      }
    }
    EXPECT_EQ(d_kc.Download(), k_ref);
    EXPECT_EQ(d_vc.Download(), v_ref);
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, ModelOpsGpuTest,
                         ::testing::Values(1, 7, 128, 896, 1027, 4096, 8192, 14336));

}  // namespace
}  // namespace tokenselect::kernels::cuda
