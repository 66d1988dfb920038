// A KvTransport decorator that records the KV transfer metrics of docs/metrics.md on the sending
// side: per KV block message, tokenselect_kv_transfers_total{transport, outcome},
// tokenselect_kv_transfer_seconds{transport} (the time SendBlock takes, i.e. until the transport
// accepted the block) and tokenselect_kv_transfer_bytes_total{transport} (payload bytes of the
// blocks sent). A prefill chunk is one block unless it exceeds the block size
// (--kv_block_bytes), so the histogram is per chunk in the common case. The receiving decode
// worker records nothing, so all-in-one (one registry) counts every transfer once.
#ifndef TOKENSELECT_PREFILL_WORKER_METERED_KV_TRANSPORT_H_
#define TOKENSELECT_PREFILL_WORKER_METERED_KV_TRANSPORT_H_

#include <memory>

#include "absl/strings/string_view.h"
#include "common/metrics/tokenselect_metrics.h"
#include "engine/transfer/kv_transport.h"

namespace tokenselect::prefill_worker {

// `inner` and `metrics` must outlive the result; `transport` is the label value (kTransportHost,
// kTransportNccl).
std::unique_ptr<engine::KvTransport> NewMeteredKvTransport(
    engine::KvTransport* inner, const common::metrics::TokenSelectMetrics& metrics,
    absl::string_view transport);

}  // namespace tokenselect::prefill_worker

#endif  // TOKENSELECT_PREFILL_WORKER_METERED_KV_TRANSPORT_H_
