// Needs a GPU (label gpu): chunked-prefill attention (kernels/cuda/prefill_attention.h), the
// tensor-core kernel and SimplePrefillAttention, against cpu::GatherAttention (kernels/ops.h) on
// the same bf16-rounded inputs, one request at a time.
// Fresh random inputs every run. Batches mix query lengths (1, 7, 64, 512 + odd) and lists (empty,
// small, a few thousand, ~200K entries at true positions up to ~1M), causal-chunk prefixes
// (visible = cached + i + 1) and random prefixes (0 and the whole list included), scrambled slots
// (repeats allowed), compact and true positions, groups 1/2/4/8, head dims 64/128 (the simple
// kernel also 32 and 96 with group 3), a query row stride wider than the row (fused qkv output);
// the tuned kernel with 1, the planned and 7 splits.
// Output (and workspace) poisoned with NaN before every launch. Tolerance per request: relative L2
// error <= 8e-3 and max abs error <= 3e-2 * max |ref| (bf16 output rounding alone is ~2e-3
// relative; the tuned kernel also rounds rotated q and k and the probabilities to bf16, about as
// much again); rows with nothing visible must be exactly zero.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/ops.h"
#include "tests/gpu/fresh_seed.h"
#include "tests/gpu/gpu_test_util.h"

namespace tokenselect::kernels::cuda {
namespace {

using gpu_test::DeviceBuffer;

// xorshift64*: host generation of ~10^8 values has to be quick.
class FastRng {
 public:
  explicit FastRng(uint64_t seed) : s_(seed | 1) {}
  uint64_t Next() {
    s_ ^= s_ >> 12;
    s_ ^= s_ << 25;
    s_ ^= s_ >> 27;
    return s_ * 0x2545F4914F6CDD1Dull;
  }
  // Uniform on [-sqrt(3), sqrt(3)): unit variance.
  float Unit() { return (static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * 1.7320508f; }
  int64_t Int(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }

 private:
  uint64_t s_;
};

enum class Visibility { kCausalChunk, kRandom };

struct RequestSpec {
  int64_t q_len;
  int64_t cached;  // list entries before the chunk; the list is cached (+ q_len if causal)
  Visibility vis;
};

struct PrefillCase {
  std::string name;
  std::vector<RequestSpec> requests;
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  bool true_positions;
  int64_t stride_pad;    // q_row_stride - num_heads * head_dim
  bool tuned;            // the tensor-core kernel supports the shape
};

void PrintTo(const PrefillCase& c, std::ostream* os) { *os << c.name; }

class PrefillAttentionGpuTest : public ::testing::TestWithParam<PrefillCase> {};

TEST_P(PrefillAttentionGpuTest, MatchesCpuGatherAttention) {
  const PrefillCase c = GetParam();
  const gpu_test::FreshSeed seed;
  FastRng rng(seed.value() * 0x9E3779B97F4A7C15ull + 12345);
  const int64_t batch = static_cast<int64_t>(c.requests.size());
  const int64_t d = c.head_dim;
  std::vector<int32_t> q_indptr(1, 0), kv_indptr(1, 0);
  int64_t max_q_len = 1, max_kv_len = 0;
  for (const RequestSpec& r : c.requests) {
    const int64_t list = r.cached + (r.vis == Visibility::kCausalChunk ? r.q_len : 0);
    q_indptr.push_back(q_indptr.back() + static_cast<int32_t>(r.q_len));
    kv_indptr.push_back(kv_indptr.back() + static_cast<int32_t>(list));
    max_q_len = std::max(max_q_len, r.q_len);
    max_kv_len = std::max(max_kv_len, list);
  }
  const int64_t total_q = q_indptr.back(), nnz = kv_indptr.back();
  const int64_t num_slots = std::min<int64_t>(nnz, 65536) + 1001;
  const int64_t kv_row = c.num_kv_heads * d;
  const int64_t q_stride = c.num_heads * d + c.stride_pad;

  std::vector<float> k_cache(static_cast<size_t>(num_slots * kv_row)), v_cache(k_cache.size());
  for (float& x : k_cache) x = rng.Unit();
  for (float& x : v_cache) x = rng.Unit();
  std::vector<float> q(static_cast<size_t>(std::max<int64_t>(1, total_q) * q_stride));
  for (float& x : q) x = rng.Unit();
  const auto k_bits = gpu_test::RoundToBf16(&k_cache);
  const auto v_bits = gpu_test::RoundToBf16(&v_cache);
  const auto q_bits = gpu_test::RoundToBf16(&q);

  std::vector<int32_t> indices(static_cast<size_t>(nnz)), positions(static_cast<size_t>(nnz));
  std::vector<int32_t> q_positions(static_cast<size_t>(total_q)), visible(q_positions.size());
  for (int64_t b = 0; b < batch; ++b) {
    const RequestSpec& r = c.requests[b];
    const int64_t list = kv_indptr[b + 1] - kv_indptr[b];
    int32_t pos = c.true_positions ? static_cast<int32_t>(rng.Int(0, 1000)) : 0;
    for (int64_t e = 0; e < list; ++e) {
      const int64_t j = kv_indptr[b] + e;
      indices[j] = static_cast<int32_t>(rng.Int(0, num_slots - 1));
      positions[j] = pos;
      // Cached entries at true positions have gaps (up to ~1M at 200K entries); the chunk is
      // consecutive.
      const bool in_chunk = e >= r.cached;
      pos += (c.true_positions && !in_chunk) ? static_cast<int32_t>(rng.Int(1, 9)) : 1;
    }
    for (int64_t i = 0; i < r.q_len; ++i) {
      const int64_t row = q_indptr[b] + i;
      if (r.vis == Visibility::kCausalChunk) {
        visible[row] = static_cast<int32_t>(r.cached + i + 1);
        q_positions[row] = positions[kv_indptr[b] + r.cached + i];
      } else {
        const int64_t kind = rng.Int(0, 7);
        visible[row] = static_cast<int32_t>(kind == 0 ? 0 : kind == 1 ? list : rng.Int(0, list));
        q_positions[row] = pos + static_cast<int32_t>(i);
      }
    }
  }
  RopeParams rope;
  rope.head_dim = d;
  rope.theta = 500000.0;
  const std::vector<float> inv_freq = RopeInverseFrequencies(rope);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));

