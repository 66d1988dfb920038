// Small helpers shared by the GPU tests and the CUDA kernel benchmark: host bf16 rounding, an
// owning device buffer, and NaN poisoning.
#ifndef TOKENSELECT_TESTS_GPU_GPU_TEST_UTIL_H_
#define TOKENSELECT_TESTS_GPU_GPU_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace tokenselect::gpu_test {

// Aborts with the CUDA error text: in tests and benchmarks a failed CUDA call ends the run.
#define TS_CUDA_CHECK(expr)                                                              \
  do {                                                                                   \
    const cudaError_t ts_err_ = (expr);                                                  \
    if (ts_err_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                 \
                   cudaGetErrorString(ts_err_));                                         \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

// fp32 -> bf16 bits, round to nearest even (inputs here are finite).
inline uint16_t FloatToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float Bf16BitsToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Rounds every value to bf16 in place and returns the bf16 bits.
inline std::vector<uint16_t> RoundToBf16(std::vector<float>* values) {
  std::vector<uint16_t> bits(values->size());
  for (size_t i = 0; i < values->size(); ++i) {
    bits[i] = FloatToBf16Bits((*values)[i]);
    (*values)[i] = Bf16BitsToFloat(bits[i]);
  }
  return bits;
}

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count > 0) {
      TS_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), count * sizeof(T)));
    }
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { Upload(host); }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  size_t size() const { return count_; }
  void Upload(const std::vector<T>& host) {
    if (count_ > 0) {
      TS_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice));
    }
  }
  std::vector<T> Download() const {
    std::vector<T> host(count_);
    if (count_ > 0) {
      TS_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
    }
    return host;
  }
  // All bytes 0xff: NaN for fp32 and bf16, -1 for int32.
  void Poison() {
    if (count_ > 0) TS_CUDA_CHECK(cudaMemset(ptr_, 0xff, count_ * sizeof(T)));
  }
  void Zero() {
    if (count_ > 0) TS_CUDA_CHECK(cudaMemset(ptr_, 0, count_ * sizeof(T)));
  }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

}  // namespace tokenselect::gpu_test

#endif  // TOKENSELECT_TESTS_GPU_GPU_TEST_UTIL_H_
