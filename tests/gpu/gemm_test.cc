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
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "tests/gpu/fresh_seed.h"
#include "tests/gpu/gpu_test_util.h"

namespace tokenselect::kernels::cuda {
namespace {

using gpu_test::DeviceBuffer;

struct GemmCase {
  int64_t m, k, n;
};

class GemmGpuTest : public ::testing::TestWithParam<GemmCase> {};

// Fresh random x [m, k], W [n, k] (scaled by 1 / sqrt(k)), bias [n] and a starting y [m, n]:
// x and W rounded to bf16 (their bits kept for upload), the bias kept in fp32 and in bf16.
struct RandomGemmInputs {
  RandomGemmInputs(int64_t m, int64_t k, int64_t n)
      : x(static_cast<size_t>(m * k)),
        w(static_cast<size_t>(n * k)),
        bias(static_cast<size_t>(n)),
        init(static_cast<size_t>(m * n)) {
    std::mt19937 rng(seed.value());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : x) v = normal(rng);
    for (float& v : w) v = normal(rng) / std::sqrt(static_cast<float>(k));
    for (float& v : bias) v = normal(rng);
    for (float& v : init) v = normal(rng);
    x_bits = gpu_test::RoundToBf16(&x);
    w_bits = gpu_test::RoundToBf16(&w);
    bias_bf16 = bias;
    bias_bits = gpu_test::RoundToBf16(&bias_bf16);
  }
  std::vector<float> x, w, bias, init, bias_bf16;
  std::vector<uint16_t> x_bits, w_bits, bias_bits;
  gpu_test::FreshSeed seed;  // named in failures while the inputs live
};

TEST_P(GemmGpuTest, MatchesCpuLinear) {
  const GemmCase c = GetParam();
  RandomGemmInputs in(c.m, c.k, c.n);
  const std::vector<float>& x = in.x;
  const std::vector<float>& w = in.w;
  const std::vector<float>& bias = in.bias;
  const std::vector<float>& init = in.init;
  const std::vector<float>& bias_bf16 = in.bias_bf16;
  DeviceBuffer<uint16_t> d_x(in.x_bits), d_w(in.w_bits), d_bias_bf16(in.bias_bits);

  std::unique_ptr<GemmRunner> runner;
  ASSERT_EQ(GemmRunner::Create(&runner), cudaSuccess);
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

// TP-invariant plans (LinearParams::plan_n): a column shard's GEMM (n / T columns of W, the
// algorithm chosen for the whole n) gives exactly the bits of the whole GEMM's columns, and a
// k-slice read in place (x and W strided) exactly those of the slice copied out; with bias, both
// output types and the accumulate mode. Shapes: Llama-3-8B's qkv (n 6144) and o_proj at decode,
// batch and chunk rows, and a small preset's.
struct InvariantCase {
  int64_t m, k, n;
};

class GemmInvariantTest : public ::testing::TestWithParam<InvariantCase> {};

TEST_P(GemmInvariantTest, ShardsAndSlicesGetTheWholeGemmsBits) {
  const InvariantCase c = GetParam();
  RandomGemmInputs in(c.m, c.k, c.n);
  const std::vector<float>& init = in.init;
  const std::vector<uint16_t>& x_bits = in.x_bits;
  const std::vector<uint16_t>& w_bits = in.w_bits;
  std::unique_ptr<GemmRunner> runner;
  ASSERT_EQ(GemmRunner::Create(&runner), cudaSuccess);
  DeviceBuffer<uint16_t> d_x(x_bits), d_w(w_bits), d_bias16(in.bias_bits);
  DeviceBuffer<float> d_bias32(in.bias);
  auto as_bf16 = [](const DeviceBuffer<uint16_t>& b, int64_t offset) {
    return reinterpret_cast<const __nv_bfloat16*>(b.get()) + offset;
  };
  // Downloads `bytes` of y as 32-bit or 16-bit words widened to uint32 (bitwise compares).
  auto run = [&](LinearParams p, bool fp32, int64_t rows, int64_t cols, bool accumulate,
                 const std::vector<float>& start) -> std::vector<uint32_t> {
    std::vector<uint32_t> out(static_cast<size_t>(rows * cols));
    p.m = rows;
    p.n = cols;
    p.out = fp32 ? GemmOutput::kFp32 : GemmOutput::kBf16;
    p.accumulate = accumulate;
    if (fp32) {
      DeviceBuffer<float> y(out.size());
      if (accumulate) {
        y.Upload(start);
      } else {
        y.Poison();
      }
      p.y = y.get();
      EXPECT_EQ(runner->Linear(p, nullptr), cudaSuccess)
          << "cublas status " << runner->last_cublas_status();
      const std::vector<float> got = y.Download();
      for (size_t i = 0; i < got.size(); ++i) std::memcpy(&out[i], &got[i], 4);
    } else {
      DeviceBuffer<uint16_t> y(out.size());
      y.Poison();
      p.y = y.get();
      EXPECT_EQ(runner->Linear(p, nullptr), cudaSuccess)
          << "cublas status " << runner->last_cublas_status();
      const std::vector<uint16_t> got = y.Download();
      for (size_t i = 0; i < got.size(); ++i) out[i] = got[i];
    }
    return out;
  };
  for (int variant = 0; variant < 4; ++variant) {
    // 0: bf16 out + bias (qkv); 1: bf16 out; 2: fp32 out; 3: fp32 += + bias (a residual).
    const bool fp32 = variant >= 2, with_bias = variant == 0 || variant == 3;
    const bool accumulate = variant == 3;
    for (int64_t t : {2, 4}) {
      SCOPED_TRACE(testing::Message() << "variant " << variant << ", T " << t);
      // Column shards: rank r's rows of W (and of the bias).
      LinearParams whole;
      whole.x = as_bf16(d_x, 0);
      whole.w = as_bf16(d_w, 0);
      whole.k = c.k;
      whole.plan_n = c.n;
      const void* bias_ptr = fp32 ? static_cast<const void*>(d_bias32.get())
                                  : static_cast<const void*>(d_bias16.get());
      whole.bias = with_bias ? bias_ptr : nullptr;
      const std::vector<uint32_t> want = run(whole, fp32, c.m, c.n, accumulate, init);
      const int64_t cols = c.n / t;
      int64_t differing = 0;
      for (int64_t r = 0; r < t; ++r) {
        LinearParams shard = whole;
        shard.w = as_bf16(d_w, r * cols * c.k);
        if (with_bias) {
          shard.bias = fp32 ? static_cast<const void*>(d_bias32.get() + r * cols)
                            : static_cast<const void*>(d_bias16.get() + r * cols);
        }
        std::vector<float> start(static_cast<size_t>(c.m * cols));
        for (int64_t i = 0; i < c.m; ++i) {
          for (int64_t j = 0; j < cols; ++j) start[i * cols + j] = init[i * c.n + r * cols + j];
        }
        const std::vector<uint32_t> got = run(shard, fp32, c.m, cols, accumulate, start);
        for (int64_t i = 0; i < c.m; ++i) {
          for (int64_t j = 0; j < cols; ++j) {
            differing += got[i * cols + j] != want[i * c.n + r * cols + j] ? 1 : 0;
          }
        }
      }
      EXPECT_EQ(differing, 0) << "column shards differ from the whole GEMM";
      // K-slices: slice s of x and W read in place (strided) against the slice copied out.
      const int64_t ks = c.k / t;
      for (int64_t s = 0; s < t; s += t - 1) {
        std::vector<uint16_t> xs(static_cast<size_t>(c.m * ks)), ws(static_cast<size_t>(c.n * ks));
        for (int64_t i = 0; i < c.m; ++i) {
          for (int64_t j = 0; j < ks; ++j) xs[i * ks + j] = x_bits[i * c.k + s * ks + j];
        }
        for (int64_t i = 0; i < c.n; ++i) {
          for (int64_t j = 0; j < ks; ++j) ws[i * ks + j] = w_bits[i * c.k + s * ks + j];
        }
        DeviceBuffer<uint16_t> d_xs(xs), d_ws(ws);
        LinearParams alone;
        alone.x = as_bf16(d_xs, 0);
        alone.w = as_bf16(d_ws, 0);
        alone.k = ks;
        alone.plan_n = c.n;
        alone.bias = whole.bias;
        LinearParams in_place = alone;
        in_place.x = as_bf16(d_x, s * ks);
        in_place.w = as_bf16(d_w, s * ks);
        in_place.x_stride = c.k;
        in_place.w_stride = c.k;
        EXPECT_EQ(run(in_place, fp32, c.m, c.n, accumulate, init),
                  run(alone, fp32, c.m, c.n, accumulate, init))
            << "k-slice " << s << " read in place differs from the slice alone";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmInvariantTest,
                         ::testing::Values(InvariantCase{1, 4096, 6144},     // decode qkv
                                           InvariantCase{3, 4096, 4096},     // a batch, o_proj
                                           InvariantCase{64, 4096, 6144},    // a test chunk
                                           InvariantCase{512, 4096, 6144},   // a chunk's qkv
                                           InvariantCase{512, 14336, 4096},  // down_proj
                                           InvariantCase{5, 256, 768}));     // a small preset

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
