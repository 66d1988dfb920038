#include "prefill_worker/metered_kv_transport.h"

#include <string>
#include <utility>

#include "common/clock.h"
#include "common/status.h"

namespace tokenselect::prefill_worker {
namespace {

namespace m = common::metrics;

// The children of one transport label, looked up once.
struct TransferChildren {
  m::Counter* bytes;
  m::Histogram* seconds;
  m::Counter* ok;
  m::Counter* error;
};

class MeteredKvStream : public engine::KvStream {
 public:
  MeteredKvStream(std::unique_ptr<engine::KvStream> inner, const TransferChildren* children)
      : inner_(std::move(inner)), children_(children) {}

  absl::Status SendBlock(engine::KvBlock block) override {
    // A block of a device link carries its bytes over the link: count them from its shape.
    double bytes = static_cast<double>(block.data.size());
    if (!block.link_id.empty()) {
      bytes = static_cast<double>(engine::KvDTypeSize(block.dtype));
      for (int64_t d : block.shape) bytes *= static_cast<double>(d);
    }
    const common::Stopwatch clock;
    absl::Status status = inner_->SendBlock(std::move(block));
    children_->seconds->Observe(clock.ElapsedSeconds());
    if (status.ok()) {
      children_->ok->Increment();
      children_->bytes->Increment(bytes);
    } else {
      children_->error->Increment();
    }
    return status;
  }

  // The final record's selection state (span index, ...) counts as transferred bytes too.
  absl::StatusOr<engine::KvPushStats> Finish(const engine::KvFinal& final) override {
    absl::StatusOr<engine::KvPushStats> stats = inner_->Finish(final);
    if (stats.ok()) {
      size_t bytes = 0;
      for (const std::string& state : final.selection_states) bytes += state.size();
      if (bytes > 0) children_->bytes->Increment(static_cast<double>(bytes));
    }
    return stats;
  }

  void Abort() override { inner_->Abort(); }

 private:
  std::unique_ptr<engine::KvStream> inner_;
  const TransferChildren* children_;
};

class MeteredKvTransport : public engine::KvTransport {
 public:
  MeteredKvTransport(engine::KvTransport* inner, const m::TokenSelectMetrics& metrics,
                     absl::string_view transport)
      : inner_(inner),
        children_{&metrics.kv_transfer_bytes_total->Labels({transport}),
                  &metrics.kv_transfer_seconds->Labels({transport}),
                  &metrics.kv_transfers_total->Labels({transport, m::kTransferOk}),
                  &metrics.kv_transfers_total->Labels({transport, m::kTransferError})} {}

  absl::StatusOr<std::unique_ptr<engine::KvStream>> Open(
      const engine::KvStreamTarget& target) override {
    absl::StatusOr<std::unique_ptr<engine::KvStream>> stream = inner_->Open(target);
    if (!stream.ok()) {
      children_.error->Increment();  // the transfer failed before its first block
      return stream.status();
    }
    return std::unique_ptr<engine::KvStream>(
        std::make_unique<MeteredKvStream>(*std::move(stream), &children_));
  }

 private:
  engine::KvTransport* inner_;
  const TransferChildren children_;
};

}  // namespace

std::unique_ptr<engine::KvTransport> NewMeteredKvTransport(engine::KvTransport* inner,
                                                           const m::TokenSelectMetrics& metrics,
                                                           absl::string_view transport) {
  return std::make_unique<MeteredKvTransport>(inner, metrics, transport);
}

}  // namespace tokenselect::prefill_worker
