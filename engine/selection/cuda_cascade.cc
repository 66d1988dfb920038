#include "engine/selection/cuda_cascade.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/selection/cascade_cache.h"
#include "kernels/cuda/cuda_status.h"

namespace tokenselect::engine {

namespace kc = kernels::cuda;
using kc::CudaStatus;

CudaCascade::CudaCascade(const SelectionOptions& options, int64_t num_layers, int64_t max_tokens)
    : options_(options), num_layers_(num_layers), max_tokens_(max_tokens) {}

absl::StatusOr<std::unique_ptr<CudaCascade>> CudaCascade::Create(const SelectionOptions& options,
                                                                 int64_t num_layers,
                                                                 int64_t max_tokens) {
  const int64_t subs = options.baselines.cascade_sub_caches;
  if (subs < 1 || subs > kc::kMaxCascadeSubCaches || num_layers < 1 || max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU cascade: baselines.cascade_sub_caches must be in [1, ",
                     kc::kMaxCascadeSubCaches, "], got ", subs));
  }
  std::unique_ptr<CudaCascade> c(new CudaCascade(options, num_layers, max_tokens));
  c->capacities_ = CascadeCache::EqualCapacities(options.k + options.n_local, subs);
  for (int64_t cap : c->capacities_) c->total_ += cap;
  c->next_.assign(static_cast<size_t>(num_layers), -1);
  RETURN_IF_ERROR(c->arena_.Get(num_layers * c->total_, &c->tokens_));
  RETURN_IF_ERROR(c->arena_.Get(num_layers * c->total_, &c->ema_));
  RETURN_IF_ERROR(c->arena_.Get(num_layers * subs * 3, &c->meta_));
  RETURN_IF_ERROR(c->arena_.Get(max_tokens - options.n_init, &c->list_slots_));
  RETURN_IF_ERROR(c->arena_.Get(1, &c->list_length_));
  return c;
}

kc::CascadeLayer CudaCascade::Layer(int64_t layer) const {
  kc::CascadeLayer l;
  l.tokens = tokens_ + layer * total_;
  l.ema = ema_ + layer * total_;
  l.num_sub_caches = static_cast<int>(capacities_.size());
  l.meta = meta_ + layer * l.num_sub_caches * 3;
  for (int i = 0; i < l.num_sub_caches; ++i) l.capacity[i] = static_cast<int32_t>(capacities_[i]);
  return l;
}

bool CudaCascade::Restarts(int64_t layer, int64_t num_tokens) const {
  const int64_t next = next_[static_cast<size_t>(layer)];
  return next < 0 || next > num_tokens;
}

int64_t CudaCascade::FirstNew(int64_t layer, int64_t num_tokens) const {
  const int64_t next = Restarts(layer, num_tokens) ? 0 : next_[static_cast<size_t>(layer)];
  return std::max(next, options_.n_init);
}

int64_t CudaCascade::ListBound(int64_t layer, int64_t num_tokens) const {
  const int64_t next = FirstNew(layer, num_tokens);
  // Held tokens were pushed: at most next - n_init of them, and at most the capacity.
  return std::min(total_, next - options_.n_init) + (num_tokens - next);
}

absl::StatusOr<CudaCascade::List> CudaCascade::Begin(int64_t layer, int64_t num_tokens,
                                                     const int32_t* token_slots,
                                                     cudaStream_t stream) {
  if (layer < 0 || layer >= num_layers_ || num_tokens > max_tokens_ ||
      num_tokens <= options_.n_init + options_.k + options_.n_local) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU cascade: layer ", layer, " with ", num_tokens, " cached tokens"));
  }
  const int64_t subs = static_cast<int64_t>(capacities_.size());
  if (Restarts(layer, num_tokens)) {  // first selection, or a rollback: the cache restarts
    RETURN_IF_ERROR(
        CudaStatus(cudaMemsetAsync(meta_ + layer * subs * 3, 0, subs * 3 * sizeof(int64_t), stream),
                   "cascade reset"));
  }
  List list;
  list.bound = ListBound(layer, num_tokens);
  const int64_t next = FirstNew(layer, num_tokens);
  next_[static_cast<size_t>(layer)] = next;
  kc::CascadeGatherParams p;
  p.layer = Layer(layer);
  p.list_slots = list_slots_;
  p.list_length = list_length_;
  p.token_slots = token_slots;
  p.next_token = next;
  p.num_tokens = num_tokens;
  RETURN_IF_ERROR(CudaStatus(kc::CascadeGather(p, stream), "CascadeGather"));
  list.slots = list_slots_;
  list.length = list_length_;
  return list;
}

