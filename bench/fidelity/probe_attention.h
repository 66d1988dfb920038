// The fidelity probe (fidelity.h, metric (a)): an AttentionListProvider that always returns the
// dense list, so the forward pass follows the dense trajectory, and, on the steps it is told to
// measure, also asks every policy's own SelectionAttention for its list on the same q/K/V and
// compares:
//   error     ||O - O_hat||_F / ||O||_F over the step's [num_new, num_heads, head_dim] outputs,
//             O from the dense list, O_hat from the policy's (both kernels::cpu::GatherAttention)
//   error at true positions  the same with the policy's tokens rotated at their true positions
//             instead of its compact ones: the part of the error due to the selection alone
//   coverage  for each new token i and head h, the dense softmax probabilities (RoPE at true
//             positions, scale 1 / sqrt(head_dim)) summed over the tokens of the policy's list,
//             averaged over (i, h)
// The policies' providers see every step from the first prefill chunk to the last measured one
// (kFeed steps are run through them unmeasured), so stateful policies and the selection caches
// evolve as in a real request (teacher-forced on the dense queries). Later steps skip them.
// With FP8 scales (Create's kv_scales, kv_scales.h layout) the policies see a shadow of the
// cache holding every K/V value quantized and dequantized with its head's scale: they select on
// it and O_hat attends to it, while O (and the coverage) use the exact cache.
#ifndef TOKENSELECT_BENCH_FIDELITY_PROBE_ATTENTION_H_
#define TOKENSELECT_BENCH_FIDELITY_PROBE_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/fidelity/fidelity.h"
#include "engine/model/attention_list.h"
#include "engine/selection/selection_attention.h"

namespace tokenselect::bench {

// Sums of one layer's metrics over the measured steps of one phase.
struct LayerAccumulator {
  int64_t samples = 0;
  double error_sum = 0, error_max = 0, error_true_sum = 0;
  double coverage_sum = 0, coverage_min = 1;
  double attended_sum = 0, cached_sum = 0;
  LayerFidelity Finish(int64_t layer) const;
};

class ProbeAttention : public engine::AttentionListProvider {
 public:
  // kOff: dense only. kFeed: the policies select too, nothing is measured. kPrefill / kDecode:
  // the policies select and the step is measured as that phase.
  enum class Phase { kOff, kFeed, kPrefill, kDecode };

  // One SelectionAttention per policy with `selection` (policy replaced). kv_scales: empty, or
  // the FP8 scales [num_layers, 2, num_kv_heads] the policies' cache is quantized with. Errors
  // from engine::ParsePolicy and SelectionAttention::Create.
  static absl::StatusOr<std::unique_ptr<ProbeAttention>> Create(
      const std::vector<std::string>& policies, const engine::SelectionOptions& selection,
      int64_t num_layers, std::vector<float> kv_scales = {});

  // What the following forward steps are measured as (kOff: not measured).
  void set_phase(Phase phase) { phase_ = phase; }

  absl::Status Select(const engine::AttentionQuery& query, engine::AttentionList* list) override;

  // Per policy (in Create's order), per layer.
  std::vector<LayerFidelity> Results(size_t policy, Phase phase) const;

 private:
  struct PolicyProbe {
    std::string name;
    std::unique_ptr<engine::SelectionAttention> attention;
    engine::AttentionList list;
    std::vector<uint8_t> in_list;  // [total tokens]: token attended by the policy's list
    std::vector<double> covered;   // per (query, head) of the current step
    std::vector<LayerAccumulator> decode, prefill;
  };

  ProbeAttention() = default;
  // `policy_query`: the query the policies see (the FP8 shadow cache, or `query` itself).
  void Measure(const engine::AttentionQuery& query, const engine::AttentionQuery& policy_query,
               const engine::AttentionList& dense);
  // FP8: quantizes the step's new tokens into the layer's shadow K/V and returns the query
  // over the shadow.
  engine::AttentionQuery Shadow(const engine::AttentionQuery& query);
  // Writes the dense probabilities' coverage of every policy into PolicyProbe::covered.
  void DenseCoverage(const engine::AttentionQuery& query, const engine::AttentionList& dense);

  Phase phase_ = Phase::kOff;
  engine::DenseAttentionList dense_;
  engine::AttentionList true_list_;
  std::vector<PolicyProbe> probes_;
  std::vector<int32_t> slot_to_token_;
  std::vector<float> out_dense_, out_policy_, q_rot_, k_rot_, probs_;
  std::vector<int32_t> positions_;
  std::vector<float> kv_scales_;                         // FP8 only
  std::vector<std::vector<float>> shadow_k_, shadow_v_;  // FP8: per layer [num_slots, kv_dim]
  std::vector<int32_t> new_slots_;
};

}  // namespace tokenselect::bench

#endif  // TOKENSELECT_BENCH_FIDELITY_PROBE_ATTENTION_H_
