// The CUDA forward pass's ops at Llama-3-8B shapes. First cuBLASLt Linear (kernels/cuda/gemm.h)
// throughput, against two measured ceilings: a bf16 GEMM at 8192^3 (TFLOP/s, compute-bound) and a
// device-to-device copy (GB/s, read + write; decode GEMMs with m = 1 are weight-streaming and
// memory-bound). Correctness is checked in tests/gpu/gemm_test.cc; here only timings. Random (not
// zero) inputs; weights rotate over enough copies (>= 256 MiB) that L2 (50 MiB on H100) never holds
// them. Then token choice (kernels/cuda/sampling.h) at vocab 128256: greedy argmax and top_k/top_p
// sampling, one block per row, at batch 1 and 64, against the time to read the logits once.
// Times: median of 20 CUDA-event timed launches after 3 warm-ups.
//
//   bench_model_cuda [--quick]      (--quick: fewer shapes)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "bench/cuda_bench_util.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/sampling.h"

namespace tokenselect::kernels::cuda {
namespace {

using bench::DeviceBuffer;

std::unique_ptr<DeviceBuffer<uint16_t>> RandomBf16(size_t n, uint64_t seed) {
  std::vector<uint16_t> host(n);
  uint64_t s = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (uint16_t& b : host) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    const float v = static_cast<float>(static_cast<int32_t>(s >> 40) - (1 << 23)) / (1 << 23);
    b = gpu_test::FloatToBf16Bits(v);
  }
  return std::make_unique<DeviceBuffer<uint16_t>>(host);
}

// Median of 20 timed launch(i) after 3 warm-ups, each waited for (default stream).
float MedianMs(const std::function<void(int)>& launch) {
  return static_cast<float>(bench::MedianMs(nullptr, launch, {20, 3, /*sync_each=*/true}));
}

struct Shape {
  const char* name;
  int64_t m, k, n;
};

void BenchSampling(double copy_gbs) {
  const int64_t vocab = 128256;
  std::printf("\n%-22s %6s %9s %9s %6s\n", "token choice", "rows", "ms", "GB/s", "%copy");
  for (int64_t rows : {1, 64}) {
    std::vector<float> logits(static_cast<size_t>(rows * vocab));
    uint64_t s = 12345;
    for (float& x : logits) {
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      x = static_cast<float>(static_cast<int32_t>(s >> 40) - (1 << 23)) / (1 << 21);
    }
    DeviceBuffer<float> d_logits(logits);
    DeviceBuffer<float> temperature(std::vector<float>(static_cast<size_t>(rows), 0.8f));
    DeviceBuffer<int32_t> top_k(std::vector<int32_t>(static_cast<size_t>(rows), 50));
    DeviceBuffer<float> top_p(std::vector<float>(static_cast<size_t>(rows), 0.9f));
    DeviceBuffer<double> uniforms(std::vector<double>(static_cast<size_t>(rows), 0.37));
    DeviceBuffer<int32_t> out(static_cast<size_t>(rows));
    const double bytes = 4.0 * rows * vocab;
    const float greedy_ms = MedianMs(
        [&](int) { TS_CUDA_CHECK(Argmax(out.get(), d_logits.get(), rows, vocab, nullptr)); });
    for (int variant = 0; variant < 3; ++variant) {
      SampleParams p;
      p.out = out.get();
      p.logits = d_logits.get();
      p.temperature = temperature.get();
      p.top_k = variant == 1 ? top_k.get() : nullptr;
      p.top_p = variant == 2 ? top_p.get() : nullptr;
      p.uniforms = uniforms.get();
      p.rows = rows;
      p.vocab = vocab;
      const float ms =
          variant == 0 ? greedy_ms : MedianMs([&](int) { TS_CUDA_CHECK(Sample(p, nullptr)); });
      const char* name = variant == 0   ? "argmax"
                         : variant == 1 ? "sample T=0.8 top_k=50"
                                        : "sample T=0.8 top_p=0.9";
      std::printf("%-22s %6lld %9.4f %9.0f %5.1f%%\n", name, static_cast<long long>(rows), ms,
                  bytes / (ms * 1e-3) / 1e9, 100.0 * bytes / (ms * 1e-3) / 1e9 / copy_gbs);
    }
  }
}

int Run(bool quick) {
  std::unique_ptr<GemmRunner> runner;
  TS_CUDA_CHECK(GemmRunner::Create(&runner));
  cudaDeviceProp prop;
  TS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);

