#include "engine/transfer/kv_format.h"

#include <set>
#include <tuple>

#include "gtest/gtest.h"
#include "tests/unit/engine/transfer/kv_test_util.h"

namespace tokenselect::engine {
namespace {

using testing::FillTable;
using testing::MakePool;
using testing::Pattern;

TEST(KvFormatTest, DTypeSizes) {
  EXPECT_EQ(KvDTypeSize(KvDType::kF32), 4);
  EXPECT_EQ(KvDTypeSize(KvDType::kF16), 2);
  EXPECT_EQ(KvDTypeSize(KvDType::kBF16), 2);
  EXPECT_EQ(KvDTypeSize(KvDType::kFp8E4M3), 1);
  EXPECT_EQ(KvDTypeSize(KvDType::kUnspecified), 0);
  EXPECT_EQ(KvDTypeName(KvDType::kBF16), "bf16");
}

TEST(KvFormatTest, ChecksumIsFnv1a64) {
  EXPECT_EQ(KvChecksum(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(KvChecksum("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_NE(KvChecksum("ab"), KvChecksum("ba"));
}

TEST(KvFormatTest, LayoutMismatchNamesTheField) {
  KvLayout a{4, 2, 8, KvDType::kF32};
  KvLayout b = a;
  EXPECT_TRUE(CheckLayoutsMatch(a, b).ok());
  b.head_dim = 16;
  absl::Status s = CheckLayoutsMatch(a, b);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("head_dim"), std::string::npos) << s;
  b = a;
  b.dtype = KvDType::kBF16;
  EXPECT_NE(CheckLayoutsMatch(a, b).message().find("dtype"), std::string::npos);
}

// Every (layer, token) of the range is covered exactly once, each layer's tokens in order, and
// no block exceeds the limit unless it is a single token of a single layer.
void ExpectPlanCovers(const KvLayout& layout, int64_t begin, int64_t end, int64_t max_bytes) {
  std::vector<KvBlockRange> plan = PlanKvBlocks(layout, begin, end, max_bytes);
  ASSERT_FALSE(plan.empty());
  std::vector<int64_t> next(static_cast<size_t>(layout.num_layers), begin);
  for (const KvBlockRange& r : plan) {
    const int64_t bytes = KvBlockBytes(layout, r);
    if (r.layer_end - r.layer_begin > 1 || r.token_end - r.token_begin > 1) {
      EXPECT_LE(bytes, max_bytes);
    }
    for (int32_t l = r.layer_begin; l < r.layer_end; ++l) {
      EXPECT_EQ(next[static_cast<size_t>(l)], r.token_begin);
      next[static_cast<size_t>(l)] = r.token_end;
    }
  }
  for (int64_t n : next) EXPECT_EQ(n, end);
}

TEST(KvFormatTest, PlanCoversEveryLayerAndToken) {
  const KvLayout layout{6, 2, 8, KvDType::kF32};  // 128 bytes per token and layer (K + V)
  ExpectPlanCovers(layout, 0, 10, 1 << 20);       // all layers in one block
  EXPECT_EQ(PlanKvBlocks(layout, 0, 10, 1 << 20).size(), 1u);
  ExpectPlanCovers(layout, 5, 15, 2 * 1280);  // two layers per block
  EXPECT_EQ(PlanKvBlocks(layout, 5, 15, 2 * 1280).size(), 3u);
  ExpectPlanCovers(layout, 0, 10, 300);  // token slices of one layer
  ExpectPlanCovers(layout, 0, 3, 1);     // below one token: one token per block
  EXPECT_TRUE(PlanKvBlocks(layout, 4, 4, 1024).empty());
}

TEST(KvFormatTest, EncodeCopiesKThenVPerLayer) {
  auto pool = MakePool(3, 2, 4, 8, 4);
  TokenTable table(pool.get(), "r");
  FillTable(&table, 6);
  const KvBlockRange range{1, 3, 2, 5};
  auto block = EncodeKvBlock(*pool, range, table.Slots(2, 5), 7, /*checksum=*/true);
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_EQ(block->sequence, 7);
  EXPECT_EQ(block->shape, (std::vector<int64_t>{2, 2, 3, 2, 4}));
  ASSERT_EQ(block->data.size(), 2u * 2 * 3 * 8 * sizeof(float));
  ASSERT_TRUE(block->checksum.has_value());
  EXPECT_EQ(*block->checksum, KvChecksum(block->data));
  const float* f = reinterpret_cast<const float*>(block->data.data());
  // [layer 2 - 1][v][token 4 - 2][element 5]
  EXPECT_EQ(f[((1 * 2 + 1) * 3 + 2) * 8 + 5], Pattern(2, 1, 4, 5));
  EXPECT_EQ(f[0], Pattern(1, 0, 2, 0));

  auto no_sum = EncodeKvBlock(*pool, range, table.Slots(2, 5), 0, false);
  ASSERT_TRUE(no_sum.ok());
  EXPECT_FALSE(no_sum->checksum.has_value());
}

TEST(KvFormatTest, EncodeRejectsBadRanges) {
  auto pool = MakePool(2, 1, 4, 4, 4);
  TokenTable table(pool.get(), "r");
  FillTable(&table, 4);
  EXPECT_EQ(EncodeKvBlock(*pool, {0, 3, 0, 2}, table.Slots(0, 2), 0, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeKvBlock(*pool, {1, 1, 0, 2}, table.Slots(0, 2), 0, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeKvBlock(*pool, {0, 1, 0, 3}, table.Slots(0, 2), 0, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> bad_slot = {0, 99};
  EXPECT_EQ(EncodeKvBlock(*pool, {0, 1, 0, 2}, bad_slot, 0, false).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tokenselect::engine
