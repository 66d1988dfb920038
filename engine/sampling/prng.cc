#include "engine/sampling/prng.h"

namespace tokenselect::engine {
namespace {

inline uint64_t RotateLeft(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

Prng::Prng(uint64_t seed) {
  uint64_t sm = seed;
  for (uint64_t& word : s_) word = SplitMix64(&sm);
}

Prng Prng::ForStep(uint64_t seed, uint64_t step) {
  // Mix the step on its own before combining it with the seed, so neighbouring (seed, step) pairs
  // such as (s, t + 1) and (s + 1, t) land far apart.
  uint64_t step_state = step;
  uint64_t key = seed ^ SplitMix64(&step_state);
  return Prng(SplitMix64(&key));
}

uint64_t Prng::Next() {
  const uint64_t result = RotateLeft(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = RotateLeft(s_[3], 45);
  return result;
}

double Prng::NextDouble() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

}  // namespace tokenselect::engine
