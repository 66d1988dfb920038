// ApplyRope: rotates q or k in place with the HF "rotate_half" convention. Each token's cos/sin
// row (angle = float(position) * inv_freq[i] in fp32, see vec_math.h) is computed once and used
// for all of its heads. OpenMP over tokens.
#include <cstdint>
#include <vector>

#include "common/logging.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/ops.h"

namespace tokenselect::kernels::cpu {

void ApplyRope(float* x, const int32_t* positions, int64_t num_tokens, int64_t num_heads,
               int64_t head_dim, const float* inv_freq) {
  TS_CHECK(head_dim > 0 && head_dim % 2 == 0, "ApplyRope: head_dim must be even, got {}", head_dim);
  const int64_t half = head_dim / 2;
  const int64_t row = num_heads * head_dim;
#pragma omp parallel if (num_tokens * row >= (int64_t{1} << 14))
  {
    std::vector<float> cos(static_cast<size_t>(half)), sin(static_cast<size_t>(half));
#pragma omp for
    for (int64_t t = 0; t < num_tokens; ++t) {
      RopeCosSin(positions[t], inv_freq, half, cos.data(), sin.data());
      float* xt = x + t * row;
      for (int64_t h = 0; h < num_heads; ++h) {
        RotateHalf(xt + h * head_dim, xt + h * head_dim, cos.data(), sin.data(), half);
      }
    }
  }
}

}  // namespace tokenselect::kernels::cpu
