#include "engine/sampling/token_distribution.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/sampling/logit_scan.h"

namespace tokenselect::engine {
namespace {

// Scaled logits below log(FLT_MIN) would give a denormal or zero weight: such tokens are dropped.
const double kMinScaled = std::log(static_cast<double>(std::numeric_limits<float>::min()));

// top_p histograms the kept mass over this many logit buckets.
constexpr size_t kTopPBuckets = 1024;

// Below this many candidates the top_p selection sorts instead of partitioning further.
constexpr size_t kSortBelow = 64;

// top_k up to this uses a bounded heap in the first pass instead of a candidate list and
// nth_element: O(V) with one comparison for most tokens, O(k) memory.
constexpr size_t kHeapTopK = 256;

}  // namespace

absl::Status TokenDistribution::Build(absl::Span<const float> logits,
                                      const SamplingParams& params) {
  kept_.clear();
  total_weight_ = 0.0;
  if (!(params.temperature > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("random sampling needs temperature > 0, got ", params.temperature));
  }
  const float max_logit = ScanLogits(logits).max;
  if (!(max_logit > -std::numeric_limits<float>::infinity())) {
    return absl::InvalidArgumentError("no token has a finite logit");
  }

  // min_p (and the underflow cut) in logit space, without exp: p_i / p_max = exp(scaled_i).
  const double inv_temperature = 1.0 / static_cast<double>(params.temperature);
  const double min_scaled = params.min_p > 0.0f
                                ? std::max(kMinScaled, std::log(static_cast<double>(params.min_p)))
                                : kMinScaled;
  // Kept: (x - max) / T >= min_scaled, i.e. x >= max + T * min_scaled, as a float threshold (the
  // smallest float not below the exact one), so the pass compares floats only.
  const double threshold =
      std::max(max_logit + static_cast<double>(params.temperature) * min_scaled,
               static_cast<double>(std::numeric_limits<float>::lowest()));
  float min_logit = static_cast<float>(threshold);
  if (static_cast<double>(min_logit) < threshold) {
    min_logit = std::nextafter(min_logit, std::numeric_limits<float>::infinity());
  }
  auto survives_min_p = [min_logit](float x) { return x >= min_logit; };  // false for -inf
  const size_t top_k = params.top_k > 0 ? static_cast<size_t>(params.top_k) : logits.size();
  if (top_k < logits.size() && top_k <= kHeapTopK) {
    // Small k: one pass keeping the k most likely in a heap whose front is the least likely.
    for (size_t i = 0; i < logits.size(); ++i) {
      const Candidate c{logits[i], 0.0f, static_cast<int32_t>(i)};
      if (kept_.size() == top_k && !MoreLikely()(c, kept_.front())) continue;
      if (!survives_min_p(c.logit)) continue;
      if (kept_.size() == top_k) {
        std::pop_heap(kept_.begin(), kept_.end(), MoreLikely());
        kept_.back() = c;
      } else {
        kept_.push_back(c);
      }
      std::push_heap(kept_.begin(), kept_.end(), MoreLikely());
    }
    std::sort(kept_.begin(), kept_.end(),
              [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
  } else {
    // Written through a raw pointer: push_back of a temporary costs a store-forwarding stall
    // per token here.
    kept_.resize(logits.size());
    Candidate* out = kept_.data();
    size_t n = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      if (survives_min_p(logits[i])) {
        out[n].logit = logits[i];
        out[n].weight = 0.0f;
        out[n].id = static_cast<int32_t>(i);
        ++n;
      }
    }
    kept_.resize(n);
    if (top_k < kept_.size()) {
      scratch_.assign(kept_.begin(), kept_.end());
      const auto kth = scratch_.begin() + (top_k - 1);
      std::nth_element(scratch_.begin(), kth, scratch_.end(), MoreLikely());
      KeepUpTo(*kth);
    }
  }

  double total = 0.0;  // summed in id order: canonical
  float least_logit = max_logit;
  for (Candidate& c : kept_) {
    c.weight =
        std::exp(static_cast<float>((static_cast<double>(c.logit) - max_logit) * inv_temperature));
    total += c.weight;
    least_logit = std::min(least_logit, c.logit);
  }
  if (params.top_p < 1.0f) {
    KeepUpTo(TopPBoundary(static_cast<double>(params.top_p) * total, max_logit, least_logit));
    total = 0.0;
    for (const Candidate& c : kept_) total += c.weight;
  }
  total_weight_ = total;
  return absl::OkStatus();
}

void TokenDistribution::KeepUpTo(const Candidate& last) {
  auto ranked_after = [&last](const Candidate& c) { return MoreLikely()(last, c); };
  kept_.erase(std::remove_if(kept_.begin(), kept_.end(), ranked_after), kept_.end());
}

TokenDistribution::Candidate TokenDistribution::TopPBoundary(double target, float max_logit,
                                                             float min_logit) {
  // 1. Histogram of mass over logit buckets (bucket 0 the most likely); the bucket order is
  //    consistent with MoreLikely since every step of the bucket formula is monotonic. Walking
  //    the buckets finds the one holding the boundary and the mass of all buckets before it.
  const double span = static_cast<double>(max_logit) - min_logit;
  const double scale = span > 0.0 ? kTopPBuckets / span : 0.0;
  auto bucket_of = [&](float logit) {
    return std::min(kTopPBuckets - 1,
                    static_cast<size_t>((static_cast<double>(max_logit) - logit) * scale));
  };
  bucket_mass_.assign(kTopPBuckets, 0.0);
  for (const Candidate& c : kept_) bucket_mass_[bucket_of(c.logit)] += c.weight;
  double above = 0.0;
  size_t boundary_bucket = kTopPBuckets - 1;
  for (size_t b = 0; b < kTopPBuckets; ++b) {
    if (bucket_mass_[b] > 0.0 && above + bucket_mass_[b] >= target) {
      boundary_bucket = b;
      break;
    }
    above += bucket_mass_[b];
  }
  if (boundary_bucket == kTopPBuckets - 1) {  // also where rounding left the total short
    above = 0.0;
    while (boundary_bucket > 0 && bucket_mass_[boundary_bucket] == 0.0) --boundary_bucket;
    for (size_t b = 0; b < boundary_bucket; ++b) above += bucket_mass_[b];
  }

  // 2. Quickselect on mass inside that bucket: [lo, hi) holds the candidates whose rank is still
  //    open, `above` the mass of every candidate ranked before them. Expected O(bucket size).
  scratch_.clear();
  for (const Candidate& c : kept_) {
    if (bucket_of(c.logit) == boundary_bucket) scratch_.push_back(c);
  }
  auto lo = scratch_.begin();
  auto hi = scratch_.end();
  while (static_cast<size_t>(hi - lo) > kSortBelow) {
    const auto mid = lo + (hi - lo) / 2;
    std::nth_element(lo, mid, hi, MoreLikely());
    double upto_mid = above;
    for (auto it = lo; it <= mid; ++it) upto_mid += it->weight;
    if (upto_mid >= target) {
      hi = mid + 1;  // the boundary is at or before mid
    } else {
      above = upto_mid;
      lo = mid + 1;
    }
  }
  std::sort(lo, hi, MoreLikely());
  for (auto it = lo; it != hi; ++it) {
    above += it->weight;
    if (above >= target) return *it;
  }
  // Rounding left the mass just short of the target: the bucket's least likely candidate.
  return *(hi - 1);
}

int32_t TokenDistribution::Pick(double u) const {
  const double target = u * total_weight_;
  double cumulative = 0.0;
  for (const Candidate& c : kept_) {
    cumulative += c.weight;
    if (cumulative > target) return c.id;
  }
  // Only reachable through rounding with u close to 1: the last token.
  return kept_.empty() ? -1 : kept_.back().id;
}

}  // namespace tokenselect::engine
