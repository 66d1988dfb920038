// The eviction structure of the Cascading KV cache (Willette et al.; docs/DESIGN.md section 4,
// docs/selection.md): N FIFO sub-caches with fixed capacities. Tokens enter sub-cache 0. When a
// sub-cache is over capacity its oldest token is evicted and offered to the next sub-cache (out
// of the cache after the last one). A sub-cache i >= 1 that has free slots accepts every token
// offered to it; once full it accepts every second one (the 2nd, 4th, ... offered while full),
// so in steady state it holds about every 2^i-th token of the stream. An offered token that is
// not accepted meets the newest token of sub-cache i at the boundary: the one with the higher
// EMA attention score stays there (ties: the one already there), the other is dropped. (Filling
// free slots first means the cache holds exactly min(pushed, total capacity) tokens.)
//
// With S slots per sub-cache the cache spans about S * (2^N - 1) tokens
// = (|C| / N) * sum_{i=1..N} 2^(i-1) (7680 for |C| = 2048, N = 4).
#ifndef TOKENSELECT_ENGINE_SELECTION_CASCADE_CACHE_H_
#define TOKENSELECT_ENGINE_SELECTION_CASCADE_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

namespace tokenselect::engine {

class CascadeCache {
 public:
  struct Entry {
    int32_t token = 0;
    float ema = 0.0f;
  };

  // Empties the cache and sets the sub-cache capacities (each >= 0, checked).
  void Configure(const std::vector<int64_t>& capacities);
  // Equal split of `total` slots over `num_sub_caches` (the first total % N get one more).
  static std::vector<int64_t> EqualCapacities(int64_t total, int64_t num_sub_caches);

  // Pushes a token (newer than every token pushed before) into sub-cache 0.
  void Push(int32_t token, float ema);

  int64_t num_sub_caches() const { return static_cast<int64_t>(subs_.size()); }
  const std::vector<int64_t>& capacities() const { return capacities_; }
  std::deque<Entry>& sub_cache(int64_t i) { return subs_[i]; }
  const std::deque<Entry>& sub_cache(int64_t i) const { return subs_[i]; }
  int64_t size() const;
  // Offers sub-cache i received while full (its accept/compare alternation).
  int64_t offers(int64_t i) const { return offers_[i]; }
  // Replaces the whole state (layer_state.h's deserialisation); sizes must match (checked).
  void Restore(const std::vector<int64_t>& capacities, std::vector<std::deque<Entry>> subs,
               const std::vector<int64_t>& offers, int64_t next);
  // Every retained token, ascending.
  void Tokens(std::vector<int32_t>* out) const;

  // The tokens [0, next_token()) have been pushed (or skipped); kept by the owner.
  int64_t next_token = 0;

 private:
  void Offer(size_t level, const Entry& e);

  std::vector<int64_t> capacities_;
  std::vector<std::deque<Entry>> subs_;
  std::vector<int64_t> offers_;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SELECTION_CASCADE_CACHE_H_
