#include "common/ids.h"

#include <atomic>
#include <cstdint>
#include <random>

#include "absl/strings/str_format.h"

namespace tokenselect::common {
namespace {

// splitmix64 finaliser: a bijection, so distinct counters give distinct ids.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

std::string NewId(absl::string_view prefix) {
  static const uint64_t seed = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  static std::atomic<uint64_t> counter{0};
  return absl::StrFormat("%s-%016x", prefix, Mix(seed + counter.fetch_add(1)));
}

}  // namespace tokenselect::common
