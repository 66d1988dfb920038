// A small, self-contained pseudo-random generator for sampling: xoshiro256** (Blackman and Vigna,
// 2018) seeded through splitmix64. We do not use std:: engines with std:: distributions because
// the distributions differ across standard libraries; with this generator the same seed gives the
// same numbers on every platform.
//
// Sampling keys one generator per (request seed, step), see ForStep(): the draw for step t depends
// only on the seed and t, never on how many draws earlier steps made, so a request that moves
// between processes (prefill worker samples the first token, decode worker the rest) or is
// recomputed after preemption samples the same tokens as an uninterrupted run.
#ifndef TOKENSELECT_ENGINE_SAMPLING_PRNG_H_
#define TOKENSELECT_ENGINE_SAMPLING_PRNG_H_

#include <array>
#include <cstdint>

namespace tokenselect::engine {

// splitmix64 (Steele, Lea and Flood): adds the golden-ratio increment to `*state` and returns the
// mixed value. A bijection on the state, so distinct states give distinct outputs.
uint64_t SplitMix64(uint64_t* state);

class Prng {
 public:
  // Fills the 256-bit state with four successive splitmix64 outputs starting from `seed`, the
  // seeding the xoshiro authors recommend (never all zero).
  explicit Prng(uint64_t seed);

  // The generator for sampling step `step` of a request seeded with `seed`.
  static Prng ForStep(uint64_t seed, uint64_t step);

  // The next 64 uniformly distributed bits (xoshiro256**).
  uint64_t Next();

  // A uniform double in [0, 1) with 53 random bits: (Next() >> 11) * 2^-53.
  double NextDouble();

 private:
  std::array<uint64_t, 4> s_;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_SAMPLING_PRNG_H_
