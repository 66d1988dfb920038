// Linear layers on the GPU through cuBLASLt: y = x W^T (+ bias) (+ y), bf16 operands, fp32
// accumulation, bf16 or fp32 output. The GPU counterpart of cpu::Linear (kernels/ops.h); W keeps
// the Hugging Face nn.Linear layout [out_features, in_features], so no weight is repacked.
//
// Row-major y [m, n] is column-major [n, m]: cuBLASLt computes D[n, m] = op(A) B with A = W
// (column-major [k, n], transposed) and B = x (column-major [k, m]): the "TN" product, where the
// k dimension is contiguous in both operands. The bias epilogue adds bias[n] to every row of y.
//
// GemmRunner owns the cuBLASLt handle, a 32 MiB workspace and a plan cache: one matmul
// descriptor, three layouts and the heuristic's best algorithm per (m, n, k, output type, bias,
// accumulate, operand alignment, strides, plan_n). The first call of a shape asks the heuristic
// (host work, no device synchronisation); later calls only launch, so a warm runner is CUDA-graph
// friendly. Not thread-safe: one runner per thread of execution (the workspace is shared by its
// launches, which is safe only on one stream at a time).
//
// Linking: libcublasLt is shared only (the toolkit here ships no static archive; the .so is
// ~540 MB), so this lives in its own library, ts_kernels_cuda_gemm. A GPU bundle of a binary that
// links it must not carry the .so (the device tool carries at most 64 MiB): drop lib/libcublas*
// from the bundle and put the GPU host's /usr/local/cuda/lib64 (CUDA 13, same major version) on
// LD_LIBRARY_PATH.
//
// Measured on H200 (bench/model_cuda_bench.cc): 797-817 TFLOP/s at 8192^3; Llama-3-8B GEMMs at
// m = 512 reach 72-97% of that; at m = 1 the weight stream reaches 44-55% of the copy bandwidth
// for 32-48 MiB weights (launch/tail bound), 78-103% for the MLP and the lm_head.
#ifndef TOKENSELECT_KERNELS_CUDA_GEMM_H_
#define TOKENSELECT_KERNELS_CUDA_GEMM_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace tokenselect::kernels::cuda {

enum class GemmOutput { kBf16, kFp32 };

struct LinearParams {
  void* y = nullptr;                 // [m, n], bf16 or fp32 (out)
  const __nv_bfloat16* x = nullptr;  // [m, k]
  const __nv_bfloat16* w = nullptr;  // [n, k], HF nn.Linear layout
  // [n] or nullptr, of the output's type (bf16 for kBf16, fp32 for kFp32): cuBLASLt's bias
  // epilogue reads the bias in the output type.
  const void* bias = nullptr;
  int64_t m = 0;
  int64_t k = 0;
  int64_t n = 0;
  GemmOutput out = GemmOutput::kBf16;
  // y += x W^T (+ bias) (beta = 1): with fp32 output this is the residual add of a transformer
  // block (o_proj, down_proj) fused into the GEMM's epilogue.
  bool accumulate = false;
  // Elements between consecutive rows of x and of w; 0: k (contiguous). A larger stride reads a
  // k-slice of a wider matrix (the K-sliced row-parallel GEMMs of TP-invariant numerics).
  int64_t x_stride = 0;
  int64_t w_stride = 0;
  // Tensor-parallel invariance (docs/parallel.md "TP-invariant numerics"). > 0: the algorithm is
  // chosen for a canonical problem - n = plan_n, contiguous operands, 16-byte alignment, split-K
  // only reduced in fp32 workspace (never in place in y) - and run on this one, so every
  // element of y is computed by the same kernel in the same order whatever n and the strides
  // are: a tensor-parallel shard's columns (n = plan_n / T) get the bits of the whole GEMM's,
  // and a k-slice read in place from a wider matrix the bits of the same slice held alone.
  // Operands must then be 16-byte aligned.
  int64_t plan_n = 0;
};

class GemmRunner {
 public:
  // Creates the cuBLASLt handle and allocates the workspace on the current device. Returns
  // cudaErrorMemoryAllocation or cudaErrorUnknown (handle creation failed) with *runner unset.
  static cudaError_t Create(std::unique_ptr<GemmRunner>* runner);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // One cublasLtMatmul on `stream`. m == 0 or n == 0 does nothing. Returns cudaErrorInvalidValue
  // for negative sizes, k == 0, null pointers or no algorithm for the shape; the cuBLAS status of
  // the last failure is kept in last_cublas_status() (an int, cublasStatus_t).
  cudaError_t Linear(const LinearParams& params, cudaStream_t stream);

  int last_cublas_status() const { return last_cublas_status_; }
  size_t num_plans() const;

 private:
  struct Impl;
  explicit GemmRunner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  int last_cublas_status_ = 0;
};

}  // namespace tokenselect::kernels::cuda

#endif  // TOKENSELECT_KERNELS_CUDA_GEMM_H_
