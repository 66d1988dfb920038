// Needs a GPU (label gpu): the FP8 KV cache's kernels (docs/fp8_kv.md).
//   - the device e4m3 conversions against engine/model/fp8.h (the CPU's bit-exact twin): every
//     code's decode, and __nv_cvt_float_to_fp8(satfinite) on millions of floats of all kinds;
//   - KvAppend into an FP8 cache against the CPU's e4m3(x * (1 / s));
//   - every kernel that reads the cache, on an FP8 cache against the same kernel on a bf16 cache
//     holding the dequantized values: outputs must be equal bit for bit (the kernels dequantize
//     exactly and then run their bf16 arithmetic), and outputs are poisoned (NaN) first so that
//     an unwritten one shows. One exception: key scoring at head_dim 128 and group 4 runs on
//     tensor cores for FP8 keys (key_scores_mma.cu), checked against an fp64 reference instead;
//   - KvGather / KvScatter moving FP8 rows as bytes.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/model/fp8.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/kv_pack.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/selection.h"
#include "kernels/cuda/simple_attention.h"
#include "kernels/cuda/span_scoring.h"
#include "kernels/ops.h"
#include "tests/gpu/gpu_test_util.h"

namespace tokenselect::kernels::cuda {
namespace {

using engine::E4m3ToFloat;
using engine::FloatToE4m3;
using gpu_test::Bf16BitsToFloat;
using gpu_test::DeviceBuffer;
using gpu_test::FloatToBf16Bits;

__global__ void EncodeKernel(const float* in, uint8_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(in[i], __NV_SATFINITE, __NV_E4M3));
  }
}

__global__ void DecodeKernel(float* out) {
  const int code = threadIdx.x;
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
  out[code] = __half2float(__half(h));
}

float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

TEST(Fp8ConversionTest, DecodeMatchesTheCpuForEveryCode) {
  DeviceBuffer<float> out(256);
  DecodeKernel<<<1, 256>>>(out.get());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = out.Download();
  for (int code = 0; code < 256; ++code) {
    const float want = E4m3ToFloat(static_cast<uint8_t>(code));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got[code])) << code;
    } else {
      uint32_t a, b;
      std::memcpy(&a, &got[code], 4);
      std::memcpy(&b, &want, 4);
      EXPECT_EQ(a, b) << "code " << code;  // bitwise: signed zeros too
    }
  }
}

