// kv_links.h in builds without NCCL: the transport cannot be chosen.
#include "engine/transfer/kv_links.h"

namespace tokenselect::engine {

absl::StatusOr<std::unique_ptr<KvLinkAcceptor>> NewNcclKvLinkAcceptor(const DeviceKvCache&,
                                                                      const KvLinkOptions&) {
  return absl::FailedPreconditionError("this build has no NCCL: device K/V links are unavailable");
}

absl::StatusOr<std::unique_ptr<KvTransport>> NewNcclKvTransport(const DeviceKvCache&, int64_t,
                                                                KvTransport*, KvLinkConnector,
                                                                const KvLinkOptions&) {
  return absl::FailedPreconditionError("this build has no NCCL: --transport nccl is unavailable");
}

}  // namespace tokenselect::engine
