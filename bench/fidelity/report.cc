#include "bench/fidelity/report.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace tokenselect::bench {
namespace {

const char kRule[] =
    "  ------------------------------------------------------------------------------\n";

std::string LayerHeader() {
  return absl::StrFormat("  %-9s %7s %10s %10s %10s %10s %10s %10s %10s\n", "layer", "steps",
                         "err_mean", "err_max", "err_true", "cov_mean", "cov_min", "attended",
                         "cached");
}

std::string LayerRow(const std::string& label, const LayerFidelity& l) {
  return absl::StrFormat("  %-9s %7d %10.5f %10.5f %10.5f %10.5f %10.5f %10.1f %10.1f\n", label,
                         l.samples, l.error_mean, l.error_max, l.error_true_mean, l.coverage_mean,
                         l.coverage_min, l.attended_mean, l.cached_tokens_mean);
}

std::string LayerBlock(const std::string& title, const std::vector<LayerFidelity>& layers) {
  std::string out = absl::StrCat("  ", title, "\n", LayerHeader());
  for (const LayerFidelity& l : layers) absl::StrAppend(&out, LayerRow(absl::StrCat(l.layer), l));
  absl::StrAppend(&out, LayerRow("mean", MeanOverLayers(layers)));
  return out;
}

nlohmann::json LayerJson(const LayerFidelity& l) {
  return {{"layer", l.layer},
          {"samples", l.samples},
          {"error_mean", l.error_mean},
          {"error_max", l.error_max},
          {"error_true_mean", l.error_true_mean},
          {"coverage_mean", l.coverage_mean},
          {"coverage_min", l.coverage_min},
          {"attended_mean", l.attended_mean},
          {"cached_tokens_mean", l.cached_tokens_mean}};
}

nlohmann::json LayersJson(const std::vector<LayerFidelity>& layers) {
  nlohmann::json out = nlohmann::json::array();
  for (const LayerFidelity& l : layers) out.push_back(LayerJson(l));
  return out;
}

}  // namespace

std::string FormatReport(const FidelityReport& report) {
  const FidelityOptions& o = report.options;
  const engine::SelectionOptions& s = o.selection;
  std::string out = absl::StrFormat(
      "fidelity: prompt %d tokens, %d layers, budget n_init %d + k %d + n_local %d, chunk %d, "
      "theta %.3f\n  probe: %d decode steps%s; continuation %d tokens; policies' KV cache %s%s; "
      "%.1f s\n",
      report.prompt_tokens, report.num_layers, s.n_init, s.k, s.n_local, s.chunk_size, s.theta,
      o.decode_steps, o.probe_last_prefill_chunk ? " + last prefill chunk" : "",
      o.continuation_tokens, engine::KvCacheDTypeName(o.kv_dtype),
      o.kv_dtype == engine::KvCacheDType::kFP8E4M3 ? " (dense reference unquantized)" : "",
      report.seconds);
  absl::StrAppend(&out, "  dense continuation: ", absl::StrJoin(report.dense_tokens, " "), "\n");
  for (const PolicyFidelity& p : report.policies) {
    absl::StrAppend(&out, "\n== ", p.policy, " ==\n");
    absl::StrAppend(&out, LayerBlock("decode steps (teacher-forced on dense):", p.decode_layers));
    if (!p.prefill_layers.empty()) {
      absl::StrAppend(&out, LayerBlock("last prefill chunk:", p.prefill_layers));
    }
    absl::StrAppend(&out, kRule);
    absl::StrAppend(
        &out, absl::StrFormat("  KL(dense||policy) nats: end of prompt %.6g, mean %.6g, "
                              "max %.6g over %d positions\n",
                              p.kl.empty() ? 0.0 : p.kl[0], p.kl_mean, p.kl_max, p.kl.size()));
    absl::StrAppend(
        &out, absl::StrFormat(
                  "  greedy agreement %.1f%%, first divergence %s; selection cache "
                  "%d hits / %d lookups\n",
                  100.0 * p.agreement,
                  p.first_divergence < 0 ? std::string("none") : absl::StrCat(p.first_divergence),
                  p.cache.hits, p.cache.lookups()));
  }
  absl::StrAppend(&out, "\n== summary (means over layers) ==\n");
  absl::StrAppend(
      &out, absl::StrFormat("  %-16s %9s %9s %9s %9s %9s %9s %9s %9s %7s %5s\n", "policy",
                            "dec_err", "dec_errT", "dec_cov", "pre_err", "pre_errT", "pre_cov",
                            "KL_end", "KL_mean", "agree%", "div@"));
  for (const PolicyFidelity& p : report.policies) {
    const LayerFidelity d = MeanOverLayers(p.decode_layers);
    const LayerFidelity f = MeanOverLayers(p.prefill_layers);
    absl::StrAppend(
        &out,
        absl::StrFormat("  %-16s %9.5f %9.5f %9.5f %9.5f %9.5f %9.5f %9.4g %9.4g %7.1f %5d\n",
                        p.policy, d.error_mean, d.error_true_mean, d.coverage_mean, f.error_mean,
                        f.error_true_mean, f.coverage_mean, p.kl.empty() ? 0.0 : p.kl[0], p.kl_mean,
                        100.0 * p.agreement, p.first_divergence));
  }
  return out;
}

std::string ReportToJson(const FidelityReport& report) {
  const FidelityOptions& o = report.options;
  nlohmann::json j;
  j["prompt_tokens"] = report.prompt_tokens;
  j["num_layers"] = report.num_layers;
  j["seconds"] = report.seconds;
  j["options"] = {{"n_init", o.selection.n_init},
                  {"k", o.selection.k},
                  {"n_local", o.selection.n_local},
                  {"chunk_size", o.selection.chunk_size},
                  {"theta", o.selection.theta},
                  {"decode_steps", o.decode_steps},
                  {"continuation_tokens", o.continuation_tokens},
                  {"probe_last_prefill_chunk", o.probe_last_prefill_chunk},
                  {"kv_dtype", engine::KvCacheDTypeName(o.kv_dtype)}};
  j["dense_tokens"] = report.dense_tokens;
  nlohmann::json policies = nlohmann::json::array();
  for (const PolicyFidelity& p : report.policies) {
    policies.push_back({{"policy", p.policy},
                        {"decode_layers", LayersJson(p.decode_layers)},
                        {"decode_mean", LayerJson(MeanOverLayers(p.decode_layers))},
                        {"prefill_layers", LayersJson(p.prefill_layers)},
                        {"prefill_mean", LayerJson(MeanOverLayers(p.prefill_layers))},
                        {"kl", p.kl},
                        {"kl_mean", p.kl_mean},
                        {"kl_max", p.kl_max},
                        {"tokens", p.tokens},
                        {"agreement", p.agreement},
                        {"first_divergence", p.first_divergence},
                        {"cache_hits", p.cache.hits},
                        {"cache_lookups", p.cache.lookups()}});
  }
  j["policies"] = policies;
  return j.dump(2) + "\n";
}

}  // namespace tokenselect::bench
