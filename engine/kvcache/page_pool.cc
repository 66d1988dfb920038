#include "engine/kvcache/page_pool.h"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace tokenselect::engine {
namespace {

absl::Status CheckPositive(absl::string_view field, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("page pool: ", field, " must be positive, got ", value));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PagePool>> PagePool::Create(const PagePoolOptions& options) {
  for (const auto& [field, value] :
       {std::pair<const char*, int64_t>{"num_pages", options.num_pages},
        {"page_size", options.page_size},
        {"num_layers", options.num_layers},
        {"num_kv_heads", options.num_kv_heads},
        {"head_dim", options.head_dim}}) {
    if (absl::Status s = CheckPositive(field, value); !s.ok()) return s;
  }
  constexpr int64_t kMaxSlots = std::numeric_limits<int32_t>::max();
  if (options.num_pages > kMaxSlots / options.page_size) {
    return absl::InvalidArgumentError(absl::StrCat("page pool: num_pages (", options.num_pages,
                                                   ") * page_size (", options.page_size,
                                                   ") exceeds the int32 slot range"));
  }
  const int64_t num_slots = options.num_pages * options.page_size;
  // Bytes over all layers: 2 (K and V) * num_layers * num_slots * stride * 4 must fit int64.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (options.num_kv_heads > kMax / options.head_dim ||
      options.num_kv_heads * options.head_dim > kMax / 8 / num_slots / options.num_layers) {
    return absl::InvalidArgumentError("page pool: storage size overflows int64");
  }
  return std::unique_ptr<PagePool>(new PagePool(options));
}

PagePool::PagePool(const PagePoolOptions& options) : options_(options) {
  const size_t floats = static_cast<size_t>(num_slots() * slot_stride());
  k_.reserve(options_.num_layers);
  v_.reserve(options_.num_layers);
  for (int64_t layer = 0; layer < options_.num_layers; ++layer) {
    k_.emplace_back(floats, 0.0f);
    v_.emplace_back(floats, 0.0f);
  }
  absl::MutexLock lock(&mu_);
  free_.resize(options_.num_pages);
  // Descending, so that pop_back hands out page 0 first.
  for (int64_t i = 0; i < options_.num_pages; ++i) {
    free_[i] = static_cast<int32_t>(options_.num_pages - 1 - i);
  }
  owner_.assign(options_.num_pages, std::string());
  allocated_.assign(options_.num_pages, false);
}

absl::StatusOr<std::vector<int32_t>> PagePool::Allocate(int64_t n, absl::string_view owner) {
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("page pool: cannot allocate ", n, " pages"));
  }
  absl::MutexLock lock(&mu_);
  if (n > static_cast<int64_t>(free_.size())) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache full: ", owner, " needs ", n,
                                                     " pages, ", free_.size(), " of ",
                                                     options_.num_pages, " are free"));
  }
  std::vector<int32_t> pages(free_.end() - n, free_.end());
  std::reverse(pages.begin(), pages.end());
  free_.resize(free_.size() - n);
  for (int32_t page : pages) {
    allocated_[page] = true;
    owner_[page] = std::string(owner);
  }
  return pages;
}

absl::Status PagePool::Free(absl::Span<const int32_t> pages) {
  absl::MutexLock lock(&mu_);
  // Validate everything before changing anything.
  std::vector<int32_t> sorted(pages.begin(), pages.end());
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    const int32_t page = sorted[i];
    if (page < 0 || page >= options_.num_pages) {
      return absl::InvalidArgumentError(
          absl::StrCat("page pool: page ", page, " is out of range [0, ", options_.num_pages, ")"));
    }
    if (i > 0 && sorted[i - 1] == page) {
      return absl::InvalidArgumentError(
          absl::StrCat("page pool: page ", page, " is listed twice in one Free"));
    }
    if (!allocated_[page]) {
      return absl::InvalidArgumentError(
          absl::StrCat("page pool: page ", page, " is not allocated (double free?)"));
    }
  }
  for (int32_t page : pages) {
    allocated_[page] = false;
    owner_[page].clear();
    free_.push_back(page);
  }
  return absl::OkStatus();
}

absl::Status PagePool::CheckNoLeaks() const {
  absl::MutexLock lock(&mu_);
  if (static_cast<int64_t>(free_.size()) == options_.num_pages) return absl::OkStatus();
  std::map<std::string, std::vector<int32_t>> by_owner;
  for (int64_t page = 0; page < options_.num_pages; ++page) {
    if (allocated_[page]) by_owner[owner_[page]].push_back(static_cast<int32_t>(page));
  }
  std::vector<std::string> parts;
  for (const auto& [owner, pages] : by_owner) {
    parts.push_back(absl::StrCat(owner.empty() ? "(no owner)" : owner, ": ", pages.size(),
                                 " pages [", absl::StrJoin(pages, ", "), "]"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("page pool: ", options_.num_pages - static_cast<int64_t>(free_.size()),
                   " pages still owned: ", absl::StrJoin(parts, "; ")));
}

int64_t PagePool::num_free_pages() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(free_.size());
}

int64_t PagePool::num_used_pages() const { return options_.num_pages - num_free_pages(); }

double PagePool::usage_ratio() const {
  return static_cast<double>(num_used_pages()) / static_cast<double>(options_.num_pages);
}

int64_t PagePool::storage_bytes() const {
  return 2 * options_.num_layers * num_slots() * slot_stride() *
         static_cast<int64_t>(sizeof(float));
}

float* PagePool::k(int64_t layer) {
  TS_CHECK(layer >= 0 && layer < options_.num_layers, "layer {} out of range", layer);
  return k_[layer].data();
}

float* PagePool::v(int64_t layer) {
  TS_CHECK(layer >= 0 && layer < options_.num_layers, "layer {} out of range", layer);
  return v_[layer].data();
}

const float* PagePool::k(int64_t layer) const {
  TS_CHECK(layer >= 0 && layer < options_.num_layers, "layer {} out of range", layer);
  return k_[layer].data();
}

const float* PagePool::v(int64_t layer) const {
  TS_CHECK(layer >= 0 && layer < options_.num_layers, "layer {} out of range", layer);
  return v_[layer].data();
}

}  // namespace tokenselect::engine