  // CPU reference, one request at a time (queries packed without the stride padding).
  std::vector<float> ref(static_cast<size_t>(total_q * c.num_heads * d), 0.0f);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t q_len = q_indptr[b + 1] - q_indptr[b];
    if (q_len == 0) continue;
    std::vector<float> qb(static_cast<size_t>(q_len * c.num_heads * d));
    for (int64_t i = 0; i < q_len; ++i) {
      std::copy_n(q.data() + (q_indptr[b] + i) * q_stride, c.num_heads * d,
                  qb.data() + i * c.num_heads * d);
    }
    GatherAttentionParams gp;
    gp.out = ref.data() + q_indptr[b] * c.num_heads * d;
    gp.q = qb.data();
    gp.q_positions = q_positions.data() + q_indptr[b];
    gp.k_cache = k_cache.data();
    gp.v_cache = v_cache.data();
    gp.kv_slots = indices.data() + kv_indptr[b];
    gp.kv_positions = positions.data() + kv_indptr[b];
    gp.visible = visible.data() + q_indptr[b];
    gp.inv_freq = inv_freq.data();
    gp.num_queries = q_len;
    gp.kv_len = kv_indptr[b + 1] - kv_indptr[b];
    gp.num_heads = c.num_heads;
    gp.num_kv_heads = c.num_kv_heads;
    gp.head_dim = d;
    gp.scale = scale;
    cpu::GatherAttention(gp);
  }

