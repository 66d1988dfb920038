// Helpers of the GPU model tests that hold CudaModel against the CPU Model (the oracle):
// cuda_model_test.cc (bf16 KV) and fp8_model_test.cc (FP8 KV).
#ifndef TOKENSELECT_TESTS_GPU_CPU_ORACLE_TEST_UTIL_H_
#define TOKENSELECT_TESTS_GPU_CPU_ORACLE_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/kvcache/token_table.h"
#include "engine/model/cuda_model.h"
#include "engine/model/model.h"
#include "engine/model/weights.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace tokenselect::gpu_test {

inline int32_t CpuArgmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// `w` with every tensor rounded to bf16 (what CudaModel holds), for a CPU oracle of the GPU's
// arithmetic.
inline engine::ModelWeights RoundedToBf16(engine::ModelWeights w) {
  auto round = [](std::vector<float>* v) {
    for (float& f : *v) f = RoundBf16(f);
  };
  round(&w.embed_tokens);
  round(&w.norm);
  round(&w.lm_head_weight);
  for (engine::LayerWeights& l : w.layers) {
    for (std::vector<float>* v :
         {&l.input_layernorm, &l.q_proj, &l.q_bias, &l.k_proj, &l.k_bias, &l.v_proj, &l.v_bias,
          &l.o_proj, &l.o_bias, &l.post_attention_layernorm, &l.gate_proj, &l.gate_bias, &l.up_proj,
          &l.up_bias, &l.down_proj, &l.down_bias}) {
      round(v);
    }
  }
  return w;
}

// Teacher forcing: `gpu` (reset first) and the CPU model `cpu` (its K/V in `table`) run `steps`
// steps from `tokens`, each step then continuing both with the CPU's argmax. Appends every step's
// relative L2 of the GPU's logits to the CPU's to `rel` and adds to `agree` the steps whose GPU
// greedy token is that argmax. Call it in ASSERT_NO_FATAL_FAILURE.
inline void TeacherForce(const engine::Model& cpu, engine::TokenTable* table,
                         engine::CudaModel* gpu, std::vector<int32_t> tokens, int steps,
                         std::vector<double>* rel, int* agree) {
  engine::ForwardWorkspace ws;
  std::vector<float> cpu_logits, gpu_logits;
  gpu->Reset();
  for (int step = 0; step < steps; ++step) {
    engine::ForwardRequest request;
    request.tokens = tokens;
    request.table = table;
    ASSERT_TRUE(cpu.Forward(request, &ws, &cpu_logits).ok());
    ASSERT_TRUE(gpu->Forward(tokens, &gpu_logits).ok());
    rel->push_back(
        RelativeL2(gpu_logits.data(), cpu_logits.data(), static_cast<int64_t>(cpu_logits.size())));
    const int32_t want = CpuArgmax(cpu_logits);
    auto got = gpu->GreedyToken();
    ASSERT_TRUE(got.ok()) << got.status();
    *agree += *got == want ? 1 : 0;
    tokens = {want};
  }
}

}  // namespace tokenselect::gpu_test

#endif  // TOKENSELECT_TESTS_GPU_CPU_ORACLE_TEST_UTIL_H_
