#include "tests/gpu/cuda_selection_fixture.h"

namespace tokenselect::engine::gpu_selection_test {

absl::Status ObserveOnCpu(const SelectionPolicy& policy, const CudaSelectionTest& t, int64_t layer,
                          int64_t cached, const std::vector<float>& q, int64_t m,
                          SelectionLayerState* state) {
  const ModelConfig& config = t.config();
  std::vector<int32_t> positions(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) positions[i] = static_cast<int32_t>(cached + i);
  ChunkObservation obs;
  obs.layer = layer;
  obs.first_token = cached;
  obs.num_new = m;
  obs.q = q.data();
  obs.num_heads = config.num_heads;
  obs.num_kv_heads = config.num_kv_heads;
  obs.head_dim = config.head_dim;
  obs.k_cache = t.keys().data();
  obs.slots = t.slots().data() + cached;
  obs.num_slots = t.num_slots();
  obs.positions = positions.data();
  obs.inv_freq = t.inv_freq().data();
  obs.scale = 1.0f / std::sqrt(static_cast<float>(config.head_dim));
  return policy.ObserveChunk(obs, state);
}

StatefulRun RunStatefulSteps(CudaSelectionTest* t, const SelectionOptions& opt, int64_t chunk,
                             int64_t prompt, int64_t steps, int64_t total, int64_t tolerance,
                             std::mt19937* rng, float drift) {
  const ModelConfig& config = t->config();
  StatefulRun run;
  SelectionCache cache(config.num_layers, opt.theta);
  auto provider = CudaSelectionAttention::Create(opt, config, total, chunk);
  EXPECT_TRUE(provider.ok()) << provider.status();
  if (!provider.ok()) return run;
  run.provider = std::move(*provider);
  auto policy = CreateSelectionPolicy(opt);
  EXPECT_TRUE(policy.ok());
  run.cpu_state.resize(static_cast<size_t>(config.num_layers));
  auto cpu_step = [&](int64_t layer, int64_t cached, const std::vector<float>& q, int64_t m) {
    std::vector<float> sel(static_cast<size_t>(config.num_heads * config.head_dim));
    EXPECT_TRUE(BuildSelectionQuery(q.data(), m, config.num_heads, config.head_dim, opt.n_local,
                                    t->inv_freq().data(), sel.data())
                    .ok());
    SelectionInput in = t->CpuInput(sel, cached);
    in.state = &run.cpu_state[static_cast<size_t>(layer)];
    SelectionResult result;
    SelectionScratch scratch;
    if (m == 1 && (*policy)->uses_selection_cache()) {
      EXPECT_TRUE(cache.Select(layer, **policy, in, &result, &scratch).ok());
    } else {
      EXPECT_TRUE((*policy)->Select(in, &result, &scratch).ok());
    }
    EXPECT_TRUE(ObserveOnCpu(**policy, *t, layer, cached, q, m, in.state).ok());
    AttentionList cpu;
    EXPECT_TRUE(BuildAttentionList(result.tokens, t->slots(), cached, m, &cpu).ok());
    return cpu;
  };
  std::vector<std::vector<float>> decode_q(static_cast<size_t>(config.num_layers));
  std::normal_distribution<float> normal(0.0f, std::max(drift, 1e-6f));
  for (int64_t cached = 0; cached < prompt + steps;) {
    const int64_t m = cached < prompt ? std::min(chunk, prompt - cached) : 1;
    for (int64_t layer = 0; layer < config.num_layers; ++layer) {
      std::vector<float> q;
      std::vector<float>& last = decode_q[static_cast<size_t>(layer)];
      if (m == 1 && drift > 0.0f && !last.empty()) {
        const float step = (cached - prompt) % 5 == 4 ? 6.0f : 1.0f;
        for (float& x : last) x = RoundBf16(x + step * normal(*rng));
        q = last;
      } else {
        q = t->RandomQ(m, rng);
        if (m == 1) last = q;
      }
      const AttentionList gpu = t->RunGpu(run.provider.get(), layer, cached, q, m);
      const AttentionList cpu = cpu_step(layer, cached, q, m);
      const int64_t mismatches = CudaSelectionTest::Mismatches(gpu, cpu);
      EXPECT_LE(mismatches, tolerance) << "cached " << cached << " layer " << layer;
      run.flips += mismatches > 0;
      run.selecting += cached > opt.n_init + opt.k + opt.n_local;
    }
    cached += m;
  }
  run.cpu_cache = cache.total_counters();
  return run;
}

// A second provider made from the first's exported state (a decode worker's) selects as the
// first at the next step, and exports the same state.
void ExpectStateCarriesOver(CudaSelectionTest* t, const SelectionOptions& opt,
                            CudaSelectionAttention* first, int64_t total, int64_t chunk,
                            int64_t cached, std::mt19937* rng) {
  auto exported = first->ExportLayerStates(nullptr);
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto second = CudaSelectionAttention::Create(opt, t->config(), total, chunk);
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE((*second)->ImportLayerStates(*exported, nullptr).ok());
  for (int64_t layer = 0; layer < t->config().num_layers; ++layer) {
    const std::vector<float> q = t->RandomQ(1, rng);
    const AttentionList a = t->RunGpu(first, layer, cached, q, 1);
    const AttentionList b = t->RunGpu(second->get(), layer, cached, q, 1);
    EXPECT_EQ(a.kv_slots, b.kv_slots) << "layer " << layer;
    EXPECT_EQ(a.kv_positions, b.kv_positions);
  }
  auto again = (*second)->ExportLayerStates(nullptr);
  ASSERT_TRUE(again.ok());
  auto first_again = first->ExportLayerStates(nullptr);
  ASSERT_TRUE(first_again.ok());
  ASSERT_EQ(again->size(), first_again->size());
  for (size_t layer = 0; layer < again->size(); ++layer) {
    EXPECT_EQ((*again)[layer].received, (*first_again)[layer].received) << "layer " << layer;
    EXPECT_TRUE((*again)[layer].spans == (*first_again)[layer].spans) << "layer " << layer;
    EXPECT_EQ(CascadeDifference((*again)[layer].cascade, (*first_again)[layer].cascade, 0.0), "")
        << "layer " << layer;
  }
}

std::string CascadeDifference(const CascadeCache& got, const CascadeCache& want, double tolerance) {
  if (got.capacities() != want.capacities()) return "capacities";
  if (got.next_token != want.next_token) {
    return "next_token " + std::to_string(got.next_token) + " vs " +
           std::to_string(want.next_token);
  }
  for (int64_t i = 0; i < got.num_sub_caches(); ++i) {
    const std::string where = "sub-cache " + std::to_string(i);
    if (got.offers(i) != want.offers(i)) return where + ": offers";
    const auto& a = got.sub_cache(i);
    const auto& b = want.sub_cache(i);
    if (a.size() != b.size()) {
      return where + ": " + std::to_string(a.size()) + " vs " + std::to_string(b.size()) +
             " entries";
    }
    for (size_t q = 0; q < a.size(); ++q) {
      if (a[q].token != b[q].token) {
        return where + " entry " + std::to_string(q) + ": token " + std::to_string(a[q].token) +
               " vs " + std::to_string(b[q].token);
      }
      const bool close = tolerance == 0.0 ? a[q].ema == b[q].ema
                                          : std::fabs(a[q].ema - b[q].ema) <=
                                                tolerance * (1e-3 + std::fabs(b[q].ema));
      if (!close) {
        return where + " entry " + std::to_string(q) + ": ema " + std::to_string(a[q].ema) +
               " vs " + std::to_string(b[q].ema);
      }
    }
  }
  return "";
}

// Worst |gpu - cpu| / (1 + cpu) of the exported received attention against the CPU policy's.
double WorstReceived(const std::vector<SelectionLayerState>& gpu,
                     const std::vector<SelectionLayerState>& cpu, int64_t tokens) {
  double worst = 0.0;
  EXPECT_EQ(gpu.size(), cpu.size());
  for (size_t layer = 0; layer < std::min(gpu.size(), cpu.size()); ++layer) {
    const std::vector<float>& got = gpu[layer].received;
    const std::vector<float>& want = cpu[layer].received;
    EXPECT_EQ(got.size(), want.size());
    EXPECT_EQ(static_cast<int64_t>(got.size()), tokens);
    for (size_t j = 0; j < std::min(got.size(), want.size()); ++j) {
      worst = std::max(worst, std::fabs(got[j] - want[j]) / (1.0 + std::fabs(want[j])));
    }
  }
  return worst;
}

}  // namespace tokenselect::engine::gpu_selection_test
