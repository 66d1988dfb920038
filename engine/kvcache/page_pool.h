// The paged KV cache of one worker: fixed-size pages of `page_size` token slots, and per layer
// one K and one V array over all slots. Requests own whole pages (through a TokenTable); slot
// s = page * page_size + offset is the row of token storage that the kernels index
// (kernels/ops.h GatherAttentionParams::kv_slots).
//
// Storage per layer (CPU backend, fp32):
//   k: [num_slots, num_kv_heads, head_dim], keys stored UN-rotated (RoPE is applied at gather
//      time, docs/DESIGN.md section 4)
//   v: [num_slots, num_kv_heads, head_dim]
// with num_slots = num_pages * page_size.
//
// Thread-safety: Allocate, Free and the counters may be called from any thread. The K/V storage
// is not locked: a page's slots are read and written only by the holder of that page.
#ifndef TOKENSELECT_ENGINE_KVCACHE_PAGE_POOL_H_
#define TOKENSELECT_ENGINE_KVCACHE_PAGE_POOL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace tokenselect::engine {

struct PagePoolOptions {
  int64_t num_pages = 0;
  int64_t page_size = 16;  // token slots per page
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
};

class PagePool {
 public:
  // Validates the options (all positive; num_slots must fit in int32 since kernels take int32
  // slot ids) and allocates zeroed storage. InvalidArgument names the offending field.
  static absl::StatusOr<std::unique_ptr<PagePool>> Create(const PagePoolOptions& options);

  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  // Takes `n` free pages for `owner` (a request id; reported by CheckNoLeaks). All or nothing:
  // ResourceExhausted (saying how many are free) when fewer than `n` are free; InvalidArgument
  // when n < 0. Pages come out in ascending order of id when the pool is fresh.
  absl::StatusOr<std::vector<int32_t>> Allocate(int64_t n, absl::string_view owner);

  // Returns `pages` to the pool. All or nothing: InvalidArgument, freeing none, when a page id
  // is out of range, not allocated, or listed twice.
  absl::Status Free(absl::Span<const int32_t> pages);

  // OK when every page is free; FailedPrecondition listing the owners and pages still held
  // otherwise (for shutdown and test tear-down).
  absl::Status CheckNoLeaks() const;

  int64_t num_free_pages() const;
  int64_t num_used_pages() const;
  // used / total, for the KV usage gauge.
  double usage_ratio() const;

  const PagePoolOptions& options() const { return options_; }
  int64_t num_pages() const { return options_.num_pages; }
  int64_t page_size() const { return options_.page_size; }
  int64_t num_slots() const { return options_.num_pages * options_.page_size; }
  // Floats per slot in one layer's K (or V) array: num_kv_heads * head_dim.
  int64_t slot_stride() const { return options_.num_kv_heads * options_.head_dim; }
  // Bytes of K/V storage over all layers.
  int64_t storage_bytes() const;

  // The layer's arrays, [num_slots, num_kv_heads, head_dim]. layer must be in range (checked).
  float* k(int64_t layer);
  float* v(int64_t layer);
  const float* k(int64_t layer) const;
  const float* v(int64_t layer) const;

 private:
  explicit PagePool(const PagePoolOptions& options);

  const PagePoolOptions options_;
  // One array per layer for K and for V, each num_slots * slot_stride() floats.
  std::vector<std::vector<float>> k_;
  std::vector<std::vector<float>> v_;

  mutable absl::Mutex mu_;
  // Free page ids; Allocate takes from the back, so the list is kept descending at creation.
  std::vector<int32_t> free_ ABSL_GUARDED_BY(mu_);
  // Owner of each page; empty string for a free page.
  std::vector<std::string> owner_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> allocated_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_KVCACHE_PAGE_POOL_H_
