// Pools and tables with known K/V contents for the transfer tests.
#ifndef TOKENSELECT_TESTS_UNIT_ENGINE_TRANSFER_KV_TEST_UTIL_H_
#define TOKENSELECT_TESTS_UNIT_ENGINE_TRANSFER_KV_TEST_UTIL_H_

#include <cstdint>
#include <memory>

#include "engine/kvcache/page_pool.h"
#include "engine/kvcache/token_table.h"
#include "gtest/gtest.h"

namespace tokenselect::engine::testing {

inline std::unique_ptr<PagePool> MakePool(int64_t layers, int64_t kv_heads, int64_t head_dim,
                                          int64_t pages, int64_t page_size) {
  PagePoolOptions o;
  o.num_pages = pages;
  o.page_size = page_size;
  o.num_layers = layers;
  o.num_kv_heads = kv_heads;
  o.head_dim = head_dim;
  auto pool = PagePool::Create(o);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return std::move(pool).value();
}

// A value unique to (layer, k/v, token, element).
inline float Pattern(int64_t layer, int kv, int64_t token, int64_t e) {
  return static_cast<float>(layer * 100000 + kv * 50000 + token * 100 + e) * 0.5f;
}

// Writes Pattern into tokens [0, n) of `table` (reserving them) in every layer.
inline void FillTable(TokenTable* table, int64_t n) {
  ASSERT_TRUE(table->Reserve(n).ok());
  PagePool* pool = table->pool();
  const int64_t stride = pool->slot_stride();
  for (int64_t l = 0; l < pool->options().num_layers; ++l) {
    for (int64_t t = 0; t < n; ++t) {
      const int64_t slot = table->Slot(t);
      for (int64_t e = 0; e < stride; ++e) {
        pool->k(l)[slot * stride + e] = Pattern(l, 0, t, e);
        pool->v(l)[slot * stride + e] = Pattern(l, 1, t, e);
      }
    }
  }
}

// Expects tokens [0, n) of `table` to hold Pattern in every layer.
inline void ExpectPattern(const TokenTable& table, int64_t n) {
  const PagePool* pool = table.pool();
  const int64_t stride = pool->slot_stride();
  for (int64_t l = 0; l < pool->options().num_layers; ++l) {
    for (int64_t t = 0; t < n; ++t) {
      const int64_t slot = table.Slot(t);
      for (int64_t e = 0; e < stride; ++e) {
        ASSERT_EQ(pool->k(l)[slot * stride + e], Pattern(l, 0, t, e)) << l << " " << t;
        ASSERT_EQ(pool->v(l)[slot * stride + e], Pattern(l, 1, t, e)) << l << " " << t;
      }
    }
  }
}

}  // namespace tokenselect::engine::testing

#endif  // TOKENSELECT_TESTS_UNIT_ENGINE_TRANSFER_KV_TEST_UTIL_H_