TEST(Fp8ConversionTest, EncodeMatchesTheIntrinsicOnManyFloats) {
  std::vector<float> in;
  // Every code's value, the midpoints between neighbours and one float either side of them.
  for (int code = 0; code < 256; ++code) {
    const float v = E4m3ToFloat(static_cast<uint8_t>(code));
    if (std::isnan(v)) continue;
    in.push_back(v);
    const float next = E4m3ToFloat(static_cast<uint8_t>(code + 1));
    if ((code & 0x7f) < 0x7e && !std::isnan(next)) {
      const float mid = (v + next) / 2;
      in.insert(in.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f),
                           std::nextafter(mid, -1e30f)});
    }
  }
  // Specials.
  const float inf = std::numeric_limits<float>::infinity();
  in.insert(in.end(), {inf, -inf, std::nanf(""), -std::nanf(""), 448.0f, 464.0f, 480.0f, -464.0f,
                       std::numeric_limits<float>::denorm_min(), -0.0f, 1e-30f, -1e-30f});
  // Random bit patterns (all exponents, subnormals, NaNs) and random values in e4m3's range.
  std::mt19937 rng(42);
  for (int i = 0; i < (1 << 22); ++i) in.push_back(BitsToFloat(static_cast<uint32_t>(rng())));
  std::uniform_real_distribution<float> mag(-12.0f, 9.5f);
  for (int i = 0; i < (1 << 22); ++i) {
    const float x = std::exp2(mag(rng));
    in.push_back((rng() & 1) != 0 ? -x : x);
  }
  const int64_t n = static_cast<int64_t>(in.size());
  DeviceBuffer<float> d_in(in);
  DeviceBuffer<uint8_t> d_out(in.size());
  EncodeKernel<<<1024, 256>>>(d_in.get(), d_out.get(), n);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint8_t> got = d_out.Download();
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t want = FloatToE4m3(in[i]);
    // Any NaN code is a NaN; the CPU writes 0x7f for every NaN input.
    const bool both_nan = std::isnan(in[i]) && (got[i] & 0x7f) == 0x7f;
    if (got[i] != want && !both_nan) {
      if (++mismatches <= 10) {
        uint32_t bits;
        std::memcpy(&bits, &in[i], 4);
        ADD_FAILURE() << "x = " << in[i] << " (0x" << std::hex << bits << "): GPU 0x"
                      << int{got[i]} << ", CPU 0x" << int{want};
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << n;
  // What the device gives for NaN (documented in docs/fp8_kv.md).
  std::printf("device e4m3 of NaN: 0x%02x, of -NaN: 0x%02x\n", got[in.size() - (2 << 22) - 10],
              got[in.size() - (2 << 22) - 9]);
}

// ---------------------------------------------------------------------------------------------
// An FP8 cache and the bf16 cache of its dequantized values.

struct Caches {
  int64_t num_slots = 0, kv_heads = 0, head_dim = 0;
  std::vector<float> k_scale, v_scale;  // [kv_heads], powers of two
  std::vector<uint8_t> k8, v8;          // e4m3 codes
  DeviceBuffer<uint8_t> d_k8, d_v8;
  DeviceBuffer<uint16_t> d_k16, d_v16;  // bf16 bits of float(code) * scale
  DeviceBuffer<float> d_k_scale, d_v_scale;

  Caches(int64_t slots, int64_t heads, int64_t dim, std::mt19937* rng)
      : num_slots(slots), kv_heads(heads), head_dim(dim) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const float choices[] = {0.0078125f, 0.015625f, 0.03125f, 0.0625f};
    for (int64_t h = 0; h < heads; ++h) {
      k_scale.push_back(choices[(*rng)() % 4]);
      v_scale.push_back(choices[(*rng)() % 4]);
    }
    const int64_t n = slots * heads * dim;
    k8.resize(static_cast<size_t>(n));
    v8.resize(static_cast<size_t>(n));
    std::vector<uint16_t> k16(static_cast<size_t>(n)), v16(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t h = (i / dim) % heads;
      // Values of a few units (the scale rule leaves typical keys far below 448 s).
      k8[i] = FloatToE4m3(2.0f * normal(*rng) / k_scale[h]);
      v8[i] = FloatToE4m3(normal(*rng) / v_scale[h]);
      k16[i] = FloatToBf16Bits(E4m3ToFloat(k8[i]) * k_scale[h]);
      v16[i] = FloatToBf16Bits(E4m3ToFloat(v8[i]) * v_scale[h]);
      // The dequantized value is exact in bf16.
      if (Bf16BitsToFloat(k16[i]) != E4m3ToFloat(k8[i]) * k_scale[h]) std::abort();
    }
    d_k8 = DeviceBuffer<uint8_t>(k8);
    d_v8 = DeviceBuffer<uint8_t>(v8);
    d_k16 = DeviceBuffer<uint16_t>(k16);
    d_v16 = DeviceBuffer<uint16_t>(v16);
    d_k_scale = DeviceBuffer<float>(k_scale);
    d_v_scale = DeviceBuffer<float>(v_scale);
  }
};

std::vector<uint16_t> RandomBf16(int64_t n, float stddev, std::mt19937* rng) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<uint16_t> out(static_cast<size_t>(n));
  for (uint16_t& b : out) b = FloatToBf16Bits(normal(*rng));
  return out;
}

const __nv_bfloat16* Bf16(const DeviceBuffer<uint16_t>& b) {
  return reinterpret_cast<const __nv_bfloat16*>(b.get());
}

// Asserts two bf16 outputs are bitwise equal and contain no NaN (all written).
void ExpectSameBits(const std::vector<uint16_t>& fp8, const std::vector<uint16_t>& bf16,
                    const char* what) {
  ASSERT_EQ(fp8.size(), bf16.size());
  int64_t diff = 0, nan = 0;
  for (size_t i = 0; i < fp8.size(); ++i) {
    diff += fp8[i] != bf16[i];
    nan += std::isnan(Bf16BitsToFloat(fp8[i]));
  }
  EXPECT_EQ(diff, 0) << what << ": outputs differing from the dequantized bf16 run";
  EXPECT_EQ(nan, 0) << what << ": NaN (unwritten) outputs";
}

