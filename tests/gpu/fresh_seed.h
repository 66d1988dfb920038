// A fresh random seed for a GPU test's inputs (a new one on every run, as the kernels' tests
// use), named in every failure reported while it lives (a gtest ScopedTrace), so that a failing
// run can be repeated with the same inputs.
#ifndef TOKENSELECT_TESTS_GPU_FRESH_SEED_H_
#define TOKENSELECT_TESTS_GPU_FRESH_SEED_H_

#include <cstdint>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace tokenselect::gpu_test {

class FreshSeed {
 public:
  FreshSeed() : value_(std::random_device{}()), trace_(__FILE__, __LINE__, Describe(value_)) {}
  FreshSeed(const FreshSeed&) = delete;
  FreshSeed& operator=(const FreshSeed&) = delete;

  uint32_t value() const { return value_; }

 private:
  static std::string Describe(uint32_t value) { return "random seed " + std::to_string(value); }

  uint32_t value_;
  ::testing::ScopedTrace trace_;
};

}  // namespace tokenselect::gpu_test

#endif  // TOKENSELECT_TESTS_GPU_FRESH_SEED_H_
