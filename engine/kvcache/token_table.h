// The KV-cache pages of one request and the slot of each of its tokens. Token i lives in slot
//   pages[i / page_size] * page_size + i % page_size
// of the PagePool's per-layer K/V arrays. Capacity grows a page at a time (Reserve / Append);
// Release (or the destructor) gives every page back.
//
// Not thread-safe: a request's table is used by one thread at a time. The pool it draws from is.
#ifndef TOKENSELECT_ENGINE_KVCACHE_TOKEN_TABLE_H_
#define TOKENSELECT_ENGINE_KVCACHE_TOKEN_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/kvcache/page_pool.h"

namespace tokenselect::engine {

class TokenTable {
 public:
  // `pool` must outlive the table. `owner` (usually the request id) tags the pages for the
  // pool's leak report.
  TokenTable(PagePool* pool, std::string owner);
  ~TokenTable();  // Releases the pages.
  TokenTable(TokenTable&& other) noexcept;
  TokenTable& operator=(TokenTable&& other) noexcept;
  TokenTable(const TokenTable&) = delete;
  TokenTable& operator=(const TokenTable&) = delete;

  // Makes room for at least `num_tokens` tokens in total (not in addition to length()).
  // ResourceExhausted from the pool, with nothing allocated, when the pages are not there.
  absl::Status Reserve(int64_t num_tokens);

  // Extends the table by `n` tokens, reserving pages as needed, and returns the index of the
  // first new token (the old length). ResourceExhausted leaves the table unchanged.
  absl::StatusOr<int64_t> Append(int64_t n);

  // Shrinks the length to `new_length` (<= length(), checked); the pages stay reserved. Used
  // to roll back an Append whose forward pass failed.
  void Truncate(int64_t new_length);

  // Gives every page back to the pool; length and capacity become 0. Safe to call twice.
  void Release();

  int64_t length() const { return length_; }
  int64_t capacity() const;
  const std::vector<int32_t>& pages() const { return pages_; }
  const std::string& owner() const { return owner_; }
  PagePool* pool() const { return pool_; }

  // Slot of token `i`; 0 <= i < capacity() (checked).
  int32_t Slot(int64_t i) const;

  // Writes the slots of tokens [begin, end) to out[0, end - begin); 0 <= begin <= end <=
  // capacity() (checked). This is the int32 list GatherAttention takes.
  void Slots(int64_t begin, int64_t end, int32_t* out) const;
  std::vector<int32_t> Slots(int64_t begin, int64_t end) const;

 private:
  PagePool* pool_;
  std::string owner_;
  std::vector<int32_t> pages_;
  int64_t length_ = 0;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_KVCACHE_TOKEN_TABLE_H_
