#include "engine/transfer/kv_transport.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tokenselect::engine {

absl::StatusOr<std::unique_ptr<KvChunkSender>> KvTransport::OpenSender(
    const KvStreamTarget& target, KvStore* store, const KvSenderOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<KvStream> stream, Open(target));
  return std::unique_ptr<KvChunkSender>(
      std::make_unique<PipelinedKvSender>(std::move(stream), store, options));
}

PipelinedKvSender::PipelinedKvSender(std::unique_ptr<KvStream> stream, KvStore* store,
                                     const KvSenderOptions& options)
    : stream_(std::move(stream)), store_(store), options_(options), layout_(store->layout()) {
  thread_ = std::thread([this] { Run(); });
}

PipelinedKvSender::~PipelinedKvSender() {
  bool finished;
  {
    absl::MutexLock lock(&mu_);
    finished = finished_;
  }
  if (!finished) Abort();
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  thread_.join();
}

absl::Status PipelinedKvSender::SendChunk(int64_t token_begin, int64_t token_end) {
  if (token_begin < 0 || token_end <= token_begin || token_end > store_->capacity()) {
    return absl::InvalidArgumentError(absl::StrCat("chunk [", token_begin, ", ", token_end,
                                                   ") outside the store's ", store_->capacity(),
                                                   " slots"));
  }
  Chunk chunk{token_begin, token_end};
  absl::MutexLock lock(&mu_);
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !error_.ok() || aborted_ ||
           static_cast<int>(queue_.size()) < std::max(1, options_.queue_depth);
  };
  mu_.Await(absl::Condition(&room));
  if (aborted_) return absl::CancelledError("KV transfer aborted");
  if (!error_.ok()) return error_;
  if (closing_) return absl::FailedPreconditionError("KV sender already finished");
  queue_.push_back(std::move(chunk));
  return absl::OkStatus();
}

absl::Status PipelinedKvSender::SendOne(const Chunk& chunk) {
  for (const KvBlockRange& range :
       PlanKvBlocks(layout_, chunk.token_begin, chunk.token_end, options_.max_block_bytes)) {
    int64_t sequence;
    {
      absl::MutexLock lock(&mu_);
      if (aborted_) return absl::CancelledError("KV transfer aborted");
      sequence = blocks_sent_;
    }
    ASSIGN_OR_RETURN(KvBlock block, store_->Encode(range, sequence, options_.checksum));
    const int64_t bytes = static_cast<int64_t>(block.data.size());
    RETURN_IF_ERROR(stream_->SendBlock(std::move(block)));
    absl::MutexLock lock(&mu_);
    ++blocks_sent_;
    bytes_sent_ += bytes;
  }
  return absl::OkStatus();
}

void PipelinedKvSender::Run() {
  while (true) {
    Chunk chunk;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || closing_ || aborted_;
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty() || aborted_ || !error_.ok()) {
        if (closing_ || aborted_) return;
        queue_.clear();
        continue;
      }
      chunk = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    absl::Status status = SendOne(chunk);
    absl::MutexLock lock(&mu_);
    busy_ = false;
    if (!status.ok() && error_.ok()) error_ = status;
    if (!error_.ok()) queue_.clear();
  }
}

absl::StatusOr<KvPushStats> PipelinedKvSender::Finish(KvFinal final) {
  {
    absl::MutexLock lock(&mu_);
    auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return aborted_ || (queue_.empty() && !busy_);
    };
    mu_.Await(absl::Condition(&drained));
    if (aborted_) return absl::CancelledError("KV transfer aborted");
    if (!error_.ok()) return error_;
    closing_ = true;
    final.num_chunks = blocks_sent_;
  }
  absl::StatusOr<KvPushStats> stats = stream_->Finish(final);
  absl::MutexLock lock(&mu_);
  if (stats.ok()) {
    finished_ = true;
  } else if (error_.ok()) {
    error_ = stats.status();
  }
  return stats;
}

void PipelinedKvSender::Abort() {
  {
    absl::MutexLock lock(&mu_);
    if (aborted_ || finished_) return;
    aborted_ = true;
    queue_.clear();
  }
  stream_->Abort();
}

int64_t PipelinedKvSender::blocks_sent() const {
  absl::MutexLock lock(&mu_);
  return blocks_sent_;
}

int64_t PipelinedKvSender::bytes_sent() const {
  absl::MutexLock lock(&mu_);
  return bytes_sent_;
}

}  // namespace tokenselect::engine
