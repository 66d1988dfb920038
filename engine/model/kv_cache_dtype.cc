#include "engine/model/kv_cache_dtype.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tokenselect::engine {

absl::StatusOr<KvCacheDType> ParseKvCacheDType(absl::string_view name) {
  if (name == "bf16") return KvCacheDType::kBF16;
  if (name == "fp8") return KvCacheDType::kFP8E4M3;
  return absl::InvalidArgumentError(
      absl::StrCat("--kv_dtype must be bf16 or fp8, got \"", name, "\""));
}

const char* KvCacheDTypeName(KvCacheDType dtype) {
  return dtype == KvCacheDType::kFP8E4M3 ? "fp8" : "bf16";
}

int64_t KvCacheElementBytes(KvCacheDType dtype) {
  return dtype == KvCacheDType::kFP8E4M3 ? 1 : 2;
}

}  // namespace tokenselect::engine
