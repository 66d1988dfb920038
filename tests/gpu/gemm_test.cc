// Needs a GPU (label gpu): cuBLASLt Linear (kernels/cuda/gemm.h) against cpu::Linear
// (kernels/ops.h) on the same bf16-rounded inputs, fresh random data every run. Shapes: decode
// (m = 1), odd sizes (k, n not multiples of 8: 2-byte aligned rows), prefill chunks, a Qwen2-0.5B
// vocab-sized lm_head; bf16 and fp32 outputs, with and without bias, and the accumulate (residual)
// mode. Outputs are NaN-poisoned before each launch (accumulate starts from known values).
// Tolerances (relative L2 over the whole output): bf16 output <= 5e-3 (the output rounding alone
// is ~2e-3); fp32 output <= 1e-4 (fp32 accumulation in another order; measured ~1e-6).
#include "kernels/cuda/gemm.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "tests/gpu/gpu_test_util.h"

namespace tokenselect::kernels::cuda {
namespace {

using gpu_test::DeviceBuffer;

struct GemmCase {
  int64_t m, k, n;
};

class GemmGpuTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmGpuTest, MatchesCpuLinear) {
  const GemmCase c = GetParam();
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(c.m * c.k)), w(static_cast<size_t>(c.n * c.k));
  std::vector<float> bias(static_cast<size_t>(c.n)), init(static_cast<size_t>(c.m * c.n));
  for (float& v : x) v = normal(rng);
  for (float& v : w) v = normal(rng) / std::sqrt(static_cast<float>(c.k));
  for (float& v : bias) v = normal(rng);
  for (float& v : init) v = normal(rng);
  const auto x_bits = gpu_test::RoundToBf16(&x);
  const auto w_bits = gpu_test::RoundToBf16(&w);
  std::vector<float> bias_bf16 = bias;
  const auto bias_bits = gpu_test::RoundToBf16(&bias_bf16);

  std::unique_ptr<GemmRunner> runner;
  ASSERT_EQ(GemmRunner::Create(&runner), cudaSuccess);
  DeviceBuffer<uint16_t> d_x(x_bits), d_w(w_bits), d_bias_bf16(bias_bits);
  DeviceBuffer<float> d_bias_f32(bias), d_y32(init.size());
  DeviceBuffer<uint16_t> d_y16(init.size());

  for (int variant = 0; variant < 5; ++variant) {
    // 0: bf16 out; 1: bf16 out + bias; 2: fp32 out; 3: fp32 out + bias; 4: fp32 += (+ bias).
    const bool fp32_out = variant >= 2;
    const bool with_bias = variant == 1 || variant == 3 || variant == 4;
    const bool accumulate = variant == 4;
    SCOPED_TRACE(testing::Message() << "variant " << variant);
    std::vector<float> ref(init.size());
    const float* ref_bias = with_bias ? (fp32_out ? bias.data() : bias_bf16.data()) : nullptr;
    cpu::Linear(ref.data(), x.data(), w.data(), ref_bias, c.m, c.k, c.n);
    if (accumulate) {
      for (size_t i = 0; i < ref.size(); ++i) ref[i] += init[i];
      d_y32.Upload(init);
    } else {
      d_y32.Poison();
      d_y16.Poison();
    }
    LinearParams p;
    p.y = fp32_out ? static_cast<void*>(d_y32.get()) : static_cast<void*>(d_y16.get());
    p.x = reinterpret_cast<const __nv_bfloat16*>(d_x.get());
    p.w = reinterpret_cast<const __nv_bfloat16*>(d_w.get());
    p.bias = with_bias ? (fp32_out ? static_cast<const void*>(d_bias_f32.get())
                                   : static_cast<const void*>(d_bias_bf16.get()))
                       : nullptr;
    p.m = c.m;
    p.k = c.k;
    p.n = c.n;
    p.out = fp32_out ? GemmOutput::kFp32 : GemmOutput::kBf16;
    p.accumulate = accumulate;
    ASSERT_EQ(runner->Linear(p, nullptr), cudaSuccess)
        << "cublas status " << runner->last_cublas_status();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> got(init.size());
    if (fp32_out) {
      got = d_y32.Download();
    } else {
      const std::vector<uint16_t> bits = d_y16.Download();
      for (size_t i = 0; i < bits.size(); ++i) got[i] = gpu_test::Bf16BitsToFloat(bits[i]);
    }
    const double rel = gpu_test::RelativeL2(got.data(), ref.data(), ref.size());
    EXPECT_LE(rel, fp32_out ? 1e-4 : 5e-3);
    std::printf("m=%lld k=%lld n=%lld variant=%d rel_l2=%.3g\n", static_cast<long long>(c.m),
                static_cast<long long>(c.k), static_cast<long long>(c.n), variant, rel);
  }
  // Same shapes again hit the plan cache: 5 plans, no more.
  EXPECT_EQ(runner->num_plans(), 5u);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmGpuTest,
                         ::testing::Values(GemmCase{1, 4096, 4096},  // decode, Llama-3-8B q/o
                                           GemmCase{1, 333, 37},     // odd: 2-byte aligned rows
                                           GemmCase{7, 1000, 129},   // odd n
                                           GemmCase{130, 896,
                                                    4864},  // prefill rows, Qwen2-0.5B MLP
                                           GemmCase{512, 4096, 1024},   // chunk, Llama-3-8B k/v
                                           GemmCase{3, 896, 151936}));  // Qwen2 lm_head

TEST(GemmGpuTest, RejectsBadArguments) {
  std::unique_ptr<GemmRunner> runner;
  ASSERT_EQ(GemmRunner::Create(&runner), cudaSuccess);
  LinearParams p;
  p.m = -1;
  EXPECT_EQ(runner->Linear(p, nullptr), cudaErrorInvalidValue);
  p.m = 0;
  p.n = 5;
  p.k = 5;
  EXPECT_EQ(runner->Linear(p, nullptr), cudaSuccess);  // nothing to do
  p.m = 2;
  EXPECT_EQ(runner->Linear(p, nullptr), cudaErrorInvalidValue);  // null pointers
}

}  // namespace
}  // namespace tokenselect::kernels::cuda
