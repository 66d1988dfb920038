// Element types of checkpoint tensors and exact conversions between the 16-bit floats and fp32.
//   bf16 -> fp32 and fp16 -> fp32 are exact (every value, subnormals, infinities, NaN).
//   fp32 -> bf16 / fp16 round to nearest, ties to even (as torch does); fp16 overflows to inf,
//   NaN stays NaN.
#ifndef TOKENSELECT_ENGINE_MODEL_DTYPE_H_
#define TOKENSELECT_ENGINE_MODEL_DTYPE_H_

#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"

namespace tokenselect::engine {

// The safetensors dtypes. Only kF32, kF16 and kBF16 convert to fp32; the others are known so
// that a file holding them can be validated and its error name the tensor.
enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool, kF8E4M3, kF8E5M2 };

// "F32", "BF16", ... as written in a safetensors header.
const char* DTypeName(DType dtype);
// The inverse of DTypeName; nullopt for a name we do not know.
std::optional<DType> ParseDType(absl::string_view name);
// Bytes per element.
int64_t DTypeSize(DType dtype);
// Whether ConvertToFloat32 handles it.
bool IsFloat32Convertible(DType dtype);

float Bf16ToFloat(uint16_t bits);
float Fp16ToFloat(uint16_t bits);
uint16_t FloatToBf16(float value);
uint16_t FloatToFp16(float value);

// Converts `count` little-endian elements at `src` (any alignment) to fp32. dtype must be
// convertible (checked).
void ConvertToFloat32(DType dtype, const void* src, int64_t count, float* out);
// Converts fp32 to `dtype` (F32, F16 or BF16; checked), writing count * DTypeSize bytes.
void ConvertFromFloat32(DType dtype, const float* src, int64_t count, void* out);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_MODEL_DTYPE_H_
