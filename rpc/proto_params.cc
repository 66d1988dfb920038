#include "rpc/proto_params.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/logging.h"

namespace tokenselect::rpc {
namespace {

constexpr absl::string_view kSelectionPolicyPrefix = "SELECTION_POLICY_";

}  // namespace

int SelectionPolicyNumber(params::SelectionPolicyKind kind) {
  v1::SelectionPolicy number = v1::SELECTION_POLICY_UNSPECIFIED;
  const bool known = v1::SelectionPolicy_Parse(
      absl::StrCat(kSelectionPolicyPrefix, absl::AsciiStrToUpper(params::PolicyName(kind))),
      &number);
  TS_CHECK(known, "params policy {} has no tokenselect.v1.SelectionPolicy value",
           std::string(params::PolicyName(kind)));
  return number;
}

absl::StatusOr<std::optional<params::SelectionPolicyKind>> SelectionPolicyFromNumber(int number) {
  if (number == v1::SELECTION_POLICY_UNSPECIFIED) return std::nullopt;
  if (!v1::SelectionPolicy_IsValid(number)) {
    return absl::InvalidArgumentError(absl::StrCat("selection.policy: unknown value ", number));
  }
  absl::string_view name = v1::SelectionPolicy_Name(static_cast<v1::SelectionPolicy>(number));
  absl::ConsumePrefix(&name, kSelectionPolicyPrefix);
  absl::StatusOr<params::SelectionPolicyKind> kind =
      params::ParsePolicy(absl::AsciiStrToLower(name));
  if (!kind.ok()) return kind.status();
  return *kind;
}

void SelectionToProto(const params::SelectionOptions& s, v1::SelectionParams* p) {
  p->set_policy(static_cast<v1::SelectionPolicy>(SelectionPolicyNumber(s.policy)));
  p->set_k(s.k);
  p->set_n_init(s.n_init);
  p->set_n_local(s.n_local);
  p->set_theta(s.theta);
  p->set_chunk_size(s.chunk_size);
}

absl::StatusOr<params::SelectionOptions> SelectionFromProto(const v1::SelectionParams& p,
                                                            params::SelectionOptions s) {
  absl::StatusOr<std::optional<params::SelectionPolicyKind>> policy =
      SelectionPolicyFromNumber(p.policy());
  if (!policy.ok()) return policy.status();
  if (policy->has_value()) s.policy = **policy;
  if (p.has_k()) s.k = p.k();
  if (p.has_n_init()) s.n_init = p.n_init();
  if (p.has_n_local()) s.n_local = p.n_local();
  if (p.has_theta()) s.theta = p.theta();
  if (p.has_chunk_size()) s.chunk_size = p.chunk_size();
  return s;
}

params::SamplingParams SamplingFromProto(const ::tokenselect::v1::SamplingParams& p) {
  params::SamplingParams s;
  if (p.has_temperature()) s.temperature = p.temperature();
  if (p.has_top_k()) s.top_k = p.top_k();
  if (p.has_top_p()) s.top_p = p.top_p();
  if (p.has_min_p()) s.min_p = p.min_p();
  if (p.has_repetition_penalty()) s.repetition_penalty = p.repetition_penalty();
  if (p.has_frequency_penalty()) s.frequency_penalty = p.frequency_penalty();
  if (p.has_presence_penalty()) s.presence_penalty = p.presence_penalty();
  if (p.has_seed()) s.seed = p.seed();
  if (p.has_max_new_tokens()) s.max_new_tokens = p.max_new_tokens();
  s.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.ignore_eos = p.ignore_eos();
  s.stop.assign(p.stop().begin(), p.stop().end());
  s.include_stop_str_in_output = p.include_stop_str_in_output();
  s.logprobs = p.logprobs();
  s.top_logprobs = p.top_logprobs();
  return s;
}

}  // namespace tokenselect::rpc