TEST(Fp8KvAppendTest, StoresTheCpuCodes) {
  std::mt19937 rng(1);
  for (int64_t head_dim : {int64_t{64}, int64_t{6}}) {  // vector path, element path
    const int64_t heads = 4, row = heads * head_dim, tokens = 7, stride = 3 * row + 8;
    const int64_t slots = 20;
    std::vector<float> k_scale = {0.0625f, 0.125f, 0.015625f, 1.0f}, v_scale = {0.5f, 0.25f,
                                                                               0.03125f, 2.0f};
    const std::vector<uint16_t> src = RandomBf16(tokens * stride, 3.0f, &rng);
    const std::vector<int32_t> slot_ids = {3, 19, 0, 7, 11, 5, 14};
    DeviceBuffer<uint16_t> d_src(src);
    DeviceBuffer<int32_t> d_slots(slot_ids);
    DeviceBuffer<float> d_ks(k_scale), d_vs(v_scale);
    DeviceBuffer<uint8_t> kc(static_cast<size_t>(slots * row)), vc(static_cast<size_t>(slots * row));
    kc.Zero();
    vc.Zero();
    KvAppendParams p;
    p.k_cache = kc.get();
    p.v_cache = vc.get();
    p.k = Bf16(d_src) + 8;  // rows 16-byte aligned only for the vector case's stride
    p.v = Bf16(d_src) + 8 + row;
    p.slots = d_slots.get();
    p.num_tokens = tokens;
    p.row = row;
    p.src_stride = stride;
    p.num_slots = slots;
    p.kv_type = KvCacheType::kFp8E4M3;
    p.k_scale = d_ks.get();
    p.v_scale = d_vs.get();
    p.head_dim = head_dim;
    ASSERT_EQ(KvAppend(p, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint8_t> k = kc.Download(), v = vc.Download();
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t j = 0; j < row; ++j) {
        const int64_t h = j / head_dim;
        const float kx = Bf16BitsToFloat(src[t * stride + 8 + j]);
        const float vx = Bf16BitsToFloat(src[t * stride + 8 + row + j]);
        ASSERT_EQ(k[slot_ids[t] * row + j], FloatToE4m3(kx * (1.0f / k_scale[h])))
            << "d " << head_dim << " t " << t << " j " << j;
        ASSERT_EQ(v[slot_ids[t] * row + j], FloatToE4m3(vx * (1.0f / v_scale[h])));
      }
    }
    p.k_scale = nullptr;
    EXPECT_EQ(KvAppend(p, nullptr), cudaErrorInvalidValue);
  }
}

