#include "engine/selection/cascade_cache.h"

#include <algorithm>
#include <utility>

#include "common/logging.h"

namespace tokenselect::engine {

void CascadeCache::Configure(const std::vector<int64_t>& capacities) {
  for (int64_t c : capacities) TS_CHECK(c >= 0, "sub-cache capacity {}", c);
  capacities_ = capacities;
  subs_.assign(capacities.size(), {});
  offers_.assign(capacities.size(), 0);
  next_token = 0;
}

std::vector<int64_t> CascadeCache::EqualCapacities(int64_t total, int64_t num_sub_caches) {
  TS_CHECK(total >= 0 && num_sub_caches >= 1, "{} slots over {} sub-caches", total, num_sub_caches);
  std::vector<int64_t> caps(static_cast<size_t>(num_sub_caches), total / num_sub_caches);
  for (int64_t i = 0; i < total % num_sub_caches; ++i) ++caps[i];
  return caps;
}

void CascadeCache::Push(int32_t token, float ema) { Offer(0, Entry{token, ema}); }

void CascadeCache::Offer(size_t level, const Entry& e) {
  if (level >= subs_.size()) return;  // evicted from the last sub-cache: out
  std::deque<Entry>& sub = subs_[level];
  if (level > 0 && static_cast<int64_t>(sub.size()) >= capacities_[level]) {
    const bool accept = offers_[level]++ % 2 == 1;
    if (!accept && !sub.empty()) {
      if (e.ema > sub.back().ema) sub.back() = e;  // the loser is dropped
      return;
    }
  }
  sub.push_back(e);
  if (static_cast<int64_t>(sub.size()) > capacities_[level]) {
    const Entry evicted = sub.front();
    sub.pop_front();
    Offer(level + 1, evicted);
  }
}

void CascadeCache::Restore(const std::vector<int64_t>& capacities,
                           std::vector<std::deque<Entry>> subs, const std::vector<int64_t>& offers,
                           int64_t next) {
  TS_CHECK(subs.size() == capacities.size() && offers.size() == capacities.size(),
           "cascade restore: {} capacities, {} sub-caches, {} offer counters", capacities.size(),
           subs.size(), offers.size());
  capacities_ = capacities;
  subs_ = std::move(subs);
  offers_ = offers;
  next_token = next;
}

int64_t CascadeCache::size() const {
  int64_t n = 0;
  for (const auto& s : subs_) n += static_cast<int64_t>(s.size());
  return n;
}

void CascadeCache::Tokens(std::vector<int32_t>* out) const {
  out->clear();
  for (const auto& s : subs_) {
    for (const Entry& e : s) out->push_back(e.token);
  }
  std::sort(out->begin(), out->end());
}

}  // namespace tokenselect::engine