  DeviceBuffer<uint16_t> d_k(k_bits), d_v(v_bits), d_q(q_bits);
  DeviceBuffer<int32_t> d_q_indptr(q_indptr), d_kv_indptr(kv_indptr);
  DeviceBuffer<int32_t> d_indices(indices), d_positions(positions);
  DeviceBuffer<int32_t> d_q_positions(q_positions), d_visible(visible);
  DeviceBuffer<float> d_inv_freq(inv_freq);
  DeviceBuffer<uint16_t> d_out(ref.size());
  int num_sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const int planned = PlanPrefillSplits(batch, c.num_heads, c.num_kv_heads, max_q_len,
                                        max_kv_len, num_sms);
  std::vector<int> variants;  // split counts of the tuned kernel; 0 = SimplePrefillAttention
  if (c.tuned) {
    variants.push_back(1);
    if (planned != 1) variants.push_back(planned);
    variants.push_back(7);
  }
  variants.push_back(0);
  // The tuned kernel runs each split count with and without the gathered list (forced either
  // way; lists small enough that the gathered copy stays under ~64 MiB): the two outputs must be
  // the same bits.
  const bool try_gather = batch * max_kv_len * c.num_kv_heads * d * 4 <= (int64_t{64} << 20);
  std::vector<uint16_t> ungathered;
  std::vector<std::pair<int, PrefillGather>> runs;
  for (int splits : variants) {
    if (splits == 0) {
      runs.push_back({0, PrefillGather::kOff});
      continue;
    }
    runs.push_back({splits, PrefillGather::kOff});
    if (try_gather) runs.push_back({splits, PrefillGather::kOn});
  }
  for (const auto& [splits, gather] : runs) {
    const bool gathered = gather == PrefillGather::kOn;
    SCOPED_TRACE(testing::Message() << (splits == 0 ? "simple" : "tuned") << " splits=" << splits
                                    << " (planned " << planned << ")"
                                    << (gathered ? " gathered" : ""));
    d_out.Poison();
    PrefillAttentionParams p;
    p.out = reinterpret_cast<__nv_bfloat16*>(d_out.get());
    p.q = reinterpret_cast<const __nv_bfloat16*>(d_q.get());
    p.q_row_stride = q_stride;
    p.q_positions = d_q_positions.get();
    p.q_indptr = d_q_indptr.get();
    p.visible = d_visible.get();
    p.k_cache = reinterpret_cast<const __nv_bfloat16*>(d_k.get());
    p.v_cache = reinterpret_cast<const __nv_bfloat16*>(d_v.get());
    p.kv_indptr = d_kv_indptr.get();
    p.kv_indices = d_indices.get();
    p.kv_positions = d_positions.get();
    p.inv_freq = d_inv_freq.get();
    p.batch = batch;
    p.total_q = total_q;
    p.num_heads = c.num_heads;
    p.num_kv_heads = c.num_kv_heads;
    p.head_dim = d;
    p.max_q_len = max_q_len;
    p.max_kv_len = max_kv_len;
    p.num_splits = std::max(1, splits);
    p.scale = scale;
    p.gather = gather;
    DeviceBuffer<char> ws(std::max<size_t>(1, PrefillAttentionWorkspaceBytes(p)));
    ws.Poison();
    p.workspace = ws.get();
    if (splits == 0) {
      ASSERT_EQ(SimplePrefillAttention(p, nullptr), cudaSuccess);
    } else {
      ASSERT_EQ(PrefillAttention(p, nullptr), cudaSuccess);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> out_bits = d_out.Download();
    if (splits > 0 && !gathered) ungathered = out_bits;
    if (gathered) {
      int64_t differ = 0;
      for (size_t i = 0; i < out_bits.size(); ++i) differ += out_bits[i] != ungathered[i];
      EXPECT_EQ(differ, 0) << "gathered list: outputs differ from the ungathered run's bits";
    }
    const int64_t per_row = c.num_heads * d;
    double worst_rel = 0.0;
    for (int64_t b = 0; b < batch; ++b) {
      gpu_test::Bf16Error e;
      int64_t zero_rows = 0, nonzero_in_zero_rows = 0;
      for (int64_t row = q_indptr[b]; row < q_indptr[b + 1]; ++row) {
        const bool empty = visible[row] <= 0;
        zero_rows += empty;
        const int64_t nonzero_before = e.nonzero;
        e.Add(out_bits.data(), ref.data(), row * per_row, (row + 1) * per_row);
        ASSERT_EQ(e.first_nan, -1) << "unwritten or NaN output, request " << b << " row " << row
                                   << " element " << e.first_nan - row * per_row;
        if (empty) nonzero_in_zero_rows += e.nonzero - nonzero_before;
      }
      EXPECT_EQ(nonzero_in_zero_rows, 0) << "rows with visible == 0 must be zeros, request " << b;
      if (e.ref2 == 0.0) {
        EXPECT_EQ(e.max_err, 0.0) << "request " << b;
        continue;
      }
      worst_rel = std::max(worst_rel, e.relative_l2());
      EXPECT_LE(e.relative_l2(), 8e-3)
          << "request " << b << " q_len " << c.requests[b].q_len << " list "
          << kv_indptr[b + 1] - kv_indptr[b] << " (" << zero_rows << " empty rows)";
      EXPECT_LE(e.max_err, 3e-2 * e.max_ref) << "request " << b;
    }
    std::printf("  %s %s splits=%d%s: worst request rel L2 %.2e\n", c.name.c_str(),
                splits == 0 ? "simple" : "tuned", splits, gathered ? " gathered" : "", worst_rel);
  }
}

constexpr auto kCausal = Visibility::kCausalChunk;
constexpr auto kRandom = Visibility::kRandom;

INSTANTIATE_TEST_SUITE_P(
    Shapes, PrefillAttentionGpuTest,
    ::testing::Values(
        // Llama-3-8B shape (g = 4): a TokenSelect-like 2688 + 519 chunk, tiny chunks, an empty
        // list, random prefixes; fused-qkv row stride.
        PrefillCase{"llama_mixed",
                    {{7, 0, kCausal}, {1, 37, kCausal}, {64, 3000, kRandom},
                     {519, 2688, kCausal}, {5, 0, kRandom}},
                    32, 8, 128, false, 2 * 8 * 128, true},
        // A ~200K-entry list at true positions (~1M): splits matter.
        PrefillCase{"long_dense", {{64, 200000, kCausal}, {1, 1000, kCausal}},
                    32, 8, 128, true, 0, true},
        PrefillCase{"g8_d64",
                    {{519, 1500, kCausal}, {33, 777, kRandom}, {1, 0, kCausal}},
                    16, 2, 64, true, 0, true},
        PrefillCase{"g1_d128", {{130, 2050, kCausal}, {64, 100, kRandom}},
                    8, 8, 128, false, 8, true},
        PrefillCase{"g2_d64", {{100, 4099, kRandom}, {77, 60000, kCausal}},
                    12, 6, 64, true, 0, true},
        PrefillCase{"g1_d64", {{513, 3000, kCausal}, {7, 7, kRandom}},
                    4, 4, 64, false, 0, true},
        // Shapes only the simple kernel serves.
        PrefillCase{"simple_d32",
                    {{40, 300, kCausal}, {3, 0, kRandom}, {17, 500, kRandom}},
                    4, 2, 32, false, 2 * 2 * 32, false},
        PrefillCase{"simple_d96_g3", {{20, 1000, kCausal}, {9, 64, kRandom}},
                    6, 2, 96, true, 0, false}));

TEST(PrefillAttentionGpuTest, RejectsUnsupportedShapes) {
  PrefillAttentionParams p;
  p.batch = 1;
  p.total_q = 1;
  p.num_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim = 96;
  p.max_q_len = 1;
  p.q_row_stride = 32 * 128;
  EXPECT_EQ(PrefillAttention(p, nullptr), cudaErrorInvalidValue);
  p.head_dim = 128;
  p.num_kv_heads = 2;  // group 16
  EXPECT_EQ(PrefillAttention(p, nullptr), cudaErrorInvalidValue);
  p.num_kv_heads = 8;  // supported shape, null pointers
  EXPECT_EQ(PrefillAttention(p, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(SimplePrefillAttention(p, nullptr), cudaErrorInvalidValue);
  p.head_dim = 33;
  EXPECT_EQ(SimplePrefillAttention(p, nullptr), cudaErrorInvalidValue);
  p.head_dim = 258;
  EXPECT_EQ(SimplePrefillAttention(p, nullptr), cudaErrorInvalidValue);
}

TEST(PrefillAttentionGpuTest, PlanFillsTheDevice) {
  // A 512-query chunk at the Llama-3-8B shape nearly fills 132 SMs by itself (GQA packing).
  EXPECT_GE(PlanPrefillSplits(1, 32, 8, 512, 1 << 20, 132), 1);
  EXPECT_LE(PlanPrefillSplits(1, 32, 8, 512, 1 << 20, 132), 2);
  // One query against a long list is split; a short list is not cut below 4 key tiles.
  EXPECT_GT(PlanPrefillSplits(1, 32, 8, 1, 1 << 20, 132), 8);
  EXPECT_EQ(PlanPrefillSplits(1, 32, 8, 1, 200, 132), 1);
  EXPECT_LE(PlanPrefillSplits(1, 1, 1, 1, 1 << 30, 132), 1024);
}

// Odd and chunk-sized query counts, both head dims, one query (decode); on sm_90 the query
// counts above one go through the cluster kernel. Twice each: the same bits.
TEST(PrefillAttentionGpuTest, SelectionQueryMatchesDoubleReference) {
  const gpu_test::FreshSeed seed;
  FastRng rng(seed.value());
  struct Shape {
    int64_t num_q, heads, d;
  };
  for (const Shape& shape : {Shape{37, 8, 128}, Shape{512, 16, 128}, Shape{509, 4, 64},
                             Shape{1, 8, 128}}) {
    const int64_t num_q = shape.num_q, heads = shape.heads, d = shape.d;
    const int64_t stride = heads * d + 3 * 128, n_local = 512;
    std::vector<float> q(static_cast<size_t>(num_q * stride));
    for (float& x : q) x = rng.Unit();
    const auto q_bits = gpu_test::RoundToBf16(&q);
    RopeParams rope;
    rope.head_dim = d;
    rope.theta = 500000.0;
    const std::vector<float> inv_freq = RopeInverseFrequencies(rope);
    std::vector<double> ref(static_cast<size_t>(heads * d), 0.0);
    for (int64_t i = 0; i < num_q; ++i) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t f = 0; f < d / 2; ++f) {
          const double angle = static_cast<float>(n_local + i) * inv_freq[f];  // fp32 angle
          const double x = q[i * stride + h * d + f], y = q[i * stride + h * d + f + d / 2];
          ref[h * d + f] += (x * std::cos(angle) - y * std::sin(angle)) / num_q;
          ref[h * d + f + d / 2] += (y * std::cos(angle) + x * std::sin(angle)) / num_q;
        }
      }
    }
    DeviceBuffer<uint16_t> d_q(q_bits);
    DeviceBuffer<float> d_inv_freq(inv_freq), d_out(ref.size());
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      d_out.Poison();
      ASSERT_EQ(BuildSelectionQuery(d_out.get(),
                                    reinterpret_cast<const __nv_bfloat16*>(d_q.get()), stride,
                                    num_q, heads, d, n_local, d_inv_freq.get(), nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> got = d_out.Download();
      double max_err = 0.0;
      for (size_t k = 0; k < ref.size(); ++k) {
        ASSERT_FALSE(std::isnan(got[k])) << k;
        max_err = std::max(max_err, std::fabs(got[k] - ref[k]));
      }
      EXPECT_LE(max_err, 2e-5) << num_q << " queries, " << heads << " heads, d " << d;
      if (run == 0) {
        first = got;
      } else {
        EXPECT_EQ(got, first) << "not deterministic: " << num_q << " queries, d " << d;
      }
    }
    EXPECT_EQ(BuildSelectionQuery(d_out.get(), nullptr, stride, num_q, heads, d, n_local,
                                  d_inv_freq.get(), nullptr),
              cudaErrorInvalidValue);
  }
}

}  // namespace
}  // namespace tokenselect::kernels::cuda
