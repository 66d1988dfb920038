// cuBLASLt plans for GemmRunner (gemm.h). Host code only: descriptors are built once per plan key
// and reused; the bias pointer is the only attribute set per call.
#include "kernels/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

namespace tokenselect::kernels::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS's recommendation for Hopper

// The largest power of two (up to 16) dividing the address: cuBLASLt's heuristic assumes
// 256-byte aligned operands unless told otherwise, and offsets into fused buffers break that.
int Alignment(uintptr_t a) {
  int align = 16;
  while (align > 1 && (a % static_cast<uintptr_t>(align)) != 0) align /= 2;
  return align;
}

// The leading dimension of x or W: its stride, 0 meaning contiguous rows of k.
int64_t LeadingDim(int64_t stride, int64_t k) { return stride > 0 ? stride : k; }

cudaError_t ToCuda(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return cudaSuccess;
    case CUBLAS_STATUS_ALLOC_FAILED:
      return cudaErrorMemoryAllocation;
    case CUBLAS_STATUS_INVALID_VALUE:
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return cudaErrorInvalidValue;
    default:
      return cudaErrorUnknown;
  }
}

// (m, n, k, output type, bias, accumulate, min alignment of x/w/y/bias, x stride, w stride,
// plan_n)
using PlanKey =
    std::tuple<int64_t, int64_t, int64_t, int, bool, bool, int, int64_t, int64_t, int64_t>;

// The alignment TP-invariant plans assume (LinearParams::plan_n): fixed, so that the heuristic
// sees the same canonical problem on every tensor-parallel size.
constexpr int kInvariantAlignment = 16;

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr;  // W: column-major [k, n]
  cublasLtMatrixLayout_t b = nullptr;  // x: column-major [k, m]
  cublasLtMatrixLayout_t d = nullptr;  // y: column-major [n, m] (also C)
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

#define TS_CUBLAS_RETURN_IF_ERROR(expr)                                       \
  do {                                                                        \
    const cublasStatus_t ts_cublas_status_ = (expr);                          \
    if (ts_cublas_status_ != CUBLAS_STATUS_SUCCESS) return ts_cublas_status_; \
  } while (0)

}  // namespace

struct GemmRunner::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;

  ~Impl() {
    plans.clear();
    if (workspace != nullptr) cudaFree(workspace);
    if (handle != nullptr) cublasLtDestroy(handle);
  }

  cublasStatus_t MakePlan(const LinearParams& p, int align, Plan* plan) {
    const bool fp32_out = p.out == GemmOutput::kFp32;
    const cudaDataType_t out_type = fp32_out ? CUDA_R_32F : CUDA_R_16BF;
    TS_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    TS_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
    TS_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
    if (p.bias != nullptr) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      TS_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
      TS_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)));
    }
    const auto k = static_cast<uint64_t>(p.k), m = static_cast<uint64_t>(p.m),
               n = static_cast<uint64_t>(p.n);
    TS_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, k, n, LeadingDim(p.w_stride, p.k)));
    TS_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, k, m, LeadingDim(p.x_stride, p.k)));
    TS_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->d, out_type, n, m, p.n));
    if (p.plan_n > 0) return InvariantAlgo(p, out_type, plan);

    return BestAlgo(plan->desc, plan->a, plan->b, plan->d, align, 0, &plan->algo);
  }

  // The heuristic's best algorithm for desc on layouts a, b, d (also C) with operands aligned to
  // `align` bytes and, when reduction_mask != 0, only the split-K reductions it allows.
  cublasStatus_t BestAlgo(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                          cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d, int align,
                          uint32_t reduction_mask, cublasLtMatmulAlgo_t* algo) {
    cublasLtMatmulPreference_t pref = nullptr;
    TS_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws_bytes = kWorkspaceBytes;
    const uint32_t align_bytes = static_cast<uint32_t>(align);
    cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes));
    if (status == CUBLAS_STATUS_SUCCESS && reduction_mask != 0) {
      status = cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction_mask,
          sizeof(reduction_mask));
    }
    for (cublasLtMatmulPreferenceAttributes_t attr :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      if (status == CUBLAS_STATUS_SUCCESS) {
        status =
            cublasLtMatmulPreferenceSetAttribute(pref, attr, &align_bytes, sizeof(align_bytes));
      }
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, d, d, pref, 1, &result, &found);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    if (found == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
    *algo = result.algo;
    return CUBLAS_STATUS_SUCCESS;
  }

  // LinearParams::plan_n: the heuristic's best algorithm (split-K only as allowed below) for the
  // canonical problem (n = plan_n, contiguous operands, kInvariantAlignment), checked against
  // the real layouts. Never another algorithm: a fallback would break the invariance silently.
  cublasStatus_t InvariantAlgo(const LinearParams& p, cudaDataType_t out_type, Plan* plan) {
    const auto k = static_cast<uint64_t>(p.k), m = static_cast<uint64_t>(p.m),
               n = static_cast<uint64_t>(p.plan_n);
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasStatus_t status = cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, k, n, p.k);
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, m, p.k);
    }
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = cublasLtMatrixLayoutCreate(&d, out_type, n, m, p.plan_n);
    }
    // Split-K only with the splits reduced in fp32 workspace (their sum fixed by the algorithm,
    // not by n; beta * C added once to that sum, as the tree adds a leaf), which skinny decode
    // GEMMs need to fill the GPU; never in place in the output, where beta * C may join the
    // splits' partial sums.
    const uint32_t reduction = static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_NONE) |
                               static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
    cublasLtMatmulAlgo_t algo{};
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = BestAlgo(plan->desc, a, b, d, kInvariantAlignment, reduction, &algo);
    }
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    cublasLtMatmulHeuristicResult_t checked{};
    TS_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulAlgoCheck(handle, plan->desc, plan->a, plan->b, plan->d,
                                                      plan->d, &algo, &checked));
    if (checked.workspaceSize > kWorkspaceBytes) return CUBLAS_STATUS_NOT_SUPPORTED;
    plan->algo = algo;
    return CUBLAS_STATUS_SUCCESS;
  }
};

