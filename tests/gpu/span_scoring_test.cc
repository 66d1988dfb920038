// Needs a GPU (label gpu): the span index, Quest and InfLLM selection kernels
// (kernels/cuda/span_scoring.h; the received attention and the span detection are in
// chunk_spans_test.cc) against the CPU policies (engine/selection:
// span_policy.cc, quest_policy.cc, infllm_policy.cc through CreateSelectionPolicy). Span indexes
// are built by the real CPU code (DetectSpans on planted chunk attention maps,
// SpanIndex::AppendChunk, plus a decode span, an unindexed gap and an uncovered tail); keys are
// random with planted hot ranges. GQA groups 1, 4, 8, head dims 64 and 128, odd sizes and odd
// KV-head counts. Every output is poisoned (NaN / -1) before the launch and checked fully written.
//
// Tolerance rule. Group scores (span, page, block) are fp32 on the GPU and double on the CPU, so
// they are compared with a relative tolerance; the discrete choice is then checked twice:
//   1. Exactly against a host replay of the CPU policy's rule on the GPU's own (downloaded)
//      scores and votes: the greedy span / page walk and the top-k have no tolerance.
//   2. Against the CPU policy itself: the same tokens, unless the CPU scores hold a near-tie
//      (relative gap < 1e-4) that the replay shows was decided differently; soft-vote top-k
//      differences are allowed only across the threshold within 2e-4 of the k-th vote (as in
//      gpu_selection_test).
#include "kernels/cuda/span_scoring.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "engine/selection/key_scores.h"
#include "engine/selection/layer_state.h"
#include "engine/selection/selected_set.h"
#include "engine/selection/selection_policy.h"
#include "engine/selection/soft_vote.h"
#include "engine/selection/span_detection.h"
#include "engine/selection/span_index.h"
#include "engine/selection/token_list_scores.h"
#include "engine/selection/top_k.h"
#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "tests/gpu/gpu_test_util.h"

namespace tokenselect::kernels::cuda {
namespace {

using gpu_test::DeviceBuffer;

struct Shape {
  int64_t n;
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
};

// Keys (bf16-rounded fp32 and bits), a query and a slot permutation; `hot` token ranges get
// their keys shifted towards their group's mean query direction by `strength`.
struct Problem {
  Shape shape;
  int64_t num_slots = 0;
  std::vector<float> keys;
  std::vector<uint16_t> key_bits;
  std::vector<float> query;
  std::vector<int32_t> slots;
};

Problem MakeProblem(const Shape& s, std::mt19937* rng,
                    const std::vector<std::pair<int64_t, int64_t>>& hot, float strength) {
  Problem p;
  p.shape = s;
  p.num_slots = s.n + 333;
  const int64_t row = s.num_kv_heads * s.head_dim;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  p.query.resize(static_cast<size_t>(s.num_heads * s.head_dim));
  const float q_std = 3.0f / std::sqrt(static_cast<float>(s.head_dim));
  for (float& x : p.query) x = normal(*rng) * q_std;
  p.keys.resize(static_cast<size_t>(p.num_slots * row));
  for (float& x : p.keys) x = normal(*rng);
  std::vector<int32_t> perm(static_cast<size_t>(p.num_slots));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), *rng);
  p.slots.assign(perm.begin(), perm.begin() + s.n);
  // Unit direction per kv head: the normalised sum of its group's queries.
  const int64_t g = s.num_heads / s.num_kv_heads;
  std::vector<float> dir(static_cast<size_t>(row), 0.0f);
  for (int64_t kv = 0; kv < s.num_kv_heads; ++kv) {
    double norm = 0.0;
    for (int64_t e = 0; e < s.head_dim; ++e) {
      float sum = 0.0f;
      for (int64_t gi = 0; gi < g; ++gi) sum += p.query[(kv * g + gi) * s.head_dim + e];
      dir[kv * s.head_dim + e] = sum;
      norm += static_cast<double>(sum) * sum;
    }
    for (int64_t e = 0; e < s.head_dim; ++e) {
      dir[kv * s.head_dim + e] /= static_cast<float>(std::sqrt(norm));
    }
  }
  std::uniform_real_distribution<float> jitter(0.5f, 1.5f);
  for (const auto& [b, e] : hot) {
    for (int64_t t = b; t < std::min(e, s.n); ++t) {
      const float a = strength * jitter(*rng);
      float* k = p.keys.data() + static_cast<int64_t>(p.slots[t]) * row;
      for (int64_t i = 0; i < row; ++i) k[i] += a * dir[i];
    }
  }
  p.key_bits = gpu_test::RoundToBf16(&p.keys);
  return p;
}

engine::SelectionInput CpuInput(const Problem& p, engine::SelectionLayerState* state) {
  engine::SelectionInput in;
  in.query = p.query.data();
  in.num_heads = p.shape.num_heads;
  in.keys.k_cache = p.keys.data();
  in.keys.slots = p.slots.data();
  in.keys.num_tokens = p.shape.n;
  in.keys.num_slots = p.num_slots;
  in.keys.num_kv_heads = p.shape.num_kv_heads;
  in.keys.head_dim = p.shape.head_dim;
  in.state = state;
  return in;
}

engine::SelectionResult CpuSelect(const engine::SelectionOptions& o, const Problem& p,
                                  engine::SelectionLayerState* state) {
  auto policy = engine::CreateSelectionPolicy(o);
  EXPECT_TRUE(policy.ok()) << policy.status();
  engine::SelectionResult r;
  const absl::Status st = (*policy)->Select(CpuInput(p, state), &r);
  EXPECT_TRUE(st.ok()) << st;
  return r;
}

// Device copies of a problem.
struct DeviceProblem {
  explicit DeviceProblem(const Problem& p)
      : keys(p.key_bits), query(p.query), slots(p.slots) {}
  SelectionProblem View(const Problem& p, const engine::SelectionOptions& o) const {
    SelectionProblem v;
    v.query = query.get();
    v.k_cache = reinterpret_cast<const __nv_bfloat16*>(keys.get());
    v.slots = slots.get();
    v.num_tokens = p.shape.n;
    v.num_heads = p.shape.num_heads;
    v.num_kv_heads = p.shape.num_kv_heads;
    v.head_dim = p.shape.head_dim;
    v.scale = o.scale;
    v.n_init = o.n_init;
    v.k = o.k;
    v.n_local = o.n_local;
    return v;
  }
  DeviceBuffer<uint16_t> keys;
  DeviceBuffer<float> query;
  DeviceBuffer<int32_t> slots;
};

