#include "engine/sampling/logit_scan.h"

#include <cstddef>
#include <limits>

namespace tokenselect::engine {

LogitScan ScanLogits(absl::Span<const float> logits) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr int kLanes = 8;
  float max[kLanes];
  int bad[kLanes];
  for (int j = 0; j < kLanes; ++j) {
    max[j] = -kInf;
    bad[j] = 0;
  }
  const float* x = logits.data();
  const size_t n = logits.size();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const float v = x[i + j];
      max[j] = v > max[j] ? v : max[j];
      bad[j] |= !(v < kInf);  // NaN or +inf
    }
  }
  for (; i < n; ++i) {
    max[0] = x[i] > max[0] ? x[i] : max[0];
    bad[0] |= !(x[i] < kInf);
  }
  LogitScan scan{-kInf, false};
  for (int j = 0; j < kLanes; ++j) {
    scan.max = max[j] > scan.max ? max[j] : scan.max;
    scan.has_nan_or_pos_inf = scan.has_nan_or_pos_inf || bad[j] != 0;
  }
  return scan;
}

}  // namespace tokenselect::engine
