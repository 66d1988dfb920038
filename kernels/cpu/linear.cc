// y = x W^T (+ b) through OpenBLAS. W keeps the Hugging Face nn.Linear layout [out, in], which
// is exactly the transposed operand sgemm wants, so no weight is ever repacked by us.
//
// One thread pool: the output features are cut into fixed-size column blocks that OpenMP threads
// take, each block one single-threaded BLAS call (OpenBLAS's own threads are switched off). Two
// pools of busy-waiting threads (OpenMP's and OpenBLAS's) on the same cores made decode 12x
// slower at 16 threads on a 16-core host. The block size depends only on the shape, never on the
// thread count, so results do not depend on OMP_NUM_THREADS.
// m == 1 (decode) goes to sgemv: it streams W once at memory bandwidth, where sgemm of one row
// would pack it first. The bias, when present, is written into y first and the product added
// with beta = 1 (one pass over y, and the same sum as torch's addmm).
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>

#include "common/logging.h"
#include "kernels/ops.h"

namespace tokenselect::kernels::cpu {
namespace {

// Output features per work item: small enough that a 768-wide projection still gives 12 items
// (every thread of a 16-core host some work), large enough that each BLAS call streams 64 rows
// of W (decode) or computes a 64-column panel (prefill).
constexpr int64_t kColumnsPerItem = 64;

// Below this much work (multiply-adds) one thread does it all.
constexpr int64_t kParallelWork = int64_t{1} << 18;

}  // namespace

void Linear(float* y, const float* x, const float* w, const float* bias, int64_t m, int64_t k,
            int64_t n) {
  TS_CHECK(m >= 0 && k >= 0 && n >= 0 && m <= INT_MAX && k <= INT_MAX && n <= INT_MAX,
           "Linear: sizes m={} k={} n={} out of range for 32-bit BLAS", m, k, n);
  static const bool kBlasSingleThreaded = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)kBlasSingleThreaded;
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
  const int64_t block = kColumnsPerItem;
  const int64_t items = (n + block - 1) / block;
#pragma omp parallel for schedule(static) if (items > 1 && m * n * k >= kParallelWork)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t j0 = item * block;
    const int nj = static_cast<int>(std::min(block, n - j0));
    const int mi = static_cast<int>(m), ki = static_cast<int>(k), ni = static_cast<int>(n);
    const float* w_block = w + j0 * k;  // rows j0 .. j0 + nj of W
    if (m == 1) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, nj, ki, 1.0f, w_block, ki, x, 1, beta, y + j0, 1);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mi, nj, ki, 1.0f, x, ki, w_block, ki,
                  beta, y + j0, ni);
    }
  }
}

}  // namespace tokenselect::kernels::cpu
