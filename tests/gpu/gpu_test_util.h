// Small helpers shared by the GPU tests and the CUDA benchmarks (bench/cuda_bench_util.h): host
// bf16 rounding, an owning device buffer with NaN poisoning, and the error measures the tests
// compare GPU outputs with (relative L2, bf16 outputs against an fp32 reference).
#ifndef TOKENSELECT_TESTS_GPU_GPU_TEST_UTIL_H_
#define TOKENSELECT_TESTS_GPU_GPU_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
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

// f rounded to the nearest bf16 (ties to even), as a float.
inline float RoundBf16(float f) { return Bf16BitsToFloat(FloatToBf16Bits(f)); }

// The bf16 bits of every value.
inline std::vector<uint16_t> ToBf16Bits(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = FloatToBf16Bits(values[i]);
  return bits;
}

// Rounds every value to bf16 in place and returns the bf16 bits.
inline std::vector<uint16_t> RoundToBf16(std::vector<float>* values) {
  std::vector<uint16_t> bits = ToBf16Bits(*values);
  for (size_t i = 0; i < values->size(); ++i) (*values)[i] = Bf16BitsToFloat(bits[i]);
  return bits;
}

// ||got - ref|| / ||ref|| over n values, in double; infinity when any got[i] is not finite.
inline double RelativeL2(const float* got, const float* ref, int64_t n) {
  double err2 = 0, ref2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    err2 += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    ref2 += double(ref[i]) * ref[i];
  }
  return std::sqrt(err2 / ref2);
}

// bf16 outputs against an fp32 reference, accumulated over ranges with Add.
struct Bf16Error {
  double err2 = 0.0, ref2 = 0.0;        // sum of (got - ref)^2, sum of ref^2
  double max_err = 0.0, max_ref = 0.0;  // max |got - ref|, max |ref|
  int64_t nonzero = 0;                  // outputs != 0
  int64_t first_nan = -1;               // first NaN output (unwritten: poisoned), or -1

  // Adds got_bits[i] against ref[i] for i in [begin, end).
  void Add(const uint16_t* got_bits, const float* ref, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float got = Bf16BitsToFloat(got_bits[i]);
      if (std::isnan(got)) {
        if (first_nan < 0) first_nan = i;
        continue;
      }
      nonzero += got != 0.0f;
      const double diff = static_cast<double>(got) - ref[i];
      err2 += diff * diff;
      ref2 += static_cast<double>(ref[i]) * ref[i];
      max_err = std::max(max_err, std::fabs(diff));
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
    }
  }
  double relative_l2() const { return std::sqrt(err2 / ref2); }
};

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
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(other.ptr_), count_(other.count_) {
    other.ptr_ = nullptr;
    other.count_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(ptr_, other.ptr_);
    std::swap(count_, other.count_);
    return *this;
  }

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

// Copies n values from device memory the caller does not own as a DeviceBuffer.
template <typename T>
std::vector<T> DownloadFrom(const T* device, int64_t n) {
  std::vector<T> host(static_cast<size_t>(n));
  if (n > 0) {
    TS_CUDA_CHECK(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost));
  }
  return host;
}

}  // namespace tokenselect::gpu_test

#endif  // TOKENSELECT_TESTS_GPU_GPU_TEST_UTIL_H_
