// y = x W^T (+ b) through OpenBLAS. W keeps the Hugging Face nn.Linear layout [out, in], which
// is exactly the transposed operand sgemm wants, so no weight is ever repacked by us.
// m == 1 (decode) goes to sgemv: it streams W once at memory bandwidth, where sgemm of one row
// would pack it first. The bias, when present, is written into y first and the product added
// with beta = 1 (one pass over y, and the same sum as torch's addmm).
#include <cblas.h>

#include <climits>
#include <cstdint>
#include <cstring>

#include "common/logging.h"
#include "kernels/ops.h"

namespace tokenselect::kernels::cpu {

void Linear(float* y, const float* x, const float* w, const float* bias, int64_t m, int64_t k,
            int64_t n) {
  TS_CHECK(m >= 0 && k >= 0 && n >= 0 && m <= INT_MAX && k <= INT_MAX && n <= INT_MAX,
           "Linear: sizes m={} k={} n={} out of range for 32-bit BLAS", m, k, n);
  if (m == 0 || n == 0) return;
  float beta = 0.0f;
  if (bias != nullptr) {
    for (int64_t r = 0; r < m; ++r) {
      std::memcpy(y + r * n, bias, sizeof(float) * static_cast<size_t>(n));
    }
    beta = 1.0f;
  } else if (k == 0) {
    std::memset(y, 0, sizeof(float) * static_cast<size_t>(m * n));
  }
  if (k == 0) return;
  const int mi = static_cast<int>(m), ki = static_cast<int>(k), ni = static_cast<int>(n);
  if (m == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, ni, ki, 1.0f, w, ki, x, 1, beta, y, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mi, ni, ki, 1.0f, x, ki, w, ki, beta, y,
                ni);
  }
}

}  // namespace tokenselect::kernels::cpu
