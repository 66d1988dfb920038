// Vectorisable math for the CPU kernels: the cos/sin tables of RoPE and the exponentials of
// softmax. These loops dominate gather-time RoPE and online softmax when written with the scalar
// libm calls (about 14 ns per sin/cos pair), so they are written as branch-free loops that the
// compiler vectorises, built twice (AVX2 and baseline x86-64) and picked at load time.
// Neither build contracts a*b+c into an FMA (ISO C++ mode: -ffp-contract=off), so both give
// bit-identical results.
#ifndef TOKENSELECT_KERNELS_CPU_VEC_MATH_H_
#define TOKENSELECT_KERNELS_CPU_VEC_MATH_H_

#include <cstdint>

namespace tokenselect::kernels::cpu {

// For i < half: angle = float(position) * inv_freq[i] (one fp32 product, as Hugging Face forms
// `inv_freq @ position_ids.float()`), cos_out[i] = cos(angle), sin_out[i] = sin(angle) of that
// fp32 angle. The range reduction by pi/2 and the polynomials run in double and are rounded to
// float once: within 1 ulp of the exact cos/sin of the fp32 angle (usually correctly rounded),
// which is at least as close as torch's own fp32 cos/sin (Sleef, 1 ulp). Angles of magnitude
// 2^23 or more (positions past ~8M at inv_freq 1) fall back to libm's double cos/sin.
void RopeCosSin(int32_t position, const float* inv_freq, int64_t half, float* cos_out,
                float* sin_out);

// x[i] = exp(x[i] - shift) for i < n, in fp32; returns the fp32 sum of the new values.
// Meant for softmax (shift = a maximum, so x[i] - shift <= 0): exp(t) for t < -87 (below
// ~1.6e-38, relative to the largest term 1) is flushed to 0, and -inf gives 0. Relative error
// within 2 ulp otherwise (round to nearest multiple of ln 2, degree-7 Taylor polynomial).
float ExpShiftedInPlace(float* x, int64_t n, float shift);

// Max of x[0..n); -inf when n == 0.
float RowMax(const float* x, int64_t n);

// HF rotate_half on one head vector, for i < half:
//   out[i]        = x[i] * cos[i] - x[i + half] * sin[i]
//   out[i + half] = x[i + half] * cos[i] + x[i] * sin[i]
// out may alias x.
void RotateHalf(float* out, const float* x, const float* cos, const float* sin, int64_t half);

// For each j < n: dst row j ([head_dim] at dst + j * head_dim) = RotateHalf of the source row
// src + slots[j] * slot_stride with the cos/sin of row j (cos + j * half, sin + j * half).
// Gathers and rotates a key tile in one pass.
void GatherRotateRows(float* dst, const float* src, const int32_t* slots, int64_t n,
                      int64_t slot_stride, const float* cos, const float* sin, int64_t half);

// For each j < n: dst row j = the row src + slots[j] * slot_stride ([row_len] floats).
void GatherRows(float* dst, const float* src, const int32_t* slots, int64_t n, int64_t slot_stride,
                int64_t row_len);

}  // namespace tokenselect::kernels::cpu

#endif  // TOKENSELECT_KERNELS_CPU_VEC_MATH_H_
