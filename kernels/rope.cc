// RoPE inverse frequencies, reproducing Hugging Face transformers' rope-init functions
// (modeling_rope_utils: the default, "linear" and "llama3" rope types) step by step in the
// precision torch uses for them. Backend-neutral: the CUDA backend uploads this same table.
//
// How torch evaluates those Python expressions (inv_freq is an fp32 tensor; Python numbers are
// "wrapped scalars", cast to the tensor's dtype fp32 before the arithmetic):
//   default  inv_freq = 1.0 / (base ** (arange(0, dim, 2, int64).float() / dim))
//              exponent  fp32: float(2i) / float(dim)
//              power     fp32: powf(float(base), exponent) (torch: Sleef powf, within 1 ulp; we
//                        call libm powf, within 1 ulp too, so the two can differ by 1 ulp)
//              1.0 / p   torch's __rtruediv__ is reciprocal() * 1.0: fp32 1 / p
//   linear   inv_freq / factor                                  fp32 divide by float(factor)
//   llama3   low_freq_wavelen  = old_context_len / low_freq_factor   Python double, compared
//            high_freq_wavelen = old_context_len / high_freq_factor  against fp32 as float
//            wavelen = 2 * math.pi / inv_freq     fp32: (1 / inv_freq) * float(2 pi)
//                                                 (__rtruediv__ = reciprocal, then multiply)
//            inv_freq_llama = where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
//            smooth = (old_context_len / wavelen - low_freq_factor)
//                     / (high_freq_factor - low_freq_factor)
//                     fp32: ((1 / wavelen) * float(old) - float(low)) / float(high - low), the
//                     difference high - low taken in double first (Python arithmetic)
//            smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
//                     fp32, left to right: ((1 - s) * f) / factor, s * f, then their sum
//            medium band = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen):
//                     smoothed there, inv_freq_llama elsewhere.
// Every fp32 step above is one correctly rounded IEEE operation here as in torch, so the only
// possible difference is powf: libm's is correctly rounded but for rare cases, torch's (Sleef) is
// within 1 ulp. They disagree by 1 ulp where the exact power is within a few percent of an ulp of
// a tie; tests/unit/kernels/rope_test.cc checks tables dumped from transformers and lists the
// cases found (one is Qwen2-7B, theta 1e6: entry 37 of 64).
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/logging.h"
#include "kernels/ops.h"

namespace tokenselect::kernels {
namespace {

constexpr double kPi = 3.141592653589793;  // math.pi

std::vector<float> DefaultInverseFrequencies(int64_t head_dim, double theta) {
  const int64_t half = head_dim / 2;
  const float base = static_cast<float>(theta);
  const float dim = static_cast<float>(head_dim);
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / dim;
    const float power = std::pow(base, exponent);  // powf
    inv_freq[static_cast<size_t>(i)] = 1.0f / power;
  }
  return inv_freq;
}

void ApplyLlama3Scaling(const RopeParams& params, std::vector<float>& inv_freq) {
  const float factor = static_cast<float>(params.factor);
  const float low_freq_factor = static_cast<float>(params.low_freq_factor);
  const float old_context_len = static_cast<float>(params.original_max_position);
  // Python arithmetic in double, then cast to fp32 where it meets the tensor.
  const double old_context = static_cast<double>(params.original_max_position);
  const float low_freq_wavelen = static_cast<float>(old_context / params.low_freq_factor);
  const float high_freq_wavelen = static_cast<float>(old_context / params.high_freq_factor);
  const float band_width = static_cast<float>(params.high_freq_factor - params.low_freq_factor);
  const float two_pi = static_cast<float>(2.0 * kPi);  // Python: 2 * math.pi
  for (float& f : inv_freq) {
    const float wavelen = (1.0f / f) * two_pi;
    const float f_llama = wavelen > low_freq_wavelen ? f / factor : f;
    const float smooth = ((1.0f / wavelen) * old_context_len - low_freq_factor) / band_width;
    const float smoothed = ((1.0f - smooth) * f_llama) / factor + smooth * f_llama;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    f = medium ? smoothed : f_llama;
  }
}

}  // namespace

std::vector<float> RopeInverseFrequencies(const RopeParams& params) {
  TS_CHECK(params.head_dim > 0 && params.head_dim % 2 == 0,
           "RoPE head_dim must be positive and even, got {}", params.head_dim);
  TS_CHECK(params.theta > 0.0, "RoPE theta must be positive, got {}", params.theta);
  std::vector<float> inv_freq = DefaultInverseFrequencies(params.head_dim, params.theta);
  switch (params.scaling) {
    case RopeScaling::kNone:
      break;
    case RopeScaling::kLinear: {
      TS_CHECK(params.factor > 0.0, "linear RoPE factor must be positive, got {}", params.factor);
      const float factor = static_cast<float>(params.factor);
      for (float& f : inv_freq) f = f / factor;
      break;
    }
    case RopeScaling::kLlama3:
      TS_CHECK(params.factor > 0.0 && params.high_freq_factor != params.low_freq_factor &&
                   params.low_freq_factor > 0.0 && params.high_freq_factor > 0.0 &&
                   params.original_max_position > 0,
               "invalid llama3 RoPE scaling: factor {}, low {}, high {}, original {}",
               params.factor, params.low_freq_factor, params.high_freq_factor,
               params.original_max_position);
      ApplyLlama3Scaling(params, inv_freq);
      break;
  }
  return inv_freq;
}

}  // namespace tokenselect::kernels