// Decode attention (tensor-core and CUDA-core split kernels, and the simple kernel).
TEST(Fp8AttentionTest, DecodeEqualsTheBf16KernelOverDequantizedValues) {
  struct Case {
    int64_t d, heads, kv_heads;
    bool tuned;
  };
  std::mt19937 rng(2);
  for (const Case& c : {Case{128, 32, 8, true}, Case{64, 8, 8, true}, Case{128, 16, 2, true},
                        Case{32, 8, 2, false}, Case{48, 6, 3, false}}) {
    const int64_t batch = 3, slots = 3000;
    Caches caches(slots, c.kv_heads, c.d, &rng);
    const std::vector<int32_t> indptr = {0, 1200, 1200 + 77, 1200 + 77 + 2500};
    std::vector<int32_t> indices(indptr.back()), positions(indptr.back());
    for (int32_t i = 0; i < indptr.back(); ++i) {
      indices[i] = static_cast<int32_t>(rng() % slots);
      positions[i] = i % 1500;
    }
    RopeParams rope;
    rope.head_dim = c.d;
    DeviceBuffer<float> inv_freq(RopeInverseFrequencies(rope));
    DeviceBuffer<uint16_t> q(RandomBf16(batch * c.heads * c.d, 1.0f, &rng));
    DeviceBuffer<int32_t> d_indptr(indptr), d_indices(indices), d_pos(positions),
        q_pos(std::vector<int32_t>{1500, 80, 2600});
    for (bool tensor_cores : {true, false}) {
      if (!c.tuned && !tensor_cores) continue;
      DecodeAttentionParams p;
      p.q = Bf16(q);
      p.q_positions = q_pos.get();
      p.indptr = d_indptr.get();
      p.indices = d_indices.get();
      p.kv_positions = d_pos.get();
      p.inv_freq = inv_freq.get();
      p.batch = batch;
      p.num_heads = c.heads;
      p.num_kv_heads = c.kv_heads;
      p.head_dim = c.d;
      p.num_splits = c.tuned ? 5 : 1;
      p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
      p.use_tensor_cores = tensor_cores;
      DeviceBuffer<char> ws(DecodeAttentionWorkspaceBytes(batch, c.heads, c.d, p.num_splits));
      p.workspace = ws.get();
      std::vector<uint16_t> outs[2];
      for (int fp8 = 0; fp8 < 2; ++fp8) {
        DeviceBuffer<uint16_t> out(static_cast<size_t>(batch * c.heads * c.d));
        out.Poison();
        p.out = reinterpret_cast<__nv_bfloat16*>(out.get());
        p.kv_type = fp8 ? KvCacheType::kFp8E4M3 : KvCacheType::kBf16;
        p.k_cache = fp8 ? static_cast<const void*>(caches.d_k8.get()) : caches.d_k16.get();
        p.v_cache = fp8 ? static_cast<const void*>(caches.d_v8.get()) : caches.d_v16.get();
        p.k_scale = fp8 ? caches.d_k_scale.get() : nullptr;
        p.v_scale = fp8 ? caches.d_v_scale.get() : nullptr;
        ASSERT_EQ(c.tuned ? DecodeAttention(p, nullptr) : SimpleDecodeAttention(p, nullptr),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        outs[fp8] = out.Download();
      }
      SCOPED_TRACE(testing::Message() << "d " << c.d << " h " << c.heads << "/" << c.kv_heads
                                      << (tensor_cores ? " tensor cores" : " cuda cores"));
      ExpectSameBits(outs[1], outs[0], "decode attention");
    }
  }
}

TEST(Fp8AttentionTest, PrefillEqualsTheBf16KernelOverDequantizedValues) {
  struct Case {
    int64_t d, heads, kv_heads;
    bool tuned;
    int splits;
  };
  std::mt19937 rng(3);
  for (const Case& c : {Case{128, 32, 8, true, 1}, Case{128, 32, 8, true, 3},
                        Case{64, 16, 8, true, 2}, Case{128, 8, 1, true, 1},
                        Case{32, 8, 2, false, 1}}) {
    const int64_t slots = 2000;
    Caches caches(slots, c.kv_heads, c.d, &rng);
    // Two requests: 70 queries over 900 entries (the last 70 are the chunk), 33 over 300.
    const std::vector<int32_t> q_indptr = {0, 70, 103}, kv_indptr = {0, 900, 1200};
    std::vector<int32_t> indices(1200), positions(1200), visible(103), q_pos(103);
    for (int32_t i = 0; i < 1200; ++i) {
      indices[i] = static_cast<int32_t>(rng() % slots);
      positions[i] = i < 900 ? i : i - 900;
    }
    for (int32_t i = 0; i < 70; ++i) {
      visible[i] = 830 + i + 1;
      q_pos[i] = 830 + i;
    }
    for (int32_t i = 0; i < 33; ++i) {
      visible[70 + i] = 267 + i + 1;
      q_pos[70 + i] = 267 + i;
    }
    RopeParams rope;
    rope.head_dim = c.d;
    DeviceBuffer<float> inv_freq(RopeInverseFrequencies(rope));
    const int64_t q_stride = c.heads * c.d + 2 * c.kv_heads * c.d;
    DeviceBuffer<uint16_t> q(RandomBf16(103 * q_stride, 1.0f, &rng));
    DeviceBuffer<int32_t> d_qi(q_indptr), d_kvi(kv_indptr), d_ind(indices), d_pos(positions),
        d_vis(visible), d_qpos(q_pos);
    PrefillAttentionParams p;
    p.q = Bf16(q);
    p.q_row_stride = q_stride;
    p.q_positions = d_qpos.get();
    p.q_indptr = d_qi.get();
    p.visible = d_vis.get();
    p.kv_indptr = d_kvi.get();
    p.kv_indices = d_ind.get();
    p.kv_positions = d_pos.get();
    p.inv_freq = inv_freq.get();
    p.batch = 2;
    p.total_q = 103;
    p.num_heads = c.heads;
    p.num_kv_heads = c.kv_heads;
    p.head_dim = c.d;
    p.max_q_len = 70;
    p.max_kv_len = 900;
    p.num_splits = c.splits;
    p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    // The tuned kernel with the list gathered first and without: all four the same bits.
    p.gather = PrefillGather::kOn;
    DeviceBuffer<char> ws(std::max<size_t>(1, PrefillAttentionWorkspaceBytes(p)));
    p.workspace = ws.get();
    std::vector<uint16_t> outs[4];
    for (int run = 0; run < (c.tuned ? 4 : 2); ++run) {
      const int fp8 = run % 2;
      p.gather = run < 2 ? PrefillGather::kOff : PrefillGather::kOn;
      DeviceBuffer<uint16_t> out(static_cast<size_t>(103 * c.heads * c.d));
      out.Poison();
      p.out = reinterpret_cast<__nv_bfloat16*>(out.get());
      p.kv_type = fp8 ? KvCacheType::kFp8E4M3 : KvCacheType::kBf16;
      p.k_cache = fp8 ? static_cast<const void*>(caches.d_k8.get()) : caches.d_k16.get();
      p.v_cache = fp8 ? static_cast<const void*>(caches.d_v8.get()) : caches.d_v16.get();
      p.k_scale = fp8 ? caches.d_k_scale.get() : nullptr;
      p.v_scale = fp8 ? caches.d_v_scale.get() : nullptr;
      ASSERT_EQ(c.tuned ? PrefillAttention(p, nullptr) : SimplePrefillAttention(p, nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      outs[run] = out.Download();
    }
    SCOPED_TRACE(testing::Message() << "d " << c.d << " h " << c.heads << "/" << c.kv_heads
                                    << " splits " << c.splits);
    ExpectSameBits(outs[1], outs[0], "prefill attention");
    if (c.tuned) {
      ExpectSameBits(outs[2], outs[0], "prefill attention, gathered bf16 list");
      ExpectSameBits(outs[3], outs[0], "prefill attention, gathered FP8 list");
    }
    p.kv_type = KvCacheType::kFp8E4M3;
    p.k_scale = nullptr;
    EXPECT_EQ(c.tuned ? PrefillAttention(p, nullptr) : SimplePrefillAttention(p, nullptr),
              cudaErrorInvalidValue);
  }
}

TEST(Fp8SelectionTest, KeyScoresAndQuestBoundsEqualTheBf16Kernels) {
  std::mt19937 rng(4);
  struct Case {
    int64_t d, heads, kv_heads;
  };
  for (const Case& c : {Case{128, 32, 8}, Case{64, 8, 4}, Case{128, 8, 8}}) {
    const int64_t slots = 5000, n = 4321;
    Caches caches(slots, c.kv_heads, c.d, &rng);
    std::vector<int32_t> slot_ids(static_cast<size_t>(n));
    for (int32_t& s : slot_ids) s = static_cast<int32_t>(rng() % slots);
    DeviceBuffer<int32_t> d_slots(slot_ids);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> query(static_cast<size_t>(c.heads * c.d));
    for (float& x : query) x = normal(rng);
    DeviceBuffer<float> d_query(query);
    // ScoreKeys: logits and the per-head statistics.
    std::vector<float> logits[2], stats[2];
    for (int fp8 = 0; fp8 < 2; ++fp8) {
      DeviceBuffer<float> d_logits(static_cast<size_t>(n * c.heads)), hmax(c.heads),
          hinv(c.heads);
      d_logits.Poison();
      hmax.Poison();
      hinv.Poison();
      DeviceBuffer<char> ws(ScoreKeysWorkspaceBytes(c.heads));
      ws.Zero();
      KeyScoreParams p;
      p.logits = d_logits.get();
      p.head_max = hmax.get();
      p.head_inv_sum = hinv.get();
      p.query = d_query.get();
      p.kv_type = fp8 ? KvCacheType::kFp8E4M3 : KvCacheType::kBf16;
      p.k_cache = fp8 ? static_cast<const void*>(caches.d_k8.get()) : caches.d_k16.get();
      p.k_scale = fp8 ? caches.d_k_scale.get() : nullptr;
      p.slots = d_slots.get();
      p.workspace = ws.get();
      p.n = n;
      p.num_heads = c.heads;
      p.num_kv_heads = c.kv_heads;
      p.head_dim = c.d;
      p.scale = 0.125f;
      ASSERT_EQ(ScoreKeys(p, nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      logits[fp8] = d_logits.Download();
      stats[fp8] = hmax.Download();
      const std::vector<float> inv = hinv.Download();
      stats[fp8].insert(stats[fp8].end(), inv.begin(), inv.end());
    }
    SCOPED_TRACE(testing::Message() << "d " << c.d << " h " << c.heads << "/" << c.kv_heads);
    EXPECT_TRUE(std::all_of(logits[1].begin(), logits[1].end(),
                            [](float x) { return std::isfinite(x); }));
    const int64_t group = c.heads / c.kv_heads;
    if (c.d == 128 && group == 4) {
      // The tensor-core kernel (key_scores_mma.cu) takes FP8 keys for this shape, with the query
      // in f16 parts: the logits agree with an fp64 reference over the dequantized keys to fp32
      // accuracy, relative to sum |q k| (as the bf16 kernel's do), not bit for bit.
      std::vector<double> ref(static_cast<size_t>(n * c.heads));
      double worst[2] = {0.0, 0.0};
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t h = 0; h < c.heads; ++h) {
          const int64_t kvh = h / group;
          double dot = 0.0, mag = 0.0;
          for (int64_t e = 0; e < c.d; ++e) {
            const int64_t i = (slot_ids[j] * c.kv_heads + kvh) * c.d + e;
            const double k = static_cast<double>(E4m3ToFloat(caches.k8[i])) * caches.k_scale[kvh];
            dot += static_cast<double>(query[h * c.d + e]) * k;
            mag += std::fabs(static_cast<double>(query[h * c.d + e]) * k);
          }
          const size_t at = static_cast<size_t>(j * c.heads + h);
          ref[at] = 0.125 * dot;
          for (int fp8 = 0; fp8 < 2; ++fp8) {
            const float got = logits[fp8][LogitIndex(j, h, n, c.heads)];
            worst[fp8] = std::max(worst[fp8], std::fabs(got - ref[at]) / (0.125 * mag));
          }
        }
      }
      std::printf("ScoreKeys d %lld h %lld/%lld: worst |logit - fp64| / sum|q k|: bf16 keys %.3g, "
                  "FP8 keys %.3g\n",
                  static_cast<long long>(c.d), static_cast<long long>(c.heads),
                  static_cast<long long>(c.kv_heads), worst[0], worst[1]);
      EXPECT_LT(worst[0], 2e-6);
      EXPECT_LT(worst[1], 2e-6);
      for (int64_t h = 0; h < c.heads; ++h) {
        double m = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < n; ++j) m = std::max(m, ref[j * c.heads + h]);
        for (int64_t j = 0; j < n; ++j) sum += std::exp(ref[j * c.heads + h] - m);
        for (int fp8 = 0; fp8 < 2; ++fp8) {
          EXPECT_NEAR(stats[fp8][h], m, 1e-5 * (1.0 + std::fabs(m))) << "head " << h;
          EXPECT_NEAR(stats[fp8][c.heads + h] * sum, 1.0, 1e-4) << "head " << h;
        }
      }
    } else {
      EXPECT_EQ(std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * 4), 0);
      EXPECT_EQ(std::memcmp(stats[0].data(), stats[1].data(), stats[0].size() * 4), 0);
    }
    // Quest page bounds over the candidates [n_init, n - n_local).
    std::vector<uint16_t> bounds[2];
    for (int fp8 = 0; fp8 < 2; ++fp8) {
      QuestBoundsParams bp;
      bp.problem.kv_type = fp8 ? KvCacheType::kFp8E4M3 : KvCacheType::kBf16;
      bp.problem.k_cache = fp8 ? static_cast<const void*>(caches.d_k8.get()) : caches.d_k16.get();
      bp.problem.k_scale = fp8 ? caches.d_k_scale.get() : nullptr;
      bp.problem.slots = d_slots.get();
      bp.problem.num_tokens = n;
      bp.problem.num_heads = c.heads;
      bp.problem.num_kv_heads = c.kv_heads;
      bp.problem.head_dim = c.d;
      bp.problem.n_init = 7;
      bp.problem.n_local = 33;
      bp.page_size = 16;
      const int64_t pages = QuestNumPages(bp.problem, 16);
      DeviceBuffer<uint16_t> d_bounds(static_cast<size_t>(pages * 2 * c.kv_heads * c.d));
      d_bounds.Poison();
      bp.page_bounds = reinterpret_cast<__nv_bfloat16*>(d_bounds.get());
      ASSERT_EQ(QuestBuildPageBounds(bp, nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      bounds[fp8] = d_bounds.Download();
    }
    ExpectSameBits(bounds[1], bounds[0], "Quest page bounds");
  }
}

// InfLLM on an FP8 cache: the received attention of a chunk, the representatives' block scores
// and the chosen blocks equal the bf16 kernels' over the dequantized keys, bit for bit.
TEST(Fp8SelectionTest, InfLlmEqualsTheBf16Kernels) {
  std::mt19937 rng(9);
  struct Case {
    int64_t d, heads, kv_heads;
  };
  for (const Case& c : {Case{128, 32, 8}, Case{64, 8, 2}}) {
    SCOPED_TRACE(testing::Message() << "d " << c.d << " h " << c.heads << "/" << c.kv_heads);
    const int64_t slots = 3000, n = 2500, chunk = 77, block = 32, reps = 3;
    Caches caches(slots, c.kv_heads, c.d, &rng);
    std::vector<int32_t> slot_ids(static_cast<size_t>(n));
    for (int32_t& s : slot_ids) s = static_cast<int32_t>(rng() % slots);
    DeviceBuffer<int32_t> d_slots(slot_ids);
    const int64_t row = c.heads * c.d;
    DeviceBuffer<uint16_t> d_q(RandomBf16(chunk * row, 1.0f, &rng));
    RopeParams rope;
    rope.head_dim = c.d;
    DeviceBuffer<float> d_inv(RopeInverseFrequencies(rope));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> query(static_cast<size_t>(row));
    for (float& x : query) x = normal(rng);
    DeviceBuffer<float> d_query(query);
    std::vector<float> received[2], scores[2];
    std::vector<int32_t> chosen[2];
    for (int fp8 = 0; fp8 < 2; ++fp8) {
      const KvCacheType type = fp8 ? KvCacheType::kFp8E4M3 : KvCacheType::kBf16;
      const void* k = fp8 ? static_cast<const void*>(caches.d_k8.get()) : caches.d_k16.get();
      const float* k_scale = fp8 ? caches.d_k_scale.get() : nullptr;
      // The received attention of the last chunk of the sequence's tokens.
      DeviceBuffer<float> d_received(static_cast<size_t>(n));
      d_received.Zero();
      DeviceBuffer<char> ws(ReceivedAttentionWorkspaceBytes(chunk, c.heads));
      ReceivedAttentionParams rp;
      rp.received = d_received.get() + (n - chunk);
      rp.workspace = ws.get();
      rp.q = reinterpret_cast<const __nv_bfloat16*>(d_q.get());
      rp.q_row_stride = row;
      rp.k_cache = k;
      rp.kv_type = type;
      rp.k_scale = k_scale;
      rp.slots = d_slots.get() + (n - chunk);
      rp.first_position = n - chunk;
      rp.num_new = chunk;
      rp.num_heads = c.heads;
      rp.num_kv_heads = c.kv_heads;
      rp.head_dim = c.d;
      rp.inv_freq = d_inv.get();
      rp.scale = 0.125f;
      ASSERT_EQ(ChunkReceivedAttention(rp, nullptr), cudaSuccess);
      // Random received attention for the earlier tokens, the same for both caches.
      std::mt19937 fill(17);
      std::vector<float> earlier(static_cast<size_t>(n - chunk));
      for (float& x : earlier) x = static_cast<float>(fill() % 1000);
      ASSERT_EQ(
          cudaMemcpy(d_received.get(), earlier.data(), earlier.size() * 4, cudaMemcpyHostToDevice),
          cudaSuccess);
      SelectionProblem pr;
      pr.query = d_query.get();
      pr.k_cache = k;
      pr.kv_type = type;
      pr.k_scale = k_scale;
      pr.slots = d_slots.get();
      pr.num_tokens = n;
      pr.num_heads = c.heads;
      pr.num_kv_heads = c.kv_heads;
      pr.head_dim = c.d;
      pr.scale = 0.125f;
      pr.n_init = 5;
      pr.k = 8 * block;
      pr.n_local = 40;
      const int64_t blocks = InfLlmNumBlocks(pr, block);
      DeviceBuffer<int32_t> d_reps(static_cast<size_t>(blocks * reps));
      InfLlmRepsParams rep;
      rep.rep_slots = d_reps.get();
      rep.received = d_received.get();
      rep.received_size = n;
      rep.problem = pr;
      rep.block_size = block;
      rep.reps = reps;
      ASSERT_EQ(InfLlmRepresentatives(rep, nullptr), cudaSuccess);
      DeviceBuffer<float> d_scores(static_cast<size_t>(blocks));
      d_scores.Poison();
      const int64_t cap = SelectionCapacity(pr);
      DeviceBuffer<int32_t> d_tokens(static_cast<size_t>(cap)), d_count(1);
      DeviceBuffer<char> sel_ws(InfLlmSelectWorkspaceBytes(blocks, pr.k, block));
      InfLlmSelectParams ip;
      ip.out.tokens = d_tokens.get();
      ip.out.num_selected = d_count.get();
      ip.block_scores = d_scores.get();
      ip.rep_slots = d_reps.get();
      ip.problem = pr;
      ip.block_size = block;
      ip.reps = reps;
      ip.workspace = sel_ws.get();
      ASSERT_EQ(InfLlmSelect(ip, nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      received[fp8] = d_received.Download();
      scores[fp8] = d_scores.Download();
      chosen[fp8] = d_tokens.Download();
      chosen[fp8].resize(static_cast<size_t>(d_count.Download()[0]));
    }
    EXPECT_TRUE(
        std::all_of(scores[1].begin(), scores[1].end(), [](float x) { return std::isfinite(x); }));
    EXPECT_EQ(std::memcmp(received[0].data(), received[1].data(), received[0].size() * 4), 0);
    EXPECT_EQ(std::memcmp(scores[0].data(), scores[1].data(), scores[0].size() * 4), 0);
    EXPECT_EQ(chosen[1], chosen[0]);
    EXPECT_EQ(chosen[1].size(), static_cast<size_t>(5 + 8 * block + 40));
  }
}

TEST(Fp8KvPackTest, GatherAndScatterMoveFp8Bytes) {
  std::mt19937 rng(5);
  const int64_t layers = 3, slots = 64, row = 2 * 64, tokens = 21;
  std::vector<std::vector<uint8_t>> k(layers), v(layers);
  std::vector<DeviceBuffer<uint8_t>> dk, dv;
  std::vector<uint8_t*> kp, vp;
  for (int64_t l = 0; l < layers; ++l) {
    k[l].resize(slots * row);
    v[l].resize(slots * row);
    for (auto& b : k[l]) b = static_cast<uint8_t>(rng());
    for (auto& b : v[l]) b = static_cast<uint8_t>(rng());
    dk.emplace_back(k[l]);
    dv.emplace_back(v[l]);
    kp.push_back(dk.back().get());
    vp.push_back(dv.back().get());
  }
  std::vector<int32_t> slot_ids(tokens);
  for (int32_t& s : slot_ids) s = static_cast<int32_t>(rng() % slots);
  slot_ids[4] = -1;  // outside: gathered as a zero row
  DeviceBuffer<uint8_t*> d_kp(kp), d_vp(vp);
  DeviceBuffer<int32_t> d_slots(slot_ids);
  DeviceBuffer<uint8_t> staging(static_cast<size_t>(layers * 2 * tokens * row));
  staging.Poison();
  KvGatherParams g;
  g.staging = reinterpret_cast<__nv_bfloat16*>(staging.get());
  g.k_layers = reinterpret_cast<const __nv_bfloat16* const*>(d_kp.get());
  g.v_layers = reinterpret_cast<const __nv_bfloat16* const*>(d_vp.get());
  g.slots = d_slots.get();
  g.num_layers = layers;
  g.num_tokens = tokens;
  g.row = row;
  g.num_slots = slots;
  g.elem_bytes = 1;
  ASSERT_EQ(KvGather(g, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint8_t> got = staging.Download();
  for (int64_t l = 0; l < layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      for (int64_t t = 0; t < tokens; ++t) {
        const uint8_t* staged = got.data() + ((l * 2 + kv) * tokens + t) * row;
        for (int64_t j = 0; j < row; ++j) {
          const uint8_t want =
              slot_ids[t] < 0 ? 0 : (kv == 0 ? k[l] : v[l])[slot_ids[t] * row + j];
          ASSERT_EQ(staged[j], want) << l << " " << kv << " " << t << " " << j;
        }
      }
    }
  }
  // Scatter into fresh caches at other slots (odd row length: the byte path).
  for (int64_t r : {row, int64_t{37}}) {
    std::vector<DeviceBuffer<uint8_t>> ek, ev;
    std::vector<uint8_t*> ekp, evp;
    for (int64_t l = 0; l < layers; ++l) {
      ek.emplace_back(static_cast<size_t>(slots * r));
      ev.emplace_back(static_cast<size_t>(slots * r));
      ek.back().Zero();
      ev.back().Zero();
      ekp.push_back(ek.back().get());
      evp.push_back(ev.back().get());
    }
    DeviceBuffer<uint8_t*> d_ekp(ekp), d_evp(evp);
    std::vector<int32_t> dst_slots(tokens);
    for (int64_t t = 0; t < tokens; ++t) dst_slots[t] = static_cast<int32_t>(slots - 1 - 2 * t);
    DeviceBuffer<int32_t> d_dst(dst_slots);
    std::vector<uint8_t> payload(static_cast<size_t>(layers * 2 * tokens * r));
    for (auto& b : payload) b = static_cast<uint8_t>(rng());
    DeviceBuffer<uint8_t> d_payload(payload);
    KvScatterParams s;
    s.k_layers = reinterpret_cast<__nv_bfloat16* const*>(d_ekp.get());
    s.v_layers = reinterpret_cast<__nv_bfloat16* const*>(d_evp.get());
    s.staging = reinterpret_cast<const __nv_bfloat16*>(d_payload.get());
    s.slots = d_dst.get();
    s.num_layers = layers;
    s.num_tokens = tokens;
    s.row = r;
    s.num_slots = slots;
    s.elem_bytes = 1;
    ASSERT_EQ(KvScatter(s, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (int64_t l = 0; l < layers; ++l) {
      const std::vector<uint8_t> ck = ek[l].Download(), cv = ev[l].Download();
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t j = 0; j < r; ++j) {
          ASSERT_EQ(ck[dst_slots[t] * r + j], payload[((l * 2) * tokens + t) * r + j]);
          ASSERT_EQ(cv[dst_slots[t] * r + j], payload[((l * 2 + 1) * tokens + t) * r + j]);
        }
      }
    }
    s.elem_bytes = 4;
    EXPECT_EQ(KvScatter(s, nullptr), cudaErrorInvalidValue);
  }
}

}  // namespace
}  // namespace tokenselect::kernels::cuda
