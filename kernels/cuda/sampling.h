// Token choice on the GPU from fp32 logits: greedy argmax and random sampling with temperature,
// min_p, top_k and top_p, the GPU counterpart of engine/sampling's TokenDistribution + Sampler
// (penalties are not applied here).
//
// Rules (the same as engine/sampling/token_distribution.h, so both backends pick the same token):
//   - "More likely first" orders by logit, ties to the lower id: a total order.
//   - Greedy (temperature <= 0): the most likely token, i.e. the argmax with the LOWEST id among
//     equal maxima. NaN logits are ignored; a row of NaNs only gives -1.
//   - Random: weight_i = exp((logit_i - max) / T) (fp32 exp of the double-scaled logit); min_p
//     (and the float-underflow cut) keep logit >= max + T * log(max(min_p, FLT_MIN)); top_k keeps
//     the k most likely survivors; top_p keeps the shortest most-likely prefix of those whose
//     weight reaches top_p times their total weight; then the inverse-CDF pick in ascending id
//     order: the first kept token whose cumulative weight exceeds u * total.
//   - The uniform u of each row comes from the caller (engine: Prng::ForStep(seed, step)
//     .NextDouble()), so a seeded request draws the same tokens on either backend: results agree
//     except where u * total, or top_p's target, falls within ~1e-7 (relative) of a cumulative
//     weight (fp32 exp differs between libm and CUDA by an ulp or two; top_p's prefix masses are
//     summed in 2^-40 fixed point here, exactly and deterministically).
//   - A row without a finite logit gives -1.
//
// One block of 512 threads per row (batch rows run in parallel); everything stays in the row's
// logits (L2-resident), ~12 passes over the vocab for random rows with top_k and top_p, one for
// greedy rows. Deterministic: no floating-point atomics.
// Measured on H200 at vocab 128256: Argmax 13 us per launch (1 or 64 rows); Sample with top_k
// or top_p 0.9-1.1 ms (1 or 64 rows): one block per row is instruction-bound (every radix pass
// touches all tokens on one SM). To do: spread a row over many blocks (grid-wide histograms as
// in top_k.cu's radix select) and drop the per-element __match_any_sync.
#ifndef TOKENSELECT_KERNELS_CUDA_SAMPLING_H_
#define TOKENSELECT_KERNELS_CUDA_SAMPLING_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tokenselect::kernels::cuda {

// out[r] = the lowest id among the maxima of logits[r, :] (NaN ignored; -1 if all NaN). When
// `refused` is not null, refused[r] = 1 if row r holds a NaN or +inf or only -inf (the rows the
// CPU sampler refuses with InvalidArgument), else 0.
cudaError_t Argmax(int32_t* out, const float* logits, int64_t rows, int64_t vocab,
                   cudaStream_t stream, int32_t* refused = nullptr);

struct SampleParams {
  int32_t* out = nullptr;              // [rows]: chosen ids
  const float* logits = nullptr;       // [rows, vocab]
  const float* temperature = nullptr;  // [rows]; <= 0: greedy
  const int32_t* top_k = nullptr;      // [rows] or nullptr; <= 0 or >= vocab: off
  const float* top_p = nullptr;        // [rows] or nullptr; >= 1: off
  const float* min_p = nullptr;        // [rows] or nullptr; <= 0: off
  const double* uniforms = nullptr;    // [rows], in [0, 1) (unused by greedy rows)
  int64_t rows = 0;
  int64_t vocab = 0;  // < 2^31
};

// All per-row arrays are device memory. cudaErrorInvalidValue for bad sizes or null pointers.
cudaError_t Sample(const SampleParams& params, cudaStream_t stream);

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_SAMPLING_H_
