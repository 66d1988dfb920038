// Device-side conversions of the KV cache's elements (kv_cache_type.h). Included by .cu files only.
//   Bf16x8ToFloat                8 bf16 (one 16-byte load, element 0 in the lowest half) as fp32
//   Fp8x4ToFloat / Fp8x8ToFloat  e4m3 bytes (element 0 in the lowest byte) -> float(x) * scale,
//                                through the hardware e4m3 -> half conversion (exact)
//   Fp8x8ToBf16x8                the same, packed as 8 bf16 (exact: a power-of-two multiple of
//                                an e4m3 value has at most 4 significant bits)
//   FloatToFp8                   __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3): round to
//                                nearest even, saturate to +-448, NaN -> 0x7f
//                                (engine/model/fp8.h is the CPU's bit-exact twin)
#ifndef TOKENSELECT_KERNELS_CUDA_KV_CACHE_LOAD_CUH_
#define TOKENSELECT_KERNELS_CUDA_KV_CACHE_LOAD_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace tokenselect::kernels::cuda::kv_internal {

__device__ __forceinline__ void Bf16x8ToFloat(const uint4& raw, float* out) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ float2 Fp8x2ToFloat2(uint32_t two) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  return __half22float2(__half2(h));
}

__device__ __forceinline__ void Fp8x4ToFloat(uint32_t w, float scale, float* out) {
  const float2 a = Fp8x2ToFloat2(w), b = Fp8x2ToFloat2(w >> 16);
  out[0] = a.x * scale;
  out[1] = a.y * scale;
  out[2] = b.x * scale;
  out[3] = b.y * scale;
}

__device__ __forceinline__ void Fp8x8ToFloat(uint2 raw, float scale, float* out) {
  Fp8x4ToFloat(raw.x, scale, out);
  Fp8x4ToFloat(raw.y, scale, out + 4);
}

__device__ __forceinline__ uint32_t PackBf16x2Exact(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint4 Fp8x8ToBf16x8(uint2 raw, float scale) {
  float f[8];
  Fp8x8ToFloat(raw, scale, f);
  uint4 r;
  r.x = PackBf16x2Exact(f[0], f[1]);
  r.y = PackBf16x2Exact(f[2], f[3]);
  r.z = PackBf16x2Exact(f[4], f[5]);
  r.w = PackBf16x2Exact(f[6], f[7]);
  return r;
}

// Element i of a cache of either type, as float (times scale for FP8; scale unused for bf16).
template <bool kFp8>
__device__ __forceinline__ float LoadKvElement(const void* cache, int64_t i, float scale) {
  if constexpr (kFp8) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(
        static_cast<const __nv_fp8_storage_t*>(cache)[i], __NV_E4M3);
    return __half2float(__half(h)) * scale;
  } else {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(cache)[i]);
  }
}

// 8 e4m3 as 8 bf16 without a scale (exact: e4m3 values are bf16 values). For kernels that keep
// a power-of-two scale out of their inner loop (folded into the query, applied to the output).
__device__ __forceinline__ uint4 Fp8x8ToBf16x8Unscaled(uint2 raw) {
  const uint32_t w[2] = {raw.x, raw.y};
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = Fp8x2ToFloat2(w[i / 2] >> (16 * (i % 2)));
    out[i] = PackBf16x2Exact(f.x, f.y);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

__device__ __forceinline__ uint8_t FloatToFp8(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

}  // namespace tokenselect::kernels::cuda::kv_internal

#endif  // TOKENSELECT_KERNELS_CUDA_KV_CACHE_LOAD_CUH_
