#include "bench/fidelity/fidelity.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "bench/fidelity/probe_attention.h"
#include "common/clock.h"
#include "common/status.h"
#include "engine/kvcache/page_pool.h"
#include "engine/kvcache/token_table.h"
#include "engine/selection/selection_attention.h"

namespace tokenselect::bench {
namespace {

using engine::LogitsRows;

// One forward trajectory: num_positions next-token distributions (log-softmax, [vocab] each)
// and the greedy token of each.
struct Trajectory {
  std::vector<std::vector<double>> log_probs;
  std::vector<int32_t> argmax;
};

// Called before every forward step with whether it is the prompt's last prefill chunk and, for
// decode steps, the 1-based decode step number (0 for prefill).
using StepHook = std::function<void(bool last_prefill_chunk, int64_t decode_step)>;

std::vector<double> LogSoftmax(const std::vector<float>& logits) {
  double max_logit = -INFINITY;
  for (float x : logits) max_logit = std::max(max_logit, static_cast<double>(x));
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max_logit);
  const double log_z = max_logit + std::log(sum);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - log_z;
  return out;
}

// Lowest index among the largest values.
int32_t ArgMax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Runs the prompt in chunks of chunk_size, then num_positions - 1 decode steps feeding
// forced[t] when `forced` is not empty, else the greedy token.
absl::StatusOr<Trajectory> RunTrajectory(const engine::Model& model, engine::PagePool* pool,
                                         absl::Span<const int32_t> prompt, int64_t chunk_size,
                                         engine::AttentionListProvider* provider,
                                         absl::Span<const int32_t> forced, int64_t num_positions,
                                         const StepHook& hook) {
  engine::TokenTable table(pool, "fidelity");
  const int64_t n = static_cast<int64_t>(prompt.size());
  RETURN_IF_ERROR(table.Reserve(n + num_positions));
  engine::ForwardWorkspace workspace;
  std::vector<float> logits;
  engine::ForwardRequest request;
  request.table = &table;
  request.attention = provider;
  for (int64_t begin = 0; begin < n; begin += chunk_size) {
    const int64_t end = std::min(n, begin + chunk_size);
    request.tokens = prompt.subspan(begin, end - begin);
    request.logits = end == n ? LogitsRows::kLast : LogitsRows::kNone;
    if (hook) hook(end == n, 0);
    RETURN_IF_ERROR(model.Forward(request, &workspace, &logits));
  }
  Trajectory t;
  request.logits = LogitsRows::kLast;
  for (int64_t pos = 0; pos < num_positions; ++pos) {
    t.log_probs.push_back(LogSoftmax(logits));
    t.argmax.push_back(ArgMax(logits));
    if (pos + 1 == num_positions) break;
    const int32_t next = forced.empty() ? t.argmax.back() : forced[pos];
    request.tokens = absl::MakeConstSpan(&next, 1);
    if (hook) hook(false, pos + 1);
    RETURN_IF_ERROR(model.Forward(request, &workspace, &logits));
  }
  return t;
}

// KL(p || q) of two log-probability vectors, in nats.
double Kl(const std::vector<double>& log_p, const std::vector<double>& log_q) {
  double kl = 0;
  for (size_t i = 0; i < log_p.size(); ++i) {
    const double p = std::exp(log_p[i]);
    if (p > 0) kl += p * (log_p[i] - log_q[i]);
  }
  return kl;
}

absl::Status Validate(absl::Span<const int32_t> prompt, const FidelityOptions& options) {
  if (prompt.empty()) return absl::InvalidArgumentError("fidelity: the prompt is empty");
  if (options.decode_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fidelity: decode_steps must be >= 0, got ", options.decode_steps));
  }
  if (options.continuation_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fidelity: continuation_tokens must be >= 1, got ", options.continuation_tokens));
  }
  RETURN_IF_ERROR(engine::ValidateSelectionOptions(options.selection));
  for (const std::string& name : options.policies) {
    RETURN_IF_ERROR(engine::ParsePolicy(name).status());
  }
  return absl::OkStatus();
}

// (b) and (c) for one policy against the dense trajectory.
absl::Status ComparePolicy(const engine::Model& model, engine::PagePool* pool,
                           absl::Span<const int32_t> prompt, const FidelityOptions& options,
                           const Trajectory& dense, PolicyFidelity* out) {
  const int64_t positions = options.continuation_tokens;
  const absl::Span<const int32_t> dense_tokens(dense.argmax.data(), positions);
  engine::SelectionOptions selection = options.selection;
  ASSIGN_OR_RETURN(selection.policy, engine::ParsePolicy(out->policy));
  const int64_t layers = model.config().num_layers;

  // (b): teacher-forced on the dense tokens.
  ASSIGN_OR_RETURN(std::unique_ptr<engine::SelectionAttention> forced_attention,
                   engine::SelectionAttention::Create(selection, layers));
  ASSIGN_OR_RETURN(Trajectory forced,
                   RunTrajectory(model, pool, prompt, selection.chunk_size, forced_attention.get(),
                                 dense_tokens, positions, nullptr));
  for (int64_t t = 0; t < positions; ++t) {
    const double kl = Kl(dense.log_probs[t], forced.log_probs[t]);
    out->kl.push_back(kl);
    out->kl_mean += kl / static_cast<double>(positions);
    out->kl_max = std::max(out->kl_max, kl);
  }

  // (c): the free greedy run equals the forced one up to its first disagreement.
  int64_t first = -1;
  for (int64_t t = 0; t < positions && first < 0; ++t) {
    if (forced.argmax[t] != dense_tokens[t]) first = t;
  }
  out->cache = forced_attention->cache().total_counters();
  if (first < 0) {
    out->tokens = forced.argmax;
  } else {
    ASSIGN_OR_RETURN(std::unique_ptr<engine::SelectionAttention> free_attention,
                     engine::SelectionAttention::Create(selection, layers));
    ASSIGN_OR_RETURN(Trajectory free_run,
                     RunTrajectory(model, pool, prompt, selection.chunk_size, free_attention.get(),
                                   {}, positions, nullptr));
    out->tokens = free_run.argmax;
    out->cache = free_attention->cache().total_counters();
  }
  int64_t equal = 0;
  out->first_divergence = -1;
  for (int64_t t = 0; t < positions; ++t) {
    if (out->tokens[t] == dense_tokens[t]) {
      ++equal;
    } else if (out->first_divergence < 0) {
      out->first_divergence = t;
    }
  }
  out->agreement = static_cast<double>(equal) / static_cast<double>(positions);
  return absl::OkStatus();
}

}  // namespace

