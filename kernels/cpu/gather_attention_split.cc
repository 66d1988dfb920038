// Split-keys schedule of cpu::GatherAttention, for few query rows per kv head (decode).
//
// Reads: each visible (key, kv head) once: its un-rotated key row (rotated into a private tile)
// and its value row (copied into a private tile), so that the sgemm calls see dense operands.
// Writes: per split, an online-softmax state (m, l, acc) for every query row; then the merged,
// normalised out. Work: the visible range [0, max visible) is cut into num_splits contiguous
// ranges, one OpenMP work item each (dynamic schedule); inside a range, tiles of tile_keys keys:
// cos/sin rows for the tile once, then per kv head gather-rotate K, gather V, S = scale Q K^T,
// online-softmax step, acc += P V. The split count depends only on the visible length (never on
// the thread count), so results do not change with OMP_NUM_THREADS.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/gather_attention.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec_math.h"

namespace tokenselect::kernels::cpu::internal {
namespace {

constexpr int64_t kMinKeysPerSplit = 256;
constexpr int64_t kMaxSplits = 64;
constexpr int64_t kMaxTileKeys = 256;
constexpr int64_t kMinTileKeys = 16;

// The largest multiple of 8 in [kMinTileKeys, kMaxTileKeys] keeping rows * tile * head_dim within
// OpenBLAS's single-thread size.
int64_t DefaultTileKeys(int64_t rows, int64_t head_dim) {
  const int64_t fit = kBlasSingleThreadWork / std::max<int64_t>(1, rows * head_dim);
  return std::clamp<int64_t>(fit / 8 * 8, kMinTileKeys, kMaxTileKeys);
}

// Merges the per-split states into split 0's arrays: with M the largest running max, l = sum of
// l_s exp(m_s - M) and acc = sum of acc_s exp(m_s - M), in split order.
void MergeSplits(int64_t num_splits, int64_t total_rows, int64_t head_dim, float* m, float* l,
                 float* acc) {
#pragma omp parallel for if (num_splits * total_rows * head_dim >= (int64_t{1} << 15))
  for (int64_t r = 0; r < total_rows; ++r) {
    float max_m = -std::numeric_limits<float>::infinity();
    for (int64_t s = 0; s < num_splits; ++s) max_m = std::max(max_m, m[s * total_rows + r]);
    if (max_m == -std::numeric_limits<float>::infinity()) {
      l[r] = 0.0f;
      continue;
    }
    float* out_acc = acc + r * head_dim;
    float total = 0.0f;
    for (int64_t s = 0; s < num_splits; ++s) {
      const int64_t idx = s * total_rows + r;
      const float w = std::exp(m[idx] - max_m);  // 0 for a split this row saw nothing of
      total += l[idx] * w;
      const float* split_acc = acc + idx * head_dim;
      if (s == 0) {
        for (int64_t k = 0; k < head_dim; ++k) out_acc[k] = split_acc[k] * w;
      } else if (w != 0.0f) {
        for (int64_t k = 0; k < head_dim; ++k) out_acc[k] += split_acc[k] * w;
      }
    }
    l[r] = total;
  }
}

}  // namespace

void GatherAttentionSplitKeys(const GatherAttentionParams& p,
                              const GatherAttentionOptions& options) {
  GatherGeometry geometry;
  if (!PrepareGather(p, &geometry)) return;
  const int64_t group = geometry.group;
  const int64_t rows = geometry.rows;  // query rows per kv head
  const int64_t total_rows = rows * p.num_kv_heads;
  const int64_t d = p.head_dim;
  const int64_t half = d / 2;
  const int64_t kv_stride = p.num_kv_heads * d;
  const std::vector<int64_t>& visible = geometry.visible;
  const int64_t visible_end = geometry.visible_end;

  const int64_t tile = options.tile_keys > 0 ? options.tile_keys : DefaultTileKeys(rows, d);
  int64_t num_splits =
      options.num_splits > 0
          ? options.num_splits
          : std::min(kMaxSplits, (visible_end + kMinKeysPerSplit - 1) / kMinKeysPerSplit);
  num_splits = std::clamp<int64_t>(num_splits, 1, visible_end);
  const int64_t keys_per_split = (visible_end + num_splits - 1) / num_splits;
  num_splits = (visible_end + keys_per_split - 1) / keys_per_split;

  const size_t state_rows = static_cast<size_t>(num_splits * total_rows);
  float* q = ThreadScratch(ScratchSlot::kQueries, static_cast<size_t>(total_rows * d));
  float* m = ThreadScratch(ScratchSlot::kRowMax, state_rows);
  float* l = ThreadScratch(ScratchSlot::kRowSum, state_rows);
  float* acc = ThreadScratch(ScratchSlot::kAccumulator, state_rows * static_cast<size_t>(d));
  RotateQueries(p, q);
  std::fill_n(m, state_rows, -std::numeric_limits<float>::infinity());
  std::fill_n(l, state_rows, 0.0f);
  std::fill_n(acc, state_rows * static_cast<size_t>(d), 0.0f);

#pragma omp parallel if (num_splits > 1)
  {
    float* cos = ThreadScratch(ScratchSlot::kWorkerCos, static_cast<size_t>(tile * half));
    float* sin = ThreadScratch(ScratchSlot::kWorkerSin, static_cast<size_t>(tile * half));
    float* k_tile = ThreadScratch(ScratchSlot::kWorkerKeyTile, static_cast<size_t>(tile * d));
    float* v_tile = ThreadScratch(ScratchSlot::kWorkerValueTile, static_cast<size_t>(tile * d));
    float* scores = ThreadScratch(ScratchSlot::kWorkerScores, static_cast<size_t>(rows * tile));
    std::vector<int64_t> limit(static_cast<size_t>(rows));
#pragma omp for schedule(dynamic, 1)
    for (int64_t split = 0; split < num_splits; ++split) {
      const int64_t begin = split * keys_per_split;
      const int64_t end = std::min(visible_end, begin + keys_per_split);
      float* split_m = m + split * total_rows;
      float* split_l = l + split * total_rows;
      float* split_acc = acc + split * total_rows * d;
      for (int64_t t0 = begin; t0 < end; t0 += tile) {
        const int64_t n = std::min(tile, end - t0);
        bool any_visible = false;
        for (int64_t i = 0; i < p.num_queries; ++i) {
          const int64_t lim = std::clamp<int64_t>(visible[static_cast<size_t>(i)] - t0, 0, n);
          any_visible |= lim > 0;
          for (int64_t j = 0; j < group; ++j) limit[static_cast<size_t>(i * group + j)] = lim;
        }
        if (!any_visible) continue;
        for (int64_t jj = 0; jj < n; ++jj) {
          RopeCosSin(p.kv_positions[t0 + jj], p.inv_freq, half, cos + jj * half, sin + jj * half);
        }
        for (int64_t kv_head = 0; kv_head < p.num_kv_heads; ++kv_head) {
          GatherRotateRows(k_tile, p.k_cache + kv_head * d, p.kv_slots + t0, n, kv_stride, cos, sin,
                           half);
          GatherRows(v_tile, p.v_cache + kv_head * d, p.kv_slots + t0, n, kv_stride, d);
          float* head_acc = split_acc + kv_head * rows * d;
          ScoreGemm(scores, q + kv_head * rows * d, k_tile, rows, n, d, p.scale);
          OnlineSoftmaxStep(scores, rows, n, limit.data(), split_m + kv_head * rows,
                            split_l + kv_head * rows, head_acc, d);
          AccumulateGemm(head_acc, scores, v_tile, rows, n, d);
        }
      }
    }
  }
  if (num_splits > 1) MergeSplits(num_splits, total_rows, d, m, l, acc);
  WriteNormalizedOutput(p, acc, l);
}

}  // namespace tokenselect::kernels::cpu::internal
