#include "engine/kvcache/token_table.h"

#include <algorithm>
#include <utility>

#include "common/logging.h"
#include "common/status.h"

namespace tokenselect::engine {

TokenTable::TokenTable(PagePool* pool, std::string owner) : pool_(pool), owner_(std::move(owner)) {
  TS_CHECK(pool_ != nullptr, "TokenTable needs a pool");
}

TokenTable::~TokenTable() { Release(); }

TokenTable::TokenTable(TokenTable&& other) noexcept
    : pool_(other.pool_),
      owner_(std::move(other.owner_)),
      pages_(std::move(other.pages_)),
      length_(other.length_) {
  other.pages_.clear();
  other.length_ = 0;
}

TokenTable& TokenTable::operator=(TokenTable&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = other.pool_;
    owner_ = std::move(other.owner_);
    pages_ = std::move(other.pages_);
    length_ = other.length_;
    other.pages_.clear();
    other.length_ = 0;
  }
  return *this;
}

int64_t TokenTable::capacity() const {
  return static_cast<int64_t>(pages_.size()) * pool_->page_size();
}

absl::Status TokenTable::Reserve(int64_t num_tokens) {
  if (num_tokens <= capacity()) return absl::OkStatus();
  const int64_t page_size = pool_->page_size();
  const int64_t needed = (num_tokens + page_size - 1) / page_size - pages_.size();
  ASSIGN_OR_RETURN(std::vector<int32_t> pages, pool_->Allocate(needed, owner_));
  pages_.insert(pages_.end(), pages.begin(), pages.end());
  return absl::OkStatus();
}

absl::StatusOr<int64_t> TokenTable::Append(int64_t n) {
  TS_CHECK(n >= 0, "Append({})", n);
  RETURN_IF_ERROR(Reserve(length_ + n));
  const int64_t first = length_;
  length_ += n;
  return first;
}

void TokenTable::Truncate(int64_t new_length) {
  TS_CHECK(new_length >= 0 && new_length <= length_, "Truncate({}) with length {}", new_length,
           length_);
  length_ = new_length;
}

void TokenTable::Release() {
  if (!pages_.empty()) {
    // The table only ever holds pages the pool gave it, so Free cannot fail.
    const absl::Status status = pool_->Free(pages_);
    TS_CHECK(status.ok(), "{}", status.ToString());
    pages_.clear();
  }
  length_ = 0;
}

int32_t TokenTable::Slot(int64_t i) const {
  TS_CHECK(i >= 0 && i < capacity(), "token {} outside capacity {}", i, capacity());
  const int64_t page_size = pool_->page_size();
  return static_cast<int32_t>(pages_[i / page_size] * page_size + i % page_size);
}

void TokenTable::Slots(int64_t begin, int64_t end, int32_t* out) const {
  TS_CHECK(begin >= 0 && begin <= end && end <= capacity(), "slots [{}, {}) with capacity {}",
           begin, end, capacity());
  const int64_t page_size = pool_->page_size();
  int64_t i = begin;
  while (i < end) {
    // One page at a time: consecutive slots within a page.
    const int64_t page_end = std::min(end, (i / page_size + 1) * page_size);
    const int64_t page_index = i / page_size;
    const int64_t base = (static_cast<int64_t>(pages_[page_index]) - page_index) * page_size;
    for (; i < page_end; ++i) *out++ = static_cast<int32_t>(base + i);
  }
}

std::vector<int32_t> TokenTable::Slots(int64_t begin, int64_t end) const {
  TS_CHECK(begin <= end, "slots [{}, {})", begin, end);
  std::vector<int32_t> out(end - begin);
  Slots(begin, end, out.data());
  return out;
}

}  // namespace tokenselect::engine
