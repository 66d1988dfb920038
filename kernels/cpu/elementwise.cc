// Row-wise and elementwise ops of the CPU backend (kernels/ops.h): embedding lookup, RMSNorm,
// SwiGLU, residual add, softmax. fp32 in and out, each row independent, OpenMP over rows (or
// over flat ranges) once the work is large enough to pay for a parallel region.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/ops.h"

namespace tokenselect::kernels::cpu {
namespace {

// Below this many values a parallel region costs more than it saves.
constexpr int64_t kParallelMinValues = int64_t{1} << 15;

}  // namespace

void Embedding(float* out, const float* table, const int32_t* ids, int64_t num_tokens,
               int64_t dim) {
#pragma omp parallel for if (num_tokens * dim >= kParallelMinValues)
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::memcpy(out + t * dim, table + static_cast<int64_t>(ids[t]) * dim,
                sizeof(float) * static_cast<size_t>(dim));
  }
}

// As LlamaRMSNorm in fp32: variance = mean(x^2), x * rsqrt(variance + eps), then weight * that.
// The sum of squares is accumulated in double (torch sums fp32 squares with a cascade; both give
// the fp32 variance to within an ulp); rsqrt is 1 / sqrt in fp32 as torch's CPU kernel does.
void RmsNorm(float* out, const float* x, const float* weight, int64_t rows, int64_t dim,
             float eps) {
#pragma omp parallel for if (rows * dim >= kParallelMinValues)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = out + r * dim;
    double sum_squares = 0.0;
    for (int64_t j = 0; j < dim; ++j) {
      const double v = static_cast<double>(xr[j]);
      sum_squares += v * v;
    }
    const float variance = static_cast<float>(sum_squares / static_cast<double>(dim));
    const float inv_rms = 1.0f / std::sqrt(variance + eps);
    for (int64_t j = 0; j < dim; ++j) yr[j] = weight[j] * (xr[j] * inv_rms);
  }
}

// silu(g) = g / (1 + exp(-g)), the formula of torch's CPU kernel.
void SwiGlu(float* out, const float* gate, const float* up, int64_t n) {
#pragma omp parallel for if (n >= kParallelMinValues)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = (g / (1.0f + std::exp(-g))) * up[i];
  }
}

void AddInPlace(float* x, const float* y, int64_t n) {
#pragma omp parallel for simd if (n >= kParallelMinValues)
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

// exp(x - max) / sum in fp32 (libm exp), the sum accumulated in double. As in torch, a row whose
// entries are all -inf becomes NaN.
void Softmax(float* x, int64_t rows, int64_t cols) {
  if (cols <= 0) return;
#pragma omp parallel for if (rows * cols >= kParallelMinValues)
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * cols;
    float max_value = xr[0];
    for (int64_t j = 1; j < cols; ++j) max_value = xr[j] > max_value ? xr[j] : max_value;
    double sum = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      xr[j] = std::exp(xr[j] - max_value);
      sum += static_cast<double>(xr[j]);
    }
    const float total = static_cast<float>(sum);
    for (int64_t j = 0; j < cols; ++j) xr[j] = xr[j] / total;
  }
}

}  // namespace tokenselect::kernels::cpu
