#include "engine/selection/selection_query.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/selection/selection_options.h"
#include "kernels/ops.h"

namespace tokenselect::engine {
namespace {

absl::Status CheckPositive(absl::string_view name, int64_t value) {
  if (value >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("selection query: ", name, " must be >= 1, got ", value));
}

}  // namespace

absl::Status BuildSelectionQuery(const float* q, int64_t num_q, int64_t num_heads, int64_t head_dim,
                                 int64_t n_local, const float* inv_freq, float* out) {
  if (q == nullptr || inv_freq == nullptr) {
    return absl::InvalidArgumentError("selection query: q and inv_freq must be non-null");
  }
  RETURN_IF_ERROR(CheckPositive("num_q", num_q));
  RETURN_IF_ERROR(CheckPositive("num_heads", num_heads));
  RETURN_IF_ERROR(CheckPositive("head_dim", head_dim));
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("selection query: head_dim must be even for RoPE, got ", head_dim));
  }
  if (n_local < 0 || n_local + num_q - 1 > kMaxSelectionTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("selection query: positions n_local + [0, num_q) must lie in [0, ",
                     kMaxSelectionTokens, "], got n_local = ", n_local, ", num_q = ", num_q));
  }
  if (out == nullptr) return absl::InvalidArgumentError("selection query: out is null");
  const int64_t row = num_heads * head_dim;
  std::vector<float> rotated(q, q + num_q * row);
  std::vector<int32_t> positions(static_cast<size_t>(num_q));
  for (int64_t i = 0; i < num_q; ++i) positions[i] = static_cast<int32_t>(n_local + i);
  kernels::cpu::ApplyRope(rotated.data(), positions.data(), num_q, num_heads, head_dim, inv_freq);
  std::vector<double> sum(static_cast<size_t>(row), 0.0);
  for (int64_t i = 0; i < num_q; ++i) {
    const float* x = rotated.data() + i * row;
    for (int64_t e = 0; e < row; ++e) sum[e] += x[e];
  }
  for (int64_t e = 0; e < row; ++e) out[e] = static_cast<float>(sum[e] / num_q);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> BuildSelectionQuery(const float* q, int64_t num_q,
                                                       int64_t num_heads, int64_t head_dim,
                                                       int64_t n_local, const float* inv_freq) {
  std::vector<float> out(
      static_cast<size_t>(num_heads > 0 && head_dim > 0 ? num_heads * head_dim : 0));
  RETURN_IF_ERROR(
      BuildSelectionQuery(q, num_q, num_heads, head_dim, n_local, inv_freq, out.data()));
  return out;
}

}  // namespace tokenselect::engine