// sum_h max_i q_h . K[slot_i], in double, plus the magnitude sum_h max_i sum_e |q_e k_e| that
// bounds its rounding error.
std::pair<double, double> HeadMaxSum(const Problem& p, const std::vector<int32_t>& slots,
                                     float scale) {
  const int64_t d = p.shape.head_dim, g = p.shape.num_heads / p.shape.num_kv_heads;
  double total = 0.0, magnitude = 0.0;
  for (int64_t h = 0; h < p.shape.num_heads; ++h) {
    double best = -INFINITY, best_mag = 0.0;
    for (int32_t slot : slots) {
      const float* k = p.keys.data() + (static_cast<int64_t>(slot) * p.shape.num_kv_heads + h / g) * d;
      double dot = 0.0, mag = 0.0;
      for (int64_t e = 0; e < d; ++e) {
        dot += static_cast<double>(p.query[h * d + e]) * k[e];
        mag += std::fabs(static_cast<double>(p.query[h * d + e]) * k[e]);
      }
      best = std::max(best, scale * dot);
      best_mag = std::max(best_mag, scale * mag);
    }
    total += best;
    magnitude += best_mag;
  }
  return {total, magnitude};
}

// The output buffers of one Quest or InfLLM selection, all poisoned so that an unwritten entry
// shows: selected tokens (3 entries past the capacity), their count, one score per page or
// block, and the workspace (which the kernels must initialise themselves).
struct PoisonedSelection {
  PoisonedSelection(int64_t capacity, int64_t units, size_t workspace_bytes)
      : tokens(static_cast<size_t>(capacity + 3)),
        count(1),
        scores(static_cast<size_t>(std::max<int64_t>(units, 1))),
        workspace(workspace_bytes) {
    workspace.Poison();
    tokens.Poison();
    count.Poison();
    scores.Poison();
  }
  DeviceBuffer<int32_t> tokens, count;
  DeviceBuffer<float> scores;
  DeviceBuffer<char> workspace;
};

bool ScoreClose(float got, double ref, double magnitude) {
  return std::fabs(got - ref) <= 2e-5 * magnitude + 1e-5;
}

// Ranks [0, n) by (score desc, index asc), NaN excluded.
std::vector<int64_t> Rank(const std::vector<double>& score) {
  std::vector<int64_t> order;
  for (size_t i = 0; i < score.size(); ++i) {
    if (!std::isnan(score[i])) order.push_back(static_cast<int64_t>(i));
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return score[a] > score[b]; });
  return order;
}

// Whether two scores in `score` (NaN excluded) lie within a relative 1e-4 of each other.
bool HasNearTie(const std::vector<double>& score) {
  std::vector<double> s;
  for (double x : score) {
    if (!std::isnan(x)) s.push_back(x);
  }
  std::sort(s.begin(), s.end());
  for (size_t i = 1; i < s.size(); ++i) {
    if (s[i] - s[i - 1] <= 1e-4 * (std::fabs(s[i]) + 1e-3)) return true;
  }
  return false;
}

std::vector<int32_t> Assemble(int64_t n, int64_t n_init, int64_t n_local,
                              const std::vector<int32_t>& picks) {
  std::vector<int32_t> out;
  for (int64_t t = 0; t < std::min(n_init, n); ++t) out.push_back(static_cast<int32_t>(t));
  out.insert(out.end(), picks.begin(), picks.end());
  for (int64_t t = std::max(n_init, n - n_local); t < n; ++t) out.push_back(static_cast<int32_t>(t));
  return out;
}