absl::Status CudaCascade::Finish(int64_t layer, int64_t num_tokens, const float* vote,
                                 int32_t* selected, int32_t* num_selected, cudaStream_t stream) {
  int64_t& next = next_[static_cast<size_t>(layer)];
  kc::CascadeUpdateParams p;
  p.layer = Layer(layer);
  p.selected = selected;
  p.num_selected = num_selected;
  p.vote = vote;
  p.decay = static_cast<float>(options_.baselines.cascade_ema_decay);
  p.next_token = next;
  p.num_tokens = num_tokens;
  p.n_init = options_.n_init;
  RETURN_IF_ERROR(CudaStatus(kc::CascadeUpdate(p, stream), "CascadeUpdate"));
  next = std::max(next, num_tokens);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SelectionLayerState>> CudaCascade::Export(cudaStream_t stream) const {
  const size_t subs = capacities_.size();
  std::vector<int32_t> tokens(static_cast<size_t>(num_layers_ * total_));
  std::vector<float> ema(tokens.size());
  std::vector<int64_t> meta(static_cast<size_t>(num_layers_) * subs * 3);
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(tokens.data(), tokens_, tokens.size() * 4, cudaMemcpyDeviceToHost, stream),
      "cascade copy"));
  RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(ema.data(), ema_, ema.size() * 4, cudaMemcpyDeviceToHost, stream),
                 "cascade copy"));
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(meta.data(), meta_, meta.size() * 8, cudaMemcpyDeviceToHost, stream),
      "cascade copy"));
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "cascade copy"));
  std::vector<SelectionLayerState> states(static_cast<size_t>(num_layers_));
  for (int64_t l = 0; l < num_layers_; ++l) {
    const int64_t next = next_[static_cast<size_t>(l)];
    if (next < 0) continue;  // never selected: the CPU's unconfigured cache
    std::vector<std::deque<CascadeCache::Entry>> entries(subs);
    std::vector<int64_t> offers(subs);
    int64_t base = l * total_;
    for (size_t i = 0; i < subs; ++i) {
      const int64_t* m = meta.data() + (static_cast<size_t>(l) * subs + i) * 3;
      for (int64_t q = 0; q < m[1]; ++q) {
        const size_t at = static_cast<size_t>(base + (m[0] + q) % capacities_[i]);
        entries[i].push_back(CascadeCache::Entry{tokens[at], ema[at]});
      }
      offers[i] = m[2];
      base += capacities_[i];
    }
    states[static_cast<size_t>(l)].cascade.Restore(capacities_, std::move(entries), offers, next);
  }
  return states;
}

absl::Status CudaCascade::Import(const std::vector<SelectionLayerState>& states,
                                 cudaStream_t stream) {
  const size_t subs = capacities_.size();
  for (size_t l = 0; l < states.size(); ++l) {
    const CascadeCache& c = states[l].cascade;
    if (c.capacities() != capacities_) continue;
    if (c.next_token > max_tokens_) {
      return absl::InvalidArgumentError(
          absl::StrCat("final.selection_states[", l, "]: the cascade has pushed ", c.next_token,
                       " tokens; the request has room for ", max_tokens_));
    }
    // The kernels rely on what a cache built by pushes holds: every sub-cache within its
    // capacity, and the tokens ascending from the last sub-cache's oldest to the first's newest,
    // all below next_token.
    int64_t last = -1;
    for (size_t i = subs; i-- > 0;) {
      const std::deque<CascadeCache::Entry>& sub = c.sub_cache(static_cast<int64_t>(i));
      bool ascending = true;
      for (const CascadeCache::Entry& e : sub) {
        ascending = ascending && e.token > last;
        last = e.token;
      }
      if (static_cast<int64_t>(sub.size()) > capacities_[i] || !ascending || last >= c.next_token) {
        return absl::InvalidArgumentError(absl::StrCat(
            "final.selection_states[", l, "]: cascade sub-cache ", i,
            " is over its capacity or its tokens are out of order (or not below next_token)"));
      }
    }
  }
  // Every layer's rings (each sub-cache's oldest entry at its ring's start), as Export reads
  // them; a dropped layer's are left empty (its next selection restarts it).
  std::vector<int32_t> tokens(static_cast<size_t>(num_layers_ * total_));
  std::vector<float> ema(tokens.size());
  std::vector<int64_t> meta(static_cast<size_t>(num_layers_) * subs * 3);
  for (size_t l = 0; l < next_.size(); ++l) {
    const bool kept = l < states.size() && states[l].cascade.capacities() == capacities_;
    next_[l] = kept ? states[l].cascade.next_token : -1;
    if (!kept) continue;
    const CascadeCache& c = states[l].cascade;
    size_t base = l * static_cast<size_t>(total_);
    for (size_t i = 0; i < subs; ++i) {
      const std::deque<CascadeCache::Entry>& sub = c.sub_cache(static_cast<int64_t>(i));
      for (size_t q = 0; q < sub.size(); ++q) {
        tokens[base + q] = sub[q].token;
        ema[base + q] = sub[q].ema;
      }
      int64_t* m = meta.data() + (l * subs + i) * 3;
      m[1] = static_cast<int64_t>(sub.size());
      m[2] = c.offers(static_cast<int64_t>(i));
      base += static_cast<size_t>(capacities_[i]);
    }
  }
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(tokens_, tokens.data(), tokens.size() * 4, cudaMemcpyHostToDevice, stream),
      "cascade copy"));
  RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(ema_, ema.data(), ema.size() * 4, cudaMemcpyHostToDevice, stream),
                 "cascade copy"));
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(meta_, meta.data(), meta.size() * 8, cudaMemcpyHostToDevice, stream),
      "cascade copy"));
  // The host vectors go away when this returns.
  return CudaStatus(cudaStreamSynchronize(stream), "cascade copy");
}

}  // namespace tokenselect::engine
