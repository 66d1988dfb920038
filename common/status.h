// Error handling conventions (docs/architecture.md, "Errors"):
//   - common/ through engine/ return absl::Status / absl::StatusOr<T>; no exceptions cross a module
//     boundary; nothing calls exit() after start-up.
//   - kernels/ launchers return cudaError_t, converted to absl::Status at the boundary.
//   - grpc::Status appears only in the *_service.cc handlers.
// The macros below keep call sites short:
//   RETURN_IF_ERROR(DoThing());
//   ASSIGN_OR_RETURN(auto value, ComputeValue());
//   ASSIGN_OR_RETURN(Config config, LoadConfig(path), _.WithPrefix("loading config: "));
#ifndef TOKENSELECT_COMMON_STATUS_H_
#define TOKENSELECT_COMMON_STATUS_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tokenselect::common {

// Returns `status` with `prefix` put before its message; OK stays OK.
inline absl::Status Annotate(const absl::Status& status, absl::string_view prefix) {
  if (status.ok()) return status;
  absl::Status annotated(status.code(), absl::StrCat(prefix, status.message()));
  status.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) {
    annotated.SetPayload(url, payload);
  });
  return annotated;
}

// The argument the ASSIGN_OR_RETURN error expression sees as `_`.
class StatusRewriter {
 public:
  explicit StatusRewriter(absl::Status status) : status_(std::move(status)) {}
  StatusRewriter WithPrefix(absl::string_view prefix) const {
    return StatusRewriter(Annotate(status_, prefix));
  }
  operator absl::Status() const { return status_; }  // NOLINT: implicit by design.

 private:
  absl::Status status_;
};

namespace internal {
inline absl::Status ToStatus(absl::Status s) { return s; }
template <typename T>
absl::Status ToStatus(const absl::StatusOr<T>& s) {
  return s.status();
}
}  // namespace internal

}  // namespace tokenselect::common

#define TS_STATUS_CONCAT_INNER_(a, b) a##b
#define TS_STATUS_CONCAT_(a, b) TS_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status or absl::StatusOr<T>) once; returns its status on error.
#define RETURN_IF_ERROR(expr)                                                              \
  do {                                                                                     \
    absl::Status ts_status_ = ::tokenselect::common::internal::ToStatus((expr));           \
    if (!ts_status_.ok()) return ts_status_;                                               \
  } while (0)

#define TS_ASSIGN_OR_RETURN_2_(lhs, expr) TS_ASSIGN_OR_RETURN_3_(lhs, expr, _)
#define TS_ASSIGN_OR_RETURN_3_(lhs, expr, error_expr)                                      \
  TS_ASSIGN_OR_RETURN_IMPL_(TS_STATUS_CONCAT_(ts_statusor_, __LINE__), lhs, expr, error_expr)
#define TS_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr, error_expr)                         \
  auto statusor = (expr);                                                                  \
  if (!statusor.ok()) {                                                                    \
    ::tokenselect::common::StatusRewriter _(std::move(statusor).status());                 \
    (void)_;                                                                               \
    return absl::Status(error_expr);                                                       \
  }                                                                                        \
  lhs = std::move(statusor).value()
#define TS_ASSIGN_OR_RETURN_PICK_(_1, _2, _3, name, ...) name

// ASSIGN_OR_RETURN(lhs, expr) or ASSIGN_OR_RETURN(lhs, expr, error_expr): evaluates `expr` (an
// absl::StatusOr<T>); on error returns the status, or `error_expr`, which may use `_` (a
// StatusRewriter over the error) as in `_.WithPrefix("...")`; on success moves the value to `lhs`.
#define ASSIGN_OR_RETURN(...)                                                              \
  TS_ASSIGN_OR_RETURN_PICK_(__VA_ARGS__, TS_ASSIGN_OR_RETURN_3_, TS_ASSIGN_OR_RETURN_2_, ) \
  (__VA_ARGS__)

#endif  // TOKENSELECT_COMMON_STATUS_H_
