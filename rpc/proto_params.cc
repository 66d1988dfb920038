#include "rpc/proto_params.h"

namespace tokenselect::rpc {

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