// Downloads a SelectionOutput and checks it: count in range, [0, count) written, ascending and
// unique, the rest untouched (-1).
std::vector<int32_t> DownloadSelection(const DeviceBuffer<int32_t>& tokens,
                                       const DeviceBuffer<int32_t>& count, int64_t n) {
  const int32_t c = count.Download()[0];
  const std::vector<int32_t> all = tokens.Download();
  EXPECT_GE(c, 0);
  EXPECT_LE(static_cast<size_t>(c), all.size());
  std::vector<int32_t> out(all.begin(), all.begin() + std::clamp<int64_t>(c, 0, all.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_TRUE(out[i] >= 0 && out[i] < n) << "entry " << i << " = " << out[i];
    if (i > 0) {
      EXPECT_LT(out[i - 1], out[i]) << "entry " << i;
    }
  }
  for (size_t i = out.size(); i < all.size(); ++i) EXPECT_EQ(all[i], -1) << "entry " << i;
  return out;
}

// Soft-vote top-k comparison (rule 2): picks against the CPU's over the same kept list, with
// cpu_vote the CPU votes of that list.
void ExpectVotePicksClose(const std::vector<int32_t>& gpu_tokens,
                          const std::vector<int32_t>& cpu_tokens,
                          const std::vector<int32_t>& kept, const std::vector<float>& cpu_vote,
                          int64_t k) {
  if (gpu_tokens == cpu_tokens) return;
  ASSERT_EQ(gpu_tokens.size(), cpu_tokens.size());
  ASSERT_GT(static_cast<int64_t>(kept.size()), k);
  std::vector<float> sorted = cpu_vote;
  std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<float>());
  const float t = sorted[k - 1];
  const std::set<int32_t> gpu(gpu_tokens.begin(), gpu_tokens.end());
  const std::set<int32_t> cpu(cpu_tokens.begin(), cpu_tokens.end());
  for (size_t i = 0; i < kept.size(); ++i) {
    const bool in_gpu = gpu.count(kept[i]) > 0, in_cpu = cpu.count(kept[i]) > 0;
    if (in_gpu && !in_cpu) {
      EXPECT_GE(cpu_vote[i], t * (1.0f - 2e-4f)) << "GPU picked " << kept[i];
    }
    if (!in_gpu && in_cpu) {
      EXPECT_LE(cpu_vote[i], t * (1.0f + 2e-4f)) << "GPU left " << kept[i];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// tokenselect_span.

// A c x c causal map: background uniform [0, 1), planted triangles at 4..8, a bump on a few
// columns (index tokens) inside each.
std::vector<float> PlantedMap(int64_t c, const std::vector<std::pair<int64_t, int64_t>>& tri,
                              std::mt19937* rng) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> a(static_cast<size_t>(c * c), 0.0f);
  for (int64_t i = 0; i < c; ++i) {
    for (int64_t j = 0; j <= i; ++j) a[i * c + j] = u(*rng);
  }
  for (const auto& [x, y] : tri) {
    const float v = 4.0f + 4.0f * u(*rng);
    for (int64_t i = x; i <= y; ++i) {
      for (int64_t j = x; j <= i; ++j) a[i * c + j] = v + ((j * 7 + x) % 5 == 0 ? 2.0f : 0.0f);
    }
  }
  return a;
}

// Builds the span index of tokens [0, index_end) chunk by chunk with the CPU code: chunks of 512
// (the last shorter), triangles of 8..160 tokens planted at random, one decode step (a one-token
// span), one gap the index never observed (a span without index tokens, as ObserveChunk records
// it), and nothing past index_end (the uncovered tail).
engine::SpanIndex BuildIndex(int64_t index_end, const engine::SpanOptions& opt, std::mt19937* rng,
                             std::vector<std::pair<int64_t, int64_t>>* planted) {
  engine::SpanIndex index;
  std::uniform_int_distribution<int64_t> len(8, 160);
  int64_t chunk_no = 0;
  while (index.covered_end() < index_end) {
    const int64_t first = index.covered_end();
    if (chunk_no == 3) {  // a decode step
      engine::DetectedSpan d;
      d.index_tokens = {0};
      index.AppendChunk(first, 1, {d});
    } else if (chunk_no == 5) {  // tokens the index never saw
      engine::DetectedSpan gap;
      gap.y = 36;
      gap.gap = true;
      index.AppendChunk(first, std::min<int64_t>(37, index_end - first), {gap});
    } else {
      const int64_t c = std::min<int64_t>(512, index_end - first);
      std::vector<std::pair<int64_t, int64_t>> tri;
      for (int64_t x = len(*rng) / 4; x + 8 < c; x += len(*rng) + 20) {
        const int64_t y = std::min(c - 1, x + len(*rng));
        tri.emplace_back(x, y);
        planted->emplace_back(first + x, first + y + 1);
      }
      const std::vector<float> a = PlantedMap(c, tri, rng);
      index.AppendChunk(first, c, engine::DetectSpans(a, c, opt, engine::SpanLambda(opt, 5)));
    }
    ++chunk_no;
  }
  return index;
}

// A span index as SpanSelect's CSR, on the host and the device.
struct DeviceIndex {
  explicit DeviceIndex(const engine::SpanIndex& index) : covered_end(index.covered_end()) {
    indptr.push_back(0);
    for (const engine::IndexedSpan& s : index.spans()) {
      span_begin.push_back(s.begin);
      span_end.push_back(s.end);
      for (int32_t t : index.vectors(s)) vec_tokens.push_back(t);
      indptr.push_back(static_cast<int32_t>(vec_tokens.size()));
    }
    d_begin = DeviceBuffer<int32_t>(span_begin);
    d_end = DeviceBuffer<int32_t>(span_end);
    d_indptr = DeviceBuffer<int32_t>(indptr);
    d_vec = DeviceBuffer<int32_t>(vec_tokens.empty() ? std::vector<int32_t>{0} : vec_tokens);
  }
  int64_t num_spans() const { return static_cast<int64_t>(span_begin.size()); }
  SpanIndexView View() const {
    SpanIndexView v;
    v.span_begin = d_begin.get();
    v.span_end = d_end.get();
    v.vector_indptr = d_indptr.get();
    v.vector_tokens = d_vec.get();
    v.num_spans = num_spans();
    v.num_vectors = static_cast<int64_t>(vec_tokens.size());
    v.covered_end = covered_end;
    return v;
  }
  int64_t MaxKept(const engine::SelectionOptions& o, int64_t n) const {
    return SpanMaxKept(span_begin.data(), span_end.data(), indptr.data(), num_spans(), covered_end,
                       n, o.n_init, o.n_local, engine::SpanTokenBudget(o));
  }
  std::vector<int32_t> span_begin, span_end, indptr, vec_tokens;
  int64_t covered_end = 0;
  DeviceBuffer<int32_t> d_begin, d_end, d_indptr, d_vec;
};

// SpanSelect's outputs, diagnostics and workspace for one problem (one rank's), and its params.
struct SpanBuffers {
  SpanBuffers(const DeviceIndex& index, const SelectionProblem& problem,
              const engine::SelectionOptions& o)
      : max_kept(index.MaxKept(o, problem.num_tokens)),
        tokens(static_cast<size_t>(SelectionCapacity(problem) + 5)),
        count(1),
        scores(static_cast<size_t>(std::max<int64_t>(index.num_spans(), 1))),
        kept(static_cast<size_t>(std::max<int64_t>(max_kept, 1))),
        votes(static_cast<size_t>(std::max<int64_t>(max_kept, 1))),
        num_kept(1),
        workspace(SpanSelectWorkspaceBytes(index.num_spans(),
                                           static_cast<int64_t>(index.vec_tokens.size()), max_kept,
                                           problem.num_heads, problem.k)) {
    workspace.Poison();  // SpanSelect needs no initialisation
    for (auto* b : {&tokens, &count, &kept, &num_kept}) b->Poison();  // unwritten entries show
    scores.Poison();
    votes.Poison();
    params.out.tokens = tokens.get();
    params.out.num_selected = count.get();
    params.span_scores = scores.get();
    params.kept_tokens = kept.get();
    params.kept_votes = votes.get();
    params.num_kept = num_kept.get();
    params.problem = problem;
    params.index = index.View();
    params.token_budget = engine::SpanTokenBudget(o);
    params.max_kept = max_kept;
    params.workspace = workspace.get();
  }
  int64_t max_kept;
  DeviceBuffer<int32_t> tokens, count;
  DeviceBuffer<float> scores;
  DeviceBuffer<int32_t> kept;
  DeviceBuffer<float> votes;
  DeviceBuffer<int32_t> num_kept;
  DeviceBuffer<char> workspace;
  SpanSelectParams params;
};

// The selection cache around SpanSelect (ApplySelectionCache), after `sp` selected `selected`
// (the CPU policy's result `cpu` for the same step, up to near-ties):
//   - a miss stores the selected set's picks as offsets from n_init and leaves the set alone;
//   - a hit skips SpanSelect (the poisoned output stays unwritten) and rebuilds the set from the
//     stored picks for the same N, a longer one and a shorter one whose local window holds some
//     picks, as the CPU's AssembleSelection does;
//   - counters count the two; a covering budget is refused (no lookup there).
void ExpectCacheRoundTrip(SpanSelectParams sp, const std::vector<int32_t>& selected,
                          DeviceBuffer<int32_t>* d_tokens, DeviceBuffer<int32_t>* d_count) {
  const SelectionProblem& pr = sp.problem;
  const int64_t n = pr.num_tokens;
  DeviceBuffer<int32_t> picks(static_cast<size_t>(std::max<int64_t>(pr.k, 1))), num_picks(1);
  DeviceBuffer<int32_t> hit(std::vector<int32_t>{0});
  DeviceBuffer<int64_t> counters(2);
  picks.Poison();
  num_picks.Poison();
  counters.Zero();
  CachedSelectionParams cp;
  cp.out = sp.out;
  cp.picks = picks.get();
  cp.num_picks = num_picks.get();
  cp.hit = hit.get();
  cp.counters = counters.get();
  cp.problem = pr;
  ASSERT_EQ(ApplySelectionCache(cp, nullptr), cudaSuccess);
  ASSERT_EQ(DownloadSelection(*d_tokens, *d_count, n), selected) << "a miss keeps the set";
  std::vector<int32_t> stored;  // the picks as tokens
  for (int32_t t : selected) {
    if (t >= pr.n_init && t < n - pr.n_local) stored.push_back(t);
  }
  const int32_t np = num_picks.Download()[0];
  ASSERT_EQ(np, static_cast<int32_t>(stored.size()));
  const std::vector<int32_t> entry = picks.Download();
  for (int32_t i = 0; i < np; ++i) ASSERT_EQ(entry[i] + pr.n_init, stored[i]) << "pick " << i;

  hit.Upload({1});
  sp.skip = hit.get();
  d_tokens->Poison();
  d_count->Poison();
  ASSERT_EQ(SpanSelect(sp, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d_count->Download()[0], -1) << "a skipped SpanSelect wrote its count";
  for (int32_t v : d_tokens->Download()) ASSERT_EQ(v, -1) << "a skipped SpanSelect wrote";
  // The same N, a longer one, and a shorter one (a rollback) whose window holds some picks.
  std::vector<int64_t> lengths{n, n + 5};
  for (int32_t t : stored) {
    if (t > pr.n_init + pr.k && t != stored.back()) {
      lengths.push_back(t + pr.n_local);
      break;
    }
  }
  for (const int64_t n2 : lengths) {
    cp.problem.num_tokens = n2;
    engine::SelectionResult want;
    engine::AssembleSelection(n2, pr.n_init, pr.n_local, stored, &want);
    DeviceBuffer<int32_t> tokens(static_cast<size_t>(SelectionCapacity(cp.problem) + 3)), count(1);
    tokens.Poison();
    cp.out.tokens = tokens.get();
    cp.out.num_selected = count.get();
    ASSERT_EQ(ApplySelectionCache(cp, nullptr), cudaSuccess);
    EXPECT_EQ(DownloadSelection(tokens, count, n2), want.tokens) << "a hit at N = " << n2;
  }
  EXPECT_EQ(counters.Download(), (std::vector<int64_t>{static_cast<int64_t>(lengths.size()), 1}));
  cp.problem.num_tokens = pr.n_init + pr.k + pr.n_local;
  EXPECT_EQ(ApplySelectionCache(cp, nullptr), cudaErrorInvalidValue);
  sp.problem.num_tokens = cp.problem.num_tokens;
  EXPECT_EQ(SpanSelect(sp, nullptr), cudaErrorInvalidValue);
}

struct SpanCase {
  Shape shape;
  int64_t n_init, k, n_local, token_budget;
  int64_t index_end;  // covered_end (may pass N: a stale index)
  int num_hot;        // planted spans whose keys are shifted
};

class SpanSelectGpuTest : public ::testing::TestWithParam<SpanCase> {};

TEST_P(SpanSelectGpuTest, MatchesCpuPolicy) {
  const SpanCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.shape.n * 31 + c.k));
  engine::SelectionOptions o;
  o.policy = engine::SelectionPolicyKind::kTokenSelectSpan;
  o.n_init = c.n_init;
  o.k = c.k;
  o.n_local = c.n_local;
  o.span.token_budget = c.token_budget;
  o.scale = 0.75f;
  std::vector<std::pair<int64_t, int64_t>> planted;
  engine::SelectionLayerState state;
  state.spans = BuildIndex(c.index_end, o.span, &rng, &planted);
  std::shuffle(planted.begin(), planted.end(), rng);
  planted.resize(std::min<size_t>(planted.size(), c.num_hot));
  const Problem p = MakeProblem(c.shape, &rng, planted, 1.0f);
  const int64_t n = c.shape.n;
  const engine::SelectionResult cpu = CpuSelect(o, p, &state);

  const engine::SpanIndex& index = state.spans;
  const DeviceIndex dix(index);
  const std::vector<int32_t>& span_begin = dix.span_begin;
  const std::vector<int32_t>& span_end = dix.span_end;
  const std::vector<int32_t>& indptr = dix.indptr;
  const std::vector<int32_t>& vec_tokens = dix.vec_tokens;
  const int64_t num_spans = dix.num_spans();
  const int64_t budget = engine::SpanTokenBudget(o);
  DeviceProblem dp(p);
  SpanBuffers b(dix, dp.View(p, o), o);
  const int64_t max_kept = b.max_kept;
  DeviceBuffer<int32_t>& d_tokens = b.tokens;
  DeviceBuffer<int32_t>& d_count = b.count;
  const SpanSelectParams& sp = b.params;
  // Twice: the second run must not depend on what the first left in the workspace.
  for (int rep = 0; rep < 2; ++rep) {
    for (auto* buf : {&b.tokens, &b.count, &b.kept, &b.num_kept}) buf->Poison();
    b.scores.Poison();
    b.votes.Poison();
    ASSERT_EQ(SpanSelect(sp, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  const std::vector<int32_t> gpu = DownloadSelection(d_tokens, d_count, n);
  ASSERT_FALSE(::testing::Test::HasFailure());
  if (!engine::BudgetCoversAll(o, n)) {
    ExpectCacheRoundTrip(sp, gpu, &d_tokens, &d_count);
    ASSERT_FALSE(::testing::Test::HasFailure());
  }
  if (engine::BudgetCoversAll(o, n) || c.k == 0) {
    EXPECT_EQ(gpu, cpu.tokens);
    return;
  }

  // Span scores against the CPU's definition; unscored exactly where the CPU skips.
  const int64_t begin = o.n_init, end = n - o.n_local;
  const std::vector<float> gpu_scores = b.scores.Download();
  std::vector<double> cpu_scores(static_cast<size_t>(num_spans), NAN);
  std::vector<double> gpu_scores_d(static_cast<size_t>(num_spans), NAN);
  int scored = 0;
  for (int64_t i = 0; i < num_spans; ++i) {
    const bool live = std::max<int64_t>(span_begin[i], begin) < std::min<int64_t>(span_end[i], end);
    const bool has = indptr[i + 1] > indptr[i];
    if (!live || !has || vec_tokens[indptr[i + 1] - 1] >= n) {
      EXPECT_TRUE(std::isnan(gpu_scores[i])) << "span " << i;
      continue;
    }
    std::vector<int32_t> vs;
    for (int32_t j = indptr[i]; j < indptr[i + 1]; ++j) vs.push_back(p.slots[vec_tokens[j]]);
    const auto [ref, mag] = HeadMaxSum(p, vs, o.scale);
    // The CPU policy's own function, to the last bit of the reference above.
    engine::KeyCacheView view = CpuInput(p, nullptr).keys;
    const double cpu_ref = engine::SumOfHeadMaxima(
        p.query.data(), c.shape.num_heads, view,
        absl::MakeConstSpan(vec_tokens.data() + indptr[i], indptr[i + 1] - indptr[i]), o.scale);
    EXPECT_NEAR(cpu_ref, ref, 1e-9 * mag + 1e-9);
    EXPECT_TRUE(ScoreClose(gpu_scores[i], cpu_ref, mag))
        << "span " << i << ": gpu " << gpu_scores[i] << " cpu " << cpu_ref;
    cpu_scores[i] = cpu_ref;
    gpu_scores_d[i] = gpu_scores[i];
    ++scored;
  }
  EXPECT_GT(scored, 10);

  // Rule 1: the kept list is the CPU rule replayed on the GPU scores.
  auto replay_kept = [&](const std::vector<double>& score) {
    std::vector<char> keep(static_cast<size_t>(end - begin), 0);
    for (int64_t i = 0; i < num_spans; ++i) {
      const int64_t b = std::max<int64_t>(span_begin[i], begin);
      const int64_t e = std::min<int64_t>(span_end[i], end);
      if (b < e && indptr[i + 1] == indptr[i]) {
        for (int64_t t = b; t < e; ++t) keep[t - begin] = 1;
      }
    }
    int64_t used = 0;
    for (int64_t i : Rank(score)) {
      const int64_t b = std::max<int64_t>(span_begin[i], begin);
      const int64_t e = std::min<int64_t>(span_end[i], end);
      if (used + (e - b) > budget) continue;
      used += e - b;
      for (int64_t t = b; t < e; ++t) keep[t - begin] = 1;
    }
    for (int64_t t = std::max<int64_t>(index.covered_end(), begin); t < end; ++t) {
      keep[t - begin] = 1;
    }
    std::vector<int32_t> kept;
    for (int64_t i = 0; i < end - begin; ++i) {
      if (keep[i]) kept.push_back(static_cast<int32_t>(begin + i));
    }
    return kept;
  };
  const std::vector<int32_t> kept = replay_kept(gpu_scores_d);
  const int32_t m = b.num_kept.Download()[0];
  ASSERT_EQ(m, static_cast<int32_t>(kept.size()));
  ASSERT_LE(m, max_kept);
  const std::vector<int32_t> kept_all = b.kept.Download();
  ASSERT_EQ(std::vector<int32_t>(kept_all.begin(), kept_all.begin() + m), kept);
  for (int64_t j = m; j < max_kept; ++j) ASSERT_EQ(kept_all[j], -1) << j;
  const std::vector<float> votes_all = b.votes.Download();
  const std::vector<float> gpu_votes(votes_all.begin(), votes_all.begin() + m);
  std::vector<int32_t> winners;
  engine::TopKByScore(gpu_votes.data(), m, c.k, &winners);
  std::vector<int32_t> picks;
  for (int32_t w : winners) picks.push_back(kept[w]);
  ASSERT_EQ(gpu, Assemble(n, o.n_init, o.n_local, picks)) << "rule 1";

  // Rule 2: against the CPU policy.
  if (replay_kept(cpu_scores) != kept) {
    EXPECT_TRUE(HasNearTie(cpu_scores)) << "span choice differs without a near-tie";
    RecordProperty("span_near_tie", 1);
    return;
  }
  // CPU votes over the kept list (the policy's own functions), also checking the GPU votes.
  std::vector<float> cpu_logits;
  std::vector<int32_t> slot_scratch;
  engine::ScoreTokenList(p.query.data(), c.shape.num_heads, CpuInput(p, nullptr).keys, kept,
                         o.scale, &cpu_logits, &slot_scratch);
  std::vector<float> cpu_vote(kept.size());
  engine::SoftVote(cpu_logits.data(), c.shape.num_heads, m, cpu_vote.data());
  for (int32_t j = 0; j < m; ++j) {
    ASSERT_NEAR(gpu_votes[j], cpu_vote[j], 1e-4f * cpu_vote[j] + 1e-30f) << "vote " << j;
  }
  if (m > c.k) {
    ExpectVotePicksClose(gpu, cpu.tokens, kept, cpu_vote, c.k);
  } else {
    EXPECT_EQ(gpu, cpu.tokens);
  }
  // (Recall of the planted structure is bench_span_cuda's business; here only equality counts.)
  RecordProperty("kept", m);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, SpanSelectGpuTest,
    ::testing::Values(
        // Llama-3-8B shape (g = 4), tail past covered_end.
        SpanCase{{20011, 32, 8, 128}, 16, 512, 64, 0, 18000, 12},
        // g = 1, explicit budget.
        SpanCase{{9001, 8, 8, 128}, 7, 300, 33, 1000, 8800, 6},
        // g = 8, d = 64.
        SpanCase{{12345, 16, 2, 64}, 5, 257, 40, 0, 12345 - 40, 8},
        // g = 4 with 3 kv heads, d = 64: a pass with a masked kv head.
        SpanCase{{7777, 12, 3, 64}, 3, 100, 11, 700, 7000, 4},
        // An index ahead of the cache (stale spans) and a tiny local window.
        SpanCase{{6007, 32, 8, 128}, 4, 200, 3, 900, 6600, 5},
        // More kept tokens than k only through the unindexed/tail ranges; k = 0; a covering
        // budget.
        SpanCase{{3001, 8, 2, 64}, 10, 64, 20, 30, 1200, 2},
        SpanCase{{3001, 8, 2, 128}, 10, 0, 20, 30, 3001, 2},
        SpanCase{{3001, 8, 2, 128}, 1000, 1500, 501, 0, 3001, 2}));

// SpanSelect in its three parts as tensor-parallel ranks run it: two ranks, each with half the
// query heads and half the KV heads, sum their span scores and then their kept tokens' votes
// between the parts (here on the host, as an all-reduce would). Both ranks must select the same
// set; the summed span scores must equal one GPU's within rounding, and the set equal one GPU's
// SpanSelect up to near-ties of the votes (the head sums' order differs).
TEST(SpanSelectSplitTest, TwoRanksOfHalfTheHeadsSelectAsOneGpu) {
  std::mt19937 rng(5);
  const Shape shape{20011, 32, 8, 128};
  engine::SelectionOptions o;
  o.policy = engine::SelectionPolicyKind::kTokenSelectSpan;
  o.n_init = 16;
  o.k = 512;
  o.n_local = 64;
  o.scale = 0.75f;
  std::vector<std::pair<int64_t, int64_t>> planted;
  const engine::SpanIndex index = BuildIndex(18000, o.span, &rng, &planted);
  std::shuffle(planted.begin(), planted.end(), rng);
  planted.resize(std::min<size_t>(planted.size(), 12));
  const Problem p = MakeProblem(shape, &rng, planted, 1.0f);
  const DeviceIndex dix(index);
  DeviceProblem dp(p);
  SpanBuffers one(dix, dp.View(p, o), o);
  ASSERT_EQ(SpanSelect(one.params, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<int32_t> want = DownloadSelection(one.tokens, one.count, shape.n);

  // Rank r: query heads [16 r, 16 r + 16), KV heads [4 r, 4 r + 4), of every slot.
  const int64_t d = shape.head_dim, half_q = shape.num_heads / 2, half_kv = shape.num_kv_heads / 2;
  std::vector<std::unique_ptr<DeviceBuffer<float>>> queries;
  std::vector<std::unique_ptr<DeviceBuffer<uint16_t>>> keys;
  std::vector<std::unique_ptr<SpanBuffers>> ranks;
  for (int r = 0; r < 2; ++r) {
    queries.push_back(std::make_unique<DeviceBuffer<float>>(std::vector<float>(
        p.query.begin() + r * half_q * d, p.query.begin() + (r + 1) * half_q * d)));
    std::vector<uint16_t> bits;
    for (int64_t slot = 0; slot < p.num_slots; ++slot) {
      const auto row = p.key_bits.begin() + (slot * shape.num_kv_heads + r * half_kv) * d;
      bits.insert(bits.end(), row, row + half_kv * d);
    }
    keys.push_back(std::make_unique<DeviceBuffer<uint16_t>>(bits));
    SelectionProblem pr = dp.View(p, o);
    pr.query = queries.back()->get();
    pr.k_cache = keys.back()->get();
    pr.num_heads = half_q;
    pr.num_kv_heads = half_kv;
    ranks.push_back(std::make_unique<SpanBuffers>(dix, pr, o));
  }
  // The all-reduce: both ranks get the same sums.
  auto sum_over_ranks = [&](DeviceBuffer<float> SpanBuffers::*member, int64_t n) {
    std::vector<float> total((ranks[0].get()->*member).Download());
    const std::vector<float> other = (ranks[1].get()->*member).Download();
    for (int64_t i = 0; i < n; ++i) total[i] += other[i];
    for (auto& rank : ranks) (rank.get()->*member).Upload(total);
    return std::vector<float>(total.begin(), total.begin() + n);
  };
  for (auto& rank : ranks) ASSERT_EQ(SpanScoreSpans(rank->params, nullptr), cudaSuccess);
  const std::vector<float> scores = sum_over_ranks(&SpanBuffers::scores, dix.num_spans());
  for (auto& rank : ranks) ASSERT_EQ(SpanVoteKept(rank->params, nullptr), cudaSuccess);
  const int32_t m = ranks[0]->num_kept.Download()[0];
  const std::vector<float> votes = sum_over_ranks(&SpanBuffers::votes, m);
  for (auto& rank : ranks) ASSERT_EQ(SpanPickTokens(rank->params, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<int32_t> got0 = DownloadSelection(ranks[0]->tokens, ranks[0]->count, shape.n);
  const std::vector<int32_t> got1 = DownloadSelection(ranks[1]->tokens, ranks[1]->count, shape.n);
  EXPECT_EQ(got0, got1) << "the ranks selected differently";
  EXPECT_EQ(ranks[1]->num_kept.Download()[0], m);

  const std::vector<float> one_scores = one.scores.Download();
  std::vector<double> as_double(scores.begin(), scores.end());
  int64_t scored = 0;
  for (int64_t i = 0; i < dix.num_spans(); ++i) {
    if (std::isnan(one_scores[i])) {
      EXPECT_TRUE(std::isnan(scores[i])) << "span " << i;
      continue;
    }
    ++scored;
    EXPECT_NEAR(scores[i], one_scores[i], 1e-5f * (std::fabs(one_scores[i]) + 1.0f)) << i;
  }
  EXPECT_GT(scored, 10);
  const std::vector<int32_t> one_kept_all = one.kept.Download();
  const std::vector<int32_t> kept_all = ranks[0]->kept.Download();
  const std::vector<int32_t> kept(kept_all.begin(), kept_all.begin() + m);
  if (one.num_kept.Download()[0] != m ||
      !std::equal(kept.begin(), kept.end(), one_kept_all.begin())) {
    EXPECT_TRUE(HasNearTie(as_double)) << "the span choice differs without a near-tie";
    return;
  }
  ExpectVotePicksClose(got0, want, kept, votes, o.k);
  std::printf("two ranks: %lld spans scored, %d kept tokens, %s one GPU's selection\n",
              static_cast<long long>(scored), m, got0 == want ? "equal to" : "near-ties from");
}

// ---------------------------------------------------------------------------------------------
// Quest.

struct QuestCase {
  Shape shape;
  int64_t n_init, k, n_local, page_size;
  bool hot_short_page;  // plant a strong key in the short last page
};

class QuestGpuTest : public ::testing::TestWithParam<QuestCase> {};

TEST_P(QuestGpuTest, MatchesCpuPolicy) {
  const QuestCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.shape.n * 17 + c.k + c.page_size));
  const int64_t n = c.shape.n;
  const int64_t begin = c.n_init, end = n - c.n_local;
  std::vector<std::pair<int64_t, int64_t>> hot = {{begin + 3 * c.page_size, begin + 5 * c.page_size}};
  if (c.hot_short_page) hot.emplace_back(end - 1, end);
  const Problem p = MakeProblem(c.shape, &rng, hot, 3.0f);
  engine::SelectionOptions o;
  o.policy = engine::SelectionPolicyKind::kQuest;
  o.n_init = c.n_init;
  o.k = c.k;
  o.n_local = c.n_local;
  o.baselines.quest_page_size = c.page_size;
  o.scale = 1.25f;
  const engine::SelectionResult cpu = CpuSelect(o, p, nullptr);

  DeviceProblem dp(p);
  const SelectionProblem view = dp.View(p, o);
  const int64_t pages = QuestNumPages(view, c.page_size);
  const int64_t row = c.shape.num_kv_heads * c.shape.head_dim;
  DeviceBuffer<uint16_t> d_bounds(static_cast<size_t>(std::max<int64_t>(pages * 2 * row, 1)));
  d_bounds.Poison();
  QuestBoundsParams bp;
  bp.page_bounds = reinterpret_cast<__nv_bfloat16*>(d_bounds.get());
  bp.problem = view;
  bp.page_size = c.page_size;
  ASSERT_EQ(QuestBuildPageBounds(bp, nullptr), cudaSuccess);
  const int64_t cap = SelectionCapacity(view);
  PoisonedSelection out(cap, pages, QuestSelectWorkspaceBytes(pages, c.k, c.page_size));
  const DeviceBuffer<int32_t>& d_tokens = out.tokens;
  const DeviceBuffer<int32_t>& d_count = out.count;
  const DeviceBuffer<float>& d_scores = out.scores;
  QuestSelectParams qp;
  qp.out.tokens = d_tokens.get();
  qp.out.num_selected = d_count.get();
  qp.page_scores = d_scores.get();
  qp.page_bounds = bp.page_bounds;
  qp.problem = view;
  qp.page_size = c.page_size;
  qp.workspace = out.workspace.get();
  ASSERT_EQ(QuestSelect(qp, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<int32_t> gpu = DownloadSelection(d_tokens, d_count, n);
  if (engine::BudgetCoversAll(o, n)) {
    EXPECT_EQ(gpu, cpu.tokens);
    return;
  }

  // Bounds: exact bf16 min/max.
  const std::vector<uint16_t> bounds = d_bounds.Download();
  for (int64_t g = 0; g < pages; ++g) {
    const int64_t p0 = begin + g * c.page_size, p1 = std::min(end, p0 + c.page_size);
    for (int64_t e = 0; e < row; ++e) {
      float lo = INFINITY, hi = -INFINITY;
      for (int64_t t = p0; t < p1; ++t) {
        const float x = p.keys[static_cast<int64_t>(p.slots[t]) * row + e];
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
      ASSERT_EQ(gpu_test::Bf16BitsToFloat(bounds[(g * 2) * row + e]), lo) << g << " " << e;
      ASSERT_EQ(gpu_test::Bf16BitsToFloat(bounds[(g * 2 + 1) * row + e]), hi) << g << " " << e;
    }
  }
  if (c.k == 0) {  // nothing is scored
    EXPECT_EQ(gpu, cpu.tokens);
    return;
  }
  // Scores against double.
  const std::vector<float> gpu_scores = d_scores.Download();
  std::vector<double> cpu_scores(static_cast<size_t>(pages)), gpu_d(static_cast<size_t>(pages));
  const int64_t h = c.shape.num_heads, d = c.shape.head_dim, grp = h / c.shape.num_kv_heads;
  for (int64_t g = 0; g < pages; ++g) {
    double bound = 0.0, mag = 0.0;
    for (int64_t hh = 0; hh < h; ++hh) {
      for (int64_t e = 0; e < d; ++e) {
        const int64_t ch = (hh / grp) * d + e;
        const double lo = gpu_test::Bf16BitsToFloat(bounds[(g * 2) * row + ch]);
        const double hi = gpu_test::Bf16BitsToFloat(bounds[(g * 2 + 1) * row + ch]);
        const double q = p.query[hh * d + e];
        bound += std::max(q * lo, q * hi);
        mag += std::max(std::fabs(q * lo), std::fabs(q * hi));
      }
    }
    cpu_scores[g] = o.scale * bound;
    gpu_d[g] = gpu_scores[g];
    ASSERT_TRUE(ScoreClose(gpu_scores[g], cpu_scores[g], o.scale * mag))
        << "page " << g << ": gpu " << gpu_scores[g] << " cpu " << cpu_scores[g];
  }
  auto replay = [&](const std::vector<double>& score) {
    std::vector<int64_t> chosen;
    int64_t used = 0;
    for (int64_t g : Rank(score)) {
      if (used == c.k) break;
      const int64_t len = std::min(end, begin + (g + 1) * c.page_size) - (begin + g * c.page_size);
      if (used + len > c.k) continue;
      used += len;
      chosen.push_back(g);
    }
    std::sort(chosen.begin(), chosen.end());
    std::vector<int32_t> picks;
    for (int64_t g : chosen) {
      for (int64_t t = begin + g * c.page_size; t < std::min(end, begin + (g + 1) * c.page_size); ++t) {
        picks.push_back(static_cast<int32_t>(t));
      }
    }
    return Assemble(n, c.n_init, c.n_local, picks);
  };
  ASSERT_EQ(gpu, replay(gpu_d)) << "rule 1";
  if (gpu != cpu.tokens) {
    EXPECT_TRUE(HasNearTie(cpu_scores)) << "page choice differs without a near-tie";
    RecordProperty("page_near_tie", 1);
  }
  // The short page's fate is exercised: record whether it was taken.
  RecordProperty("short_taken", std::binary_search(gpu.begin(), gpu.end(), end - 1) ? 1 : 0);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, QuestGpuTest,
    ::testing::Values(
        QuestCase{{20011, 32, 8, 128}, 128, 2048, 512, 16, true},   // r = 11, ranked high
        QuestCase{{20011, 32, 8, 128}, 128, 2040, 511, 16, true},   // k % 16 = 8 < r = 12
        QuestCase{{20011, 32, 8, 128}, 128, 2040, 518, 16, false},  // r = 5 fits at the end
        QuestCase{{9001, 8, 8, 128}, 7, 301, 33, 16, true},         // g = 1
        QuestCase{{12345, 16, 2, 64}, 5, 257, 40, 7, true},         // g = 8, page 7
        QuestCase{{7777, 12, 3, 64}, 3, 100, 11, 16, false},        // odd kv heads
        QuestCase{{4096, 32, 8, 128}, 0, 512, 0, 16, false},        // no short page
        QuestCase{{3001, 8, 2, 64}, 1000, 1500, 501, 16, false},    // covering budget
        QuestCase{{3001, 8, 2, 64}, 10, 0, 20, 16, false}));        // k = 0

// ---------------------------------------------------------------------------------------------
// InfLLM.

struct InfLlmCase {
  Shape shape;
  int64_t n_init, k, n_local, block_size, reps;
  int64_t received_size;  // tokens observed (the rest count as 0)
};

class InfLlmGpuTest : public ::testing::TestWithParam<InfLlmCase> {};

TEST_P(InfLlmGpuTest, MatchesCpuPolicy) {
  const InfLlmCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.shape.n * 13 + c.block_size));
  const int64_t n = c.shape.n;
  const int64_t begin = c.n_init, end = n - c.n_local;
  const Problem p = MakeProblem(c.shape, &rng, {{begin + 2 * c.block_size + 5, begin + 2 * c.block_size + 9}}, 3.0f);
  engine::SelectionLayerState state;
  state.received.resize(static_cast<size_t>(c.received_size));
  std::uniform_int_distribution<int> r(0, 20);  // ties
  for (float& x : state.received) x = static_cast<float>(r(rng));
  engine::SelectionOptions o;
  o.policy = engine::SelectionPolicyKind::kInfLlm;
  o.n_init = c.n_init;
  o.k = c.k;
  o.n_local = c.n_local;
  o.baselines.infllm_block_size = c.block_size;
  o.baselines.infllm_representatives = c.reps;
  o.scale = 0.5f;
  const engine::SelectionResult cpu = CpuSelect(o, p, &state);

  DeviceProblem dp(p);
  const SelectionProblem view = dp.View(p, o);
  const int64_t blocks = InfLlmNumBlocks(view, c.block_size);
  DeviceBuffer<float> d_received(state.received.empty() ? std::vector<float>{0.0f} : state.received);
  DeviceBuffer<int32_t> d_reps(static_cast<size_t>(std::max<int64_t>(blocks * c.reps, 1)));
  d_reps.Poison();
  // Poison with a value that is not -1 so that the "-1 past the count" entries are checked.
  TS_CUDA_CHECK(cudaMemset(d_reps.get(), 0x7f, d_reps.size() * sizeof(int32_t)));
  InfLlmRepsParams rp;
  rp.rep_slots = d_reps.get();
  rp.received = d_received.get();
  rp.received_size = c.received_size;
  rp.problem = view;
  rp.block_size = c.block_size;
  rp.reps = c.reps;
  ASSERT_EQ(InfLlmRepresentatives(rp, nullptr), cudaSuccess);
  const int64_t cap = SelectionCapacity(view);
  PoisonedSelection out(cap, blocks, InfLlmSelectWorkspaceBytes(blocks, c.k, c.block_size));
  const DeviceBuffer<int32_t>& d_tokens = out.tokens;
  const DeviceBuffer<int32_t>& d_count = out.count;
  const DeviceBuffer<float>& d_scores = out.scores;
  InfLlmSelectParams ip;
  ip.out.tokens = d_tokens.get();
  ip.out.num_selected = d_count.get();
  ip.block_scores = d_scores.get();
  ip.rep_slots = d_reps.get();
  ip.problem = view;
  ip.block_size = c.block_size;
  ip.reps = c.reps;
  ip.workspace = out.workspace.get();
  ASSERT_EQ(InfLlmSelect(ip, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<int32_t> gpu = DownloadSelection(d_tokens, d_count, n);
  if (engine::BudgetCoversAll(o, n)) {
    EXPECT_EQ(gpu, cpu.tokens);
    return;
  }
  // Representatives: exact.
  const std::vector<int32_t> reps = d_reps.Download();
  std::vector<double> cpu_scores(static_cast<size_t>(blocks)), gpu_d(static_cast<size_t>(blocks));
  const std::vector<float> gpu_scores = d_scores.Download();
  const bool scored = c.k / c.block_size > 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t b0 = begin + b * c.block_size, b1 = std::min(end, b0 + c.block_size);
    std::vector<double> rec;
    for (int64_t t = b0; t < b1; ++t) {
      rec.push_back(t < c.received_size ? state.received[t] : 0.0);
    }
    std::vector<int32_t> expect;
    for (int64_t i : Rank(rec)) {
      if (static_cast<int64_t>(expect.size()) == c.reps) break;
      expect.push_back(p.slots[b0 + i]);
    }
    for (int64_t i = 0; i < c.reps; ++i) {
      const int32_t want = i < static_cast<int64_t>(expect.size()) ? expect[i] : -1;
      ASSERT_EQ(reps[b * c.reps + i], want) << "block " << b << " rep " << i;
    }
    if (!scored) continue;
    const auto [ref, mag] = HeadMaxSum(p, expect, o.scale);
    cpu_scores[b] = static_cast<float>(ref);
    gpu_d[b] = gpu_scores[b];
    ASSERT_TRUE(ScoreClose(gpu_scores[b], ref, mag))
        << "block " << b << ": gpu " << gpu_scores[b] << " cpu " << ref;
  }
  auto replay = [&](const std::vector<double>& score) {
    std::vector<int32_t> picks;
    const std::vector<int64_t> ranked = Rank(score);
    std::vector<int64_t> top(ranked.begin(),
                             ranked.begin() + std::min<int64_t>(c.k / c.block_size, blocks));
    std::sort(top.begin(), top.end());
    for (int64_t b : top) {
      for (int64_t t = begin + b * c.block_size; t < std::min(end, begin + (b + 1) * c.block_size); ++t) {
        picks.push_back(static_cast<int32_t>(t));
      }
    }
    return Assemble(n, c.n_init, c.n_local, picks);
  };
  if (scored) {
    ASSERT_EQ(gpu, replay(gpu_d)) << "rule 1";
  }
  if (gpu != cpu.tokens) {
    EXPECT_TRUE(HasNearTie(cpu_scores)) << "block choice differs without a near-tie";
    RecordProperty("block_near_tie", 1);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, InfLlmGpuTest,
    ::testing::Values(
        InfLlmCase{{20011, 32, 8, 128}, 128, 2048, 512, 128, 4, 19000},  // Llama-3-8B
        InfLlmCase{{9001, 8, 8, 128}, 7, 300, 33, 10, 3, 9001},          // g = 1, short blocks
        InfLlmCase{{12345, 16, 2, 64}, 5, 1000, 40, 128, 4, 12000},      // g = 8
        InfLlmCase{{7777, 12, 3, 64}, 3, 515, 11, 100, 7, 5000},         // odd kv heads
        InfLlmCase{{3001, 8, 2, 64}, 10, 50, 20, 128, 4, 3001},          // k < block: none
        InfLlmCase{{3001, 8, 2, 64}, 1000, 1500, 501, 128, 4, 3001}));   // covering budget

}  // namespace
}  // namespace tokenselect::kernels::cuda
