// Tiled schedule of cpu::GatherAttention, for many query rows per kv head (prefill chunks).
//
// Reads: each visible (key, kv head) exactly once per call: the key list is walked in shared
// tiles of tile_keys keys; a tile's cos/sin rows are computed once, then all kv heads' keys are
// gathered and rotated into k_tile [num_kv_heads][tile][head_dim] and values gathered into
// v_tile, in parallel over (kv head, block of keys). Then every work item (kv head, block of
// kRowsPerItem query rows) runs in parallel over the tile in chunks sized for single-threaded
// sgemm: S = scale Q K^T, online-softmax step, acc += P V, each item owning its rows' state.
// Items skip columns past the largest visible count of their rows (causal chunks).
// Writes: acc/m/l for all query rows (the size of out), then the normalised out.
// One OpenMP parallel region for the whole call; worksharing loops with their implicit barriers
// separate a tile's gather from its use and from the next tile's gather.
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/gather_attention.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec_math.h"

namespace tokenselect::kernels::cpu::internal {
namespace {

constexpr int64_t kDefaultTileKeys = 512;
constexpr int64_t kRowsPerItem = 32;  // measured best of 8-64 on a 512-query chunk
constexpr int64_t kGatherBlockKeys = 32;

}  // namespace

void GatherAttentionTiled(const GatherAttentionParams& p, const GatherAttentionOptions& options) {
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

  const int64_t tile = options.tile_keys > 0 ? options.tile_keys : kDefaultTileKeys;
  const int64_t rows_per_item =
      std::min(options.rows_per_item > 0 ? options.rows_per_item : kRowsPerItem, rows);
  const int64_t chunk = std::clamp<int64_t>(kBlasSingleThreadWork / (rows_per_item * d) / 8 * 8,
                                            std::min<int64_t>(8, tile), tile);
  const int64_t row_blocks = (rows + rows_per_item - 1) / rows_per_item;
  const int64_t items = p.num_kv_heads * row_blocks;
  const int64_t gather_blocks_per_head = (tile + kGatherBlockKeys - 1) / kGatherBlockKeys;

  // The largest visible count among each row block's queries.
  std::vector<int64_t> block_visible(static_cast<size_t>(row_blocks), 0);
  for (int64_t b = 0; b < row_blocks; ++b) {
    const int64_t first = b * rows_per_item / group;
    const int64_t last = (std::min(rows, (b + 1) * rows_per_item) - 1) / group;
    for (int64_t i = first; i <= last; ++i) {
      block_visible[static_cast<size_t>(b)] =
          std::max(block_visible[static_cast<size_t>(b)], visible[static_cast<size_t>(i)]);
    }
  }

  const size_t tile_size = static_cast<size_t>(p.num_kv_heads * tile * d);
  float* q = ThreadScratch(ScratchSlot::kQueries, static_cast<size_t>(total_rows * d));
  float* m = ThreadScratch(ScratchSlot::kRowMax, static_cast<size_t>(total_rows));
  float* l = ThreadScratch(ScratchSlot::kRowSum, static_cast<size_t>(total_rows));
  float* acc = ThreadScratch(ScratchSlot::kAccumulator, static_cast<size_t>(total_rows * d));
  float* cos = ThreadScratch(ScratchSlot::kCos, static_cast<size_t>(tile * half));
  float* sin = ThreadScratch(ScratchSlot::kSin, static_cast<size_t>(tile * half));
  float* k_tile = ThreadScratch(ScratchSlot::kKeyTile, tile_size);
  float* v_tile = ThreadScratch(ScratchSlot::kValueTile, tile_size);
  RotateQueries(p, q);
  std::fill_n(m, total_rows, -std::numeric_limits<float>::infinity());
  std::fill_n(l, total_rows, 0.0f);
  std::fill_n(acc, total_rows * d, 0.0f);

#pragma omp parallel
  {
    float* scores =
        ThreadScratch(ScratchSlot::kWorkerScores, static_cast<size_t>(rows_per_item * chunk));
    std::vector<int64_t> limit(static_cast<size_t>(rows_per_item));
    for (int64_t t0 = 0; t0 < visible_end; t0 += tile) {
      const int64_t n = std::min(tile, visible_end - t0);
#pragma omp for schedule(static)
      for (int64_t jj = 0; jj < n; ++jj) {
        RopeCosSin(p.kv_positions[t0 + jj], p.inv_freq, half, cos + jj * half, sin + jj * half);
      }
#pragma omp for schedule(static)
      for (int64_t job = 0; job < p.num_kv_heads * gather_blocks_per_head; ++job) {
        const int64_t kv_head = job / gather_blocks_per_head;
        const int64_t j0 = (job % gather_blocks_per_head) * kGatherBlockKeys;
        if (j0 >= n) continue;
        const int64_t nb = std::min(kGatherBlockKeys, n - j0);
        float* k_dst = k_tile + (kv_head * tile + j0) * d;
        float* v_dst = v_tile + (kv_head * tile + j0) * d;
        GatherRotateRows(k_dst, p.k_cache + kv_head * d, p.kv_slots + t0 + j0, nb, kv_stride,
                         cos + j0 * half, sin + j0 * half, half);
        GatherRows(v_dst, p.v_cache + kv_head * d, p.kv_slots + t0 + j0, nb, kv_stride, d);
      }
#pragma omp for schedule(dynamic, 1)
      for (int64_t item = 0; item < items; ++item) {
        const int64_t kv_head = item / row_blocks;
        const int64_t b = item % row_blocks;
        const int64_t cols = std::min(n, block_visible[static_cast<size_t>(b)] - t0);
        if (cols <= 0) continue;
        const int64_t r0 = b * rows_per_item;
        const int64_t nr = std::min(rows_per_item, rows - r0);
        const int64_t head_row = kv_head * rows + r0;
        const float* k_head = k_tile + kv_head * tile * d;
        const float* v_head = v_tile + kv_head * tile * d;
        for (int64_t c0 = 0; c0 < cols; c0 += chunk) {
          const int64_t cn = std::min(chunk, cols - c0);
          for (int64_t r = 0; r < nr; ++r) {
            const int64_t query = (r0 + r) / group;
            limit[static_cast<size_t>(r)] =
                std::clamp<int64_t>(visible[static_cast<size_t>(query)] - (t0 + c0), 0, cn);
          }
          ScoreGemm(scores, q + head_row * d, k_head + c0 * d, nr, cn, d, p.scale);
          OnlineSoftmaxStep(scores, nr, cn, limit.data(), m + head_row, l + head_row,
                            acc + head_row * d, d);
          AccumulateGemm(acc + head_row * d, scores, v_head + c0 * d, nr, cn, d);
        }
      }
    }
  }
  WriteNormalizedOutput(p, acc, l);
}

}  // namespace tokenselect::kernels::cpu::internal