  // Copy ceiling: 1 GiB device to device, bytes read + written.
  const size_t copy_bytes = size_t{1} << 30;
  const double copy_ms = bench::CopyMs(nullptr, copy_bytes, {20, 3, /*sync_each=*/true});
  const double copy_gbs = bench::CopyGBs(copy_bytes, copy_ms);
  std::printf("copy ceiling: %.3f ms for 1 GiB -> %.0f GB/s (read + write)\n", copy_ms, copy_gbs);

  // GEMM ceiling: 8192^3, bf16 in, fp32 accumulate, bf16 out.
  double ceiling_tflops = 0.0;
  {
    const int64_t s = 8192;
    auto a = RandomBf16(s * s, 1), b = RandomBf16(s * s, 2);
    DeviceBuffer<uint16_t> c(s * s);
    LinearParams p;
    p.y = c.get();
    p.x = reinterpret_cast<const __nv_bfloat16*>(a->get());
    p.w = reinterpret_cast<const __nv_bfloat16*>(b->get());
    p.m = p.k = p.n = s;
    const float ms = MedianMs([&](int) { TS_CUDA_CHECK(runner->Linear(p, nullptr)); });
    ceiling_tflops = 2.0 * s * s * s / (ms * 1e-3) / 1e12;
    std::printf("GEMM ceiling: 8192^3 bf16 %.3f ms -> %.0f TFLOP/s\n\n", ms, ceiling_tflops);
  }

  // Llama-3-8B linear layers (q|k|v and gate|up fused as one GEMM each) and the lm_head.
  const std::vector<Shape> layers = {{"qkv", 0, 4096, 6144},
                                     {"o_proj", 0, 4096, 4096},
                                     {"gate_up", 0, 4096, 28672},
                                     {"down", 0, 14336, 4096},
                                     {"lm_head", 0, 4096, 128256}};
  const std::vector<int64_t> ms_list =
      quick ? std::vector<int64_t>{1, 512} : std::vector<int64_t>{1, 16, 128, 512, 4096};
  std::printf("%-8s %6s %6s %7s %9s %9s %6s %9s %6s\n", "layer", "m", "k", "n", "ms", "TFLOP/s",
              "%ceil", "W GB/s", "%copy");
  for (const Shape& base : layers) {
    const size_t w_elems = static_cast<size_t>(base.k * base.n);
    const size_t copies =
        std::min<size_t>(8, std::max<size_t>(1, (size_t{256} << 20) / (2 * w_elems) + 1));
    std::vector<std::unique_ptr<DeviceBuffer<uint16_t>>> weights;
    for (size_t i = 0; i < copies; ++i) weights.push_back(RandomBf16(w_elems, 10 + i));
    for (int64_t m : ms_list) {
      auto x = RandomBf16(static_cast<size_t>(m * base.k), 3);
      DeviceBuffer<uint16_t> y(static_cast<size_t>(m * base.n));
      LinearParams p;
      p.y = y.get();
      p.x = reinterpret_cast<const __nv_bfloat16*>(x->get());
      p.m = m;
      p.k = base.k;
      p.n = base.n;
      const float ms = MedianMs([&](int i) {
        p.w = reinterpret_cast<const __nv_bfloat16*>(weights[i % copies]->get());
        TS_CUDA_CHECK(runner->Linear(p, nullptr));
      });
      const double tflops = 2.0 * m * base.k * base.n / (ms * 1e-3) / 1e12;
      const double bytes = 2.0 * (w_elems + m * base.k + m * base.n);
      const double gbs = bytes / (ms * 1e-3) / 1e9;
      std::printf("%-8s %6lld %6lld %7lld %9.4f %9.1f %5.1f%% %9.0f %5.1f%%\n", base.name,
                  static_cast<long long>(m), static_cast<long long>(base.k),
                  static_cast<long long>(base.n), ms, tflops, 100.0 * tflops / ceiling_tflops, gbs,
                  100.0 * gbs / copy_gbs);
    }
  }
  BenchSampling(copy_gbs);
  return 0;
}

}  // namespace
}  // namespace tokenselect::kernels::cuda

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  return tokenselect::kernels::cuda::Run(quick);
}
