#include "engine/transfer/kv_transport.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/status.h"
#include "engine/selection/selection_attention.h"
#include "engine/transfer/kv_receiver.h"
#include "engine/transfer/selection_state.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/transfer/kv_test_util.h"

namespace tokenselect::engine {
namespace {

using testing::ExpectPattern;
using testing::FillTable;
using testing::MakePool;

// An in-memory stream into a KvReceiver, with fault injection: fail the n-th block, or block in
// SendBlock until aborted.
class FakeStream : public KvStream {
 public:
  explicit FakeStream(KvReceiver* receiver) : receiver_(receiver) {}
  absl::Status SendBlock(KvBlock block) override {
    if (block_forever_) {
      entered_.Notify();
      while (!aborted_) std::this_thread::yield();
      return absl::CancelledError("aborted");
    }
    if (fail_at_ >= 0 && sent_ == fail_at_) return absl::UnavailableError("link down");
    ++sent_;
    return receiver_->Accept("req", "rsv", block);
  }
  absl::StatusOr<KvPushStats> Finish(const KvFinal& final) override {
    RETURN_IF_ERROR(receiver_->Finish("req", "rsv", final));
    return KvPushStats{receiver_->tokens_complete(), receiver_->bytes_received()};
  }
  void Abort() override { aborted_ = true; }

  int fail_at_ = -1;
  bool block_forever_ = false;
  std::atomic<bool> aborted_{false};
  absl::Notification entered_;
  int sent_ = 0;

 private:
  KvReceiver* receiver_;
};

class PipelinedKvSenderTest : public ::testing::Test {
 protected:
  PipelinedKvSenderTest()
      : src_pool_(MakePool(2, 2, 4, 16, 4)),
        dst_pool_(MakePool(2, 2, 4, 16, 16)),
        src_(src_pool_.get(), "src"),
        dst_(dst_pool_.get(), "dst"),
        src_store_(&src_),
        dst_store_(&dst_),
        receiver_("req", "rsv", &dst_store_, 20) {
    FillTable(&src_, 20);
    EXPECT_TRUE(dst_.Reserve(24).ok());
    options_.max_block_bytes = 300;  // several blocks per chunk
    options_.checksum = true;
    options_.queue_depth = 1;
  }
  std::unique_ptr<PagePool> src_pool_, dst_pool_;
  TokenTable src_, dst_;
  TableKvStore src_store_, dst_store_;
  KvReceiver receiver_;
  KvSenderOptions options_;
};

TEST_F(PipelinedKvSenderTest, SendsChunksInOrderAndFinishes) {
  auto stream = std::make_unique<FakeStream>(&receiver_);
  PipelinedKvSender sender(std::move(stream), &src_store_, options_);
  for (int64_t begin = 0; begin < 20; begin += 6) {
    ASSERT_TRUE(sender.SendChunk(begin, std::min<int64_t>(20, begin + 6)).ok());
  }
  KvFinal final;
  final.first_token_id = 3;
  auto stats = sender.Finish(final);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->tokens_received, 20);
  EXPECT_EQ(sender.blocks_sent(), receiver_.blocks_received());
  EXPECT_EQ(sender.bytes_sent(), 20 * 2 * 2 * 2 * 4 * 4);
  ExpectPattern(dst_, 20);
}

TEST_F(PipelinedKvSenderTest, FinalRecordCarriesTheSelectionStateLast) {
  // The sender's provider after prefill (infllm: received attention per token, per layer).
  SelectionOptions o;
  o.policy = SelectionPolicyKind::kInfLlm;
  auto sent = SelectionAttention::Create(o, 2);
  ASSERT_TRUE(sent.ok());
  for (int64_t l = 0; l < 2; ++l) {
    for (int64_t t = 0; t < 20; ++t) {
      (*sent)->mutable_layer_state(l)->received.push_back(0.5f * static_cast<float>(t + l));
    }
  }
  auto stream = std::make_unique<FakeStream>(&receiver_);
  PipelinedKvSender sender(std::move(stream), &src_store_, options_);
  ASSERT_TRUE(sender.SendChunk(0, 12).ok());
  ASSERT_TRUE(sender.SendChunk(12, 20).ok());
  KvFinal final;
  final.first_token_id = 3;
  final.selection_states = CollectSelectionStates(**sent, 2);
  ASSERT_EQ(final.selection_states.size(), 2u);
  auto stats = sender.Finish(final);
  ASSERT_TRUE(stats.ok()) << stats.status();
  ExpectPattern(dst_, 20);
  // The decode side restores it into a fresh provider: the same state in every layer.
  auto restored = SelectionAttention::Create(o, 2);
  ASSERT_TRUE(restored.ok());
  ASSERT_TRUE(RestoreSelectionStates(receiver_.TakeSelectionStates(), 2, restored->get()).ok());
  for (int64_t l = 0; l < 2; ++l) {
    EXPECT_EQ((*restored)->layer_state(l).received, (*sent)->layer_state(l).received) << l;
  }
}

TEST_F(PipelinedKvSenderTest, StreamErrorIsReturned) {
  auto stream = std::make_unique<FakeStream>(&receiver_);
  stream->fail_at_ = 2;
  PipelinedKvSender sender(std::move(stream), &src_store_, options_);
  absl::Status status;
  for (int64_t begin = 0; begin < 20 && status.ok(); begin += 5) {
    status = sender.SendChunk(begin, begin + 5);
  }
  auto stats = sender.Finish(KvFinal{});
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(PipelinedKvSenderTest, AbortUnblocksEverything) {
  auto stream = std::make_unique<FakeStream>(&receiver_);
  FakeStream* raw = stream.get();
  raw->block_forever_ = true;
  PipelinedKvSender sender(std::move(stream), &src_store_, options_);
  ASSERT_TRUE(sender.SendChunk(0, 5).ok());
  raw->entered_.WaitForNotification();
  std::thread aborter([&] { sender.Abort(); });
  auto stats = sender.Finish(KvFinal{});
  aborter.join();
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(sender.SendChunk(5, 10).code(), absl::StatusCode::kCancelled);
}

TEST_F(PipelinedKvSenderTest, RejectsChunkOutsideTheTable) {
  PipelinedKvSender sender(std::make_unique<FakeStream>(&receiver_), &src_store_, options_);
  EXPECT_EQ(sender.SendChunk(5, 5).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sender.SendChunk(0, 100).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tokenselect::engine