GemmRunner::GemmRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GemmRunner::~GemmRunner() = default;

cudaError_t GemmRunner::Create(std::unique_ptr<GemmRunner>* runner) {
  auto impl = std::make_unique<Impl>();
  if (cublasLtCreate(&impl->handle) != CUBLAS_STATUS_SUCCESS) {
    impl->handle = nullptr;
    return cudaErrorUnknown;
  }
  const cudaError_t err = cudaMalloc(&impl->workspace, kWorkspaceBytes);
  if (err != cudaSuccess) {
    impl->workspace = nullptr;
    return err;
  }
  runner->reset(new GemmRunner(std::move(impl)));
  return cudaSuccess;
}

size_t GemmRunner::num_plans() const { return impl_->plans.size(); }

cudaError_t GemmRunner::Linear(const LinearParams& p, cudaStream_t stream) {
  if (p.m < 0 || p.n < 0 || p.k < 0) return cudaErrorInvalidValue;
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  if (p.k == 0 || p.y == nullptr || p.x == nullptr || p.w == nullptr) return cudaErrorInvalidValue;
  if ((p.x_stride != 0 && p.x_stride < p.k) || (p.w_stride != 0 && p.w_stride < p.k) ||
      p.plan_n < 0) {
    return cudaErrorInvalidValue;
  }
  auto address = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr); };
  // Leading dimensions limit the alignment of every row, not only of the first.
  const uintptr_t out_row_bytes =
      static_cast<uintptr_t>(p.n) * (p.out == GemmOutput::kFp32 ? 4 : 2);
  const int64_t ldx = LeadingDim(p.x_stride, p.k);
  const int64_t ldw = LeadingDim(p.w_stride, p.k);
  int align = std::min({Alignment(address(p.x)), Alignment(address(p.w)), Alignment(address(p.y)),
                        Alignment(static_cast<uintptr_t>(ldx) * 2),
                        Alignment(static_cast<uintptr_t>(ldw) * 2), Alignment(out_row_bytes)});
  if (p.bias != nullptr) align = std::min(align, Alignment(address(p.bias)));
  if (p.plan_n > 0 && (align < kInvariantAlignment || p.k % 8 != 0)) return cudaErrorInvalidValue;
  const PlanKey key{
      p.m, p.n, p.k,     static_cast<int>(p.out), p.bias != nullptr, p.accumulate, align,
      ldx, ldw, p.plan_n};
  auto it = impl_->plans.find(key);
  if (it == impl_->plans.end()) {
    auto plan = std::make_unique<Plan>();
    const cublasStatus_t status = impl_->MakePlan(p, align, plan.get());
    if (status != CUBLAS_STATUS_SUCCESS) {
      last_cublas_status_ = static_cast<int>(status);
      return ToCuda(status);
    }
    it = impl_->plans.emplace(key, std::move(plan)).first;
  }
  Plan& plan = *it->second;
  if (p.bias != nullptr) {
    const cublasStatus_t status = cublasLtMatmulDescSetAttribute(
        plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias));
    if (status != CUBLAS_STATUS_SUCCESS) {
      last_cublas_status_ = static_cast<int>(status);
      return ToCuda(status);
    }
  }
  const float alpha = 1.0f;
  const float beta = p.accumulate ? 1.0f : 0.0f;
  const cublasStatus_t status =
      cublasLtMatmul(impl_->handle, plan.desc, &alpha, p.w, plan.a, p.x, plan.b, &beta, p.y, plan.d,
                     p.y, plan.d, &plan.algo, impl_->workspace, kWorkspaceBytes, stream);
  if (status != CUBLAS_STATUS_SUCCESS) {
    last_cublas_status_ = static_cast<int>(status);
    return ToCuda(status);
  }
  return cudaGetLastError();
}

}  // namespace tokenselect::kernels::cuda
