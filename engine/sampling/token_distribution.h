// The distribution random sampling draws from: logits scaled by 1/temperature, then truncated by
// min_p, top_k and top_p, in that order (vLLM v1's order). Each filter works on what the previous
// one kept: min_p compares with the most likely token of the full distribution, top_k keeps the k
// most likely survivors, top_p keeps the smallest most-likely set of the survivors whose mass,
// renormalised over the survivors, is >= top_p.
//
// "Most likely first" orders by logit, ties to the lower id: a total order, so every kept set is
// uniquely defined. Cost for a vocab of V with n tokens surviving min_p: two O(V) passes, one exp
// per survivor of top_k, and for top_k / top_p a selection that finds the last kept token in
// expected O(n) (a bounded heap in the first pass for k <= 256, else nth_element; for top_p a
// histogram of mass over logit buckets, then a quickselect on mass inside the boundary bucket);
// nothing sorts the vocab. The kept tokens are always listed in
// ascending id order, so the token picked for a given uniform number depends on neither the
// standard library's nth_element nor the order tokens were ranked in.
#ifndef TOKENSELECT_ENGINE_SAMPLING_TOKEN_DISTRIBUTION_H_
#define TOKENSELECT_ENGINE_SAMPLING_TOKEN_DISTRIBUTION_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/sampling/sampling_params.h"

namespace tokenselect::engine {

class TokenDistribution {
 public:
  // Rebuilds the distribution from `logits` ([vocab], penalties already applied; -inf masks a
  // token; no NaN or +inf) with params.temperature > 0, top_k, top_p and min_p. Tokens whose
  // probability relative to the most likely one underflows float (< 1.2e-38) are dropped. Returns
  // InvalidArgument if temperature is not > 0 or no logit is finite. Reuses its buffers, so a
  // warm distribution allocates nothing.
  absl::Status Build(absl::Span<const float> logits, const SamplingParams& params);

  // Number of kept tokens (>= 1 after a successful Build).
  size_t size() const { return kept_.size(); }
  // The i-th kept token id (ascending) and its unnormalised weight
  // exp((logit - max logit) / temperature).
  int32_t id(size_t i) const { return kept_[i].id; }
  double weight(size_t i) const { return kept_[i].weight; }
  // Sum of the kept weights; probability(i) = weight(i) / total_weight().
  double total_weight() const { return total_weight_; }
  double probability(size_t i) const { return kept_[i].weight / total_weight_; }

  // Inverse-CDF pick: the first kept token (in ascending id order) whose cumulative weight
  // exceeds u * total_weight(), for u in [0, 1).
  int32_t Pick(double u) const;

 private:
  struct Candidate {
    float logit;
    float weight;  // set once the candidate survives top_k
    int32_t id;
  };
  struct MoreLikely {  // a functor, so the std:: algorithms inline it
    bool operator()(const Candidate& a, const Candidate& b) const {
      return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    }
  };
  // Keeps, in kept_'s id order, the candidates ranked at or above `last`.
  void KeepUpTo(const Candidate& last);
  // The least likely candidate of the smallest most-likely set with mass >= target; the kept
  // logits lie in [min_logit, max_logit].
  Candidate TopPBoundary(double target, float max_logit, float min_logit);

  std::vector<Candidate> kept_;      // the distribution, ascending id
  std::vector<Candidate> scratch_;   // reordered by selection
  std::vector<double> bucket_mass_;  // top_p histogram
  double total_weight_ = 0.0;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SAMPLING_TOKEN_DISTRIBUTION_H_
