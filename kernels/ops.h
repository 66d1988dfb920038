// The operations the engine's forward pass is made of. Each family has one params struct
// (pointers, lengths, strides; passed by value) and a reference implementation in kernels/cpu/
// (fp32, OpenBLAS GEMMs, OpenMP). The CUDA backend implements the same families over bf16
// storage in kernels/cuda/ and is checked against these CPU versions.
//
// Layout conventions (row-major, innermost last):
//   activations  x: [num_tokens, dim]
//   linear weight W: [out_features, in_features] (Hugging Face nn.Linear layout), y = x W^T + b
//   q:            [num_tokens, num_heads, head_dim]
//   k/v cache:    [num_slots, num_kv_heads, head_dim]; keys are stored UN-rotated
// RoPE follows the Hugging Face Llama convention ("rotate_half"): dimension i < head_dim / 2 is
// paired with i + head_dim / 2, angle = position * inv_freq[i].
#ifndef TOKENSELECT_KERNELS_OPS_H_
#define TOKENSELECT_KERNELS_OPS_H_

#include <cstdint>
#include <vector>

namespace tokenselect::kernels {

enum class RopeScaling { kNone, kLinear, kLlama3 };

struct RopeParams {
  int64_t head_dim = 128;
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::kNone;
  double factor = 1.0;             // linear and llama3
  double low_freq_factor = 1.0;    // llama3
  double high_freq_factor = 4.0;   // llama3
  int64_t original_max_position = 8192;  // llama3: original_max_position_embeddings
};

// inv_freq[head_dim / 2] exactly as transformers computes it (fp32 result of the fp32/fp64
// formulas of its rope-init functions), including the linear and llama3 scalings.
std::vector<float> RopeInverseFrequencies(const RopeParams& params);

// Attention of queries over an arbitrary list of cached tokens ("token-index list"), with RoPE
// applied at gather time: key j of the list is rotated at kv_positions[j], query i at
// q_positions[i]. With kv_positions = 0..kv_len-1 this is the compact-positions mechanism of
// docs/architecture.md; with the true positions of the full list it is ordinary attention.
struct GatherAttentionParams {
  float* out = nullptr;                  // [num_queries, num_heads, head_dim]
  const float* q = nullptr;              // [num_queries, num_heads, head_dim], un-rotated
  const int32_t* q_positions = nullptr;  // [num_queries]
  const float* k_cache = nullptr;        // [num_slots, num_kv_heads, head_dim], un-rotated
  const float* v_cache = nullptr;        // [num_slots, num_kv_heads, head_dim]
  const int32_t* kv_slots = nullptr;     // [kv_len]: cache slot of each attended token, in order
  const int32_t* kv_positions = nullptr; // [kv_len]: RoPE position of each attended token
  // [num_queries]: query i attends to list entries [0, visible[i]) (causal masks are prefixes
  // of the list: selected tokens first, then the current chunk); nullptr: all kv_len entries.
  const int32_t* visible = nullptr;
  const float* inv_freq = nullptr;       // [head_dim / 2]
  int64_t num_queries = 0;
  int64_t kv_len = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;              // query head h uses kv head h / (num_heads / num_kv_heads)
  int64_t head_dim = 0;
  float scale = 0.0f;                    // softmax scale, usually 1 / sqrt(head_dim)
};

namespace cpu {

// out[i, :] = table[ids[i], :]. table: [vocab, dim].
void Embedding(float* out, const float* table, const int32_t* ids, int64_t num_tokens,
               int64_t dim);

// out = x / sqrt(mean(x^2) + eps) * weight, per row. out may alias x.
void RmsNorm(float* out, const float* x, const float* weight, int64_t rows, int64_t dim,
             float eps);

// y[m, n] = x[m, k] W[n, k]^T (+ bias[n] when bias is not null). sgemm through OpenBLAS.
void Linear(float* y, const float* x, const float* w, const float* bias, int64_t m, int64_t k,
            int64_t n);

// out = silu(gate) * up, elementwise over n values. out may alias gate or up.
void SwiGlu(float* out, const float* gate, const float* up, int64_t n);

// x += y over n values.
void AddInPlace(float* x, const float* y, int64_t n);

// Numerically stable softmax of each row, in place.
void Softmax(float* x, int64_t rows, int64_t cols);

// Rotates x: [num_tokens, num_heads, head_dim] in place, token t at positions[t].
void ApplyRope(float* x, const int32_t* positions, int64_t num_tokens, int64_t num_heads,
               int64_t head_dim, const float* inv_freq);

// See GatherAttentionParams. Scratch memory is bounded (keys are processed in tiles with an
// online softmax), so kv_len may be in the millions.
void GatherAttention(const GatherAttentionParams& params);

}  // namespace cpu
}  // namespace tokenselect::kernels

#endif  // TOKENSELECT_KERNELS_OPS_H_