LayerFidelity MeanOverLayers(const std::vector<LayerFidelity>& layers) {
  LayerFidelity m;
  m.layer = -1;
  if (layers.empty()) return m;
  const double n = static_cast<double>(layers.size());
  m.coverage_min = 1;
  for (const LayerFidelity& l : layers) {
    m.samples += l.samples;
    m.error_mean += l.error_mean / n;
    m.error_max = std::max(m.error_max, l.error_max);
    m.error_true_mean += l.error_true_mean / n;
    m.coverage_mean += l.coverage_mean / n;
    m.coverage_min = std::min(m.coverage_min, l.coverage_min);
    m.attended_mean += l.attended_mean / n;
    m.cached_tokens_mean += l.cached_tokens_mean / n;
  }
  return m;
}

std::vector<std::string> AllPolicyNames() {
  std::vector<std::string> names;
  for (int i = 0;; ++i) {
    const absl::string_view name = engine::PolicyName(static_cast<engine::SelectionPolicyKind>(i));
    if (name == "unknown") break;
    names.emplace_back(name);
  }
  return names;
}

absl::StatusOr<FidelityReport> RunFidelity(const engine::Model& model,
                                           absl::Span<const int32_t> prompt,
                                           const FidelityOptions& options) {
  RETURN_IF_ERROR(Validate(prompt, options));
  const common::Stopwatch watch;
  const engine::ModelConfig& config = model.config();
  const int64_t n = static_cast<int64_t>(prompt.size());
  // The dense run goes on long enough for both the probe and the continuation.
  const int64_t dense_positions = std::max(options.continuation_tokens, options.decode_steps + 1);
  const int64_t pages = (n + dense_positions + options.page_size - 1) / options.page_size + 1;
  ASSIGN_OR_RETURN(std::unique_ptr<engine::PagePool> pool,
                   engine::PagePool::Create(model.KvCacheOptions(pages, options.page_size)));

  // (a) and the dense reference: one dense run with the probe.
  // FP8: the policies' model (same weights, FP8 cache) and its scales for the probe.
  std::unique_ptr<engine::Model> fp8_model;
  if (options.kv_dtype == engine::KvCacheDType::kFP8E4M3) {
    if (model.options().kv_dtype == engine::KvCacheDType::kFP8E4M3) {
      return absl::InvalidArgumentError(
          "fidelity: kv_dtype fp8 needs a reference model with an unquantized cache");
    }
    engine::ModelOptions fp8_options = model.options();
    fp8_options.kv_dtype = engine::KvCacheDType::kFP8E4M3;
    ASSIGN_OR_RETURN(fp8_model, engine::Model::Create(config, model.weights(), fp8_options));
  }
  const engine::Model& policy_model = fp8_model != nullptr ? *fp8_model : model;
  ASSIGN_OR_RETURN(std::unique_ptr<ProbeAttention> probe,
                   ProbeAttention::Create(options.policies, options.selection, config.num_layers,
                                          policy_model.kv_scales()));
  const StepHook hook = [&](bool last_prefill_chunk, int64_t decode_step) {
    using Phase = ProbeAttention::Phase;
    if (last_prefill_chunk && options.probe_last_prefill_chunk) {
      probe->set_phase(Phase::kPrefill);
    } else if (decode_step >= 1 && decode_step <= options.decode_steps) {
      probe->set_phase(Phase::kDecode);
    } else if (decode_step == 0) {
      probe->set_phase(Phase::kFeed);  // earlier prefill chunks: keep the policies in step
    } else {
      probe->set_phase(Phase::kOff);
    }
  };
  ASSIGN_OR_RETURN(Trajectory dense,
                   RunTrajectory(model, pool.get(), prompt, options.selection.chunk_size,
                                 probe.get(), {}, dense_positions, hook));

  FidelityReport report;
  report.options = options;
  report.prompt_tokens = n;
  report.num_layers = config.num_layers;
  report.dense_tokens.assign(dense.argmax.begin(),
                             dense.argmax.begin() + options.continuation_tokens);
  for (size_t i = 0; i < options.policies.size(); ++i) {
    PolicyFidelity p;
    p.policy = options.policies[i];
    p.decode_layers = probe->Results(i, ProbeAttention::Phase::kDecode);
    if (options.probe_last_prefill_chunk) {
      p.prefill_layers = probe->Results(i, ProbeAttention::Phase::kPrefill);
    }
    RETURN_IF_ERROR(ComparePolicy(policy_model, pool.get(), prompt, options, dense, &p));
    report.policies.push_back(std::move(p));
  }
  report.seconds = watch.ElapsedSeconds();
  return report;
}

}  // namespace tokenselect::bench
