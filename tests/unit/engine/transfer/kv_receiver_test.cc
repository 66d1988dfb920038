#include "engine/transfer/kv_receiver.h"

#include <string>
#include <vector>

#include "engine/selection/layer_state.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/transfer/kv_test_util.h"

namespace tokenselect::engine {
namespace {

using testing::ExpectPattern;
using testing::FillTable;
using testing::MakePool;

constexpr int64_t kPrompt = 10;

// A sender pool (page size 4) and a receiver pool with another page size, so that the transfer
// maps tokens, not pages.
class KvReceiverTest : public ::testing::Test {
 protected:
  KvReceiverTest()
      : src_pool_(MakePool(3, 2, 4, 8, 4)),
        dst_pool_(MakePool(3, 2, 4, 8, 8)),
        src_(src_pool_.get(), "src"),
        dst_(dst_pool_.get(), "dst"),
        dst_store_(&dst_),
        receiver_("req", "rsv", &dst_store_, kPrompt) {
    FillTable(&src_, kPrompt);
    EXPECT_TRUE(dst_.Reserve(kPrompt + 5).ok());
  }

  std::vector<KvBlock> Blocks(int64_t max_bytes) {
    std::vector<KvBlock> blocks;
    for (const KvBlockRange& r : PlanKvBlocks(LayoutOf(*src_pool_), 0, kPrompt, max_bytes)) {
      auto b = EncodeKvBlock(*src_pool_, r, src_.Slots(r.token_begin, r.token_end),
                             static_cast<int64_t>(blocks.size()), true);
      EXPECT_TRUE(b.ok()) << b.status();
      blocks.push_back(std::move(b).value());
    }
    return blocks;
  }

  KvFinal Final(int64_t num_chunks) {
    KvFinal f;
    f.first_token_id = 42;
    f.seed = 7;
    f.num_chunks = num_chunks;
    return f;
  }

  // Expects `status` to be InvalidArgument mentioning `field`, and the receiver to stay failed.
  void ExpectRejected(const absl::Status& status, const std::string& field) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(field), std::string::npos) << status;
    EXPECT_EQ(receiver_.Accept("req", "rsv", Blocks(1 << 20)[0]).code(),
              absl::StatusCode::kFailedPrecondition);
  }

  std::unique_ptr<PagePool> src_pool_, dst_pool_;
  TokenTable src_, dst_;
  TableKvStore dst_store_;
  KvReceiver receiver_;
};

TEST_F(KvReceiverTest, RoundTripInManyBlocks) {
  std::vector<KvBlock> blocks = Blocks(200);  // token slices of one layer
  ASSERT_GT(blocks.size(), 6u);
  for (const KvBlock& b : blocks) ASSERT_TRUE(receiver_.Accept("req", "rsv", b).ok());
  EXPECT_EQ(receiver_.tokens_complete(), kPrompt);
  ASSERT_TRUE(receiver_.Finish("req", "rsv", Final(static_cast<int64_t>(blocks.size()))).ok());
  EXPECT_TRUE(receiver_.finished());
  EXPECT_EQ(dst_.length(), kPrompt);
  ExpectPattern(dst_, kPrompt);
  EXPECT_EQ(receiver_.Accept("req", "rsv", blocks[0]).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(KvReceiverTest, RoundTripInOneBlock) {
  std::vector<KvBlock> blocks = Blocks(1 << 20);
  ASSERT_EQ(blocks.size(), 1u);
  ASSERT_TRUE(receiver_.Accept("req", "rsv", blocks[0]).ok());
  ASSERT_TRUE(receiver_.Finish("req", "rsv", Final(1)).ok());
  ExpectPattern(dst_, kPrompt);
}

TEST_F(KvReceiverTest, RejectsWrongIds) {
  ExpectRejected(receiver_.Accept("other", "rsv", Blocks(1 << 20)[0]), "request_id");
}

TEST_F(KvReceiverTest, RejectsWrongReservation) {
  ExpectRejected(receiver_.Accept("req", "rsv-2", Blocks(1 << 20)[0]), "reservation_id");
}

TEST_F(KvReceiverTest, RejectsSequenceGap) {
  std::vector<KvBlock> blocks = Blocks(200);
  ExpectRejected(receiver_.Accept("req", "rsv", blocks[1]), "sequence");
}

TEST_F(KvReceiverTest, RejectsLayerRange) {
  KvBlock b = Blocks(1 << 20)[0];
  b.layer_end = 4;
  ExpectRejected(receiver_.Accept("req", "rsv", b), "layer range");
}

TEST_F(KvReceiverTest, RejectsTokensBeyondThePrompt) {
  KvBlock b = Blocks(1 << 20)[0];
  b.token_end = kPrompt + 1;
  ExpectRejected(receiver_.Accept("req", "rsv", b), "token range");
}

TEST_F(KvReceiverTest, RejectsOutOfOrderTokens) {
  std::vector<KvBlock> blocks = Blocks(200);
  KvBlock b = blocks[3];  // a later token slice
  b.sequence = 0;
  ExpectRejected(receiver_.Accept("req", "rsv", b), "out of order");
}

TEST_F(KvReceiverTest, RejectsDType) {
  KvBlock b = Blocks(1 << 20)[0];
  b.dtype = KvDType::kBF16;
  ExpectRejected(receiver_.Accept("req", "rsv", b), "dtype");
}

TEST_F(KvReceiverTest, RejectsShape) {
  KvBlock b = Blocks(1 << 20)[0];
  b.shape[3] = 1;
  ExpectRejected(receiver_.Accept("req", "rsv", b), "shape");
}

TEST_F(KvReceiverTest, RejectsDataSize) {
  KvBlock b = Blocks(1 << 20)[0];
  b.data.pop_back();
  b.checksum.reset();
  ExpectRejected(receiver_.Accept("req", "rsv", b), "data");
}

TEST_F(KvReceiverTest, RejectsChecksumMismatch) {
  KvBlock b = Blocks(1 << 20)[0];
  b.data[17] ^= 1;
  ExpectRejected(receiver_.Accept("req", "rsv", b), "checksum");
}

TEST_F(KvReceiverTest, AcceptsBlocksWithoutChecksum) {
  KvBlock b = Blocks(1 << 20)[0];
  b.checksum.reset();
  ASSERT_TRUE(receiver_.Accept("req", "rsv", b).ok());
}

TEST_F(KvReceiverTest, FinishRejectsIncompleteKv) {
  std::vector<KvBlock> blocks = Blocks(200);
  ASSERT_TRUE(receiver_.Accept("req", "rsv", blocks[0]).ok());
  absl::Status s = receiver_.Finish("req", "rsv", Final(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("incomplete"), std::string::npos) << s;
  EXPECT_EQ(dst_.length(), 0);
}

TEST_F(KvReceiverTest, FinishRejectsChunkCountMismatch) {
  std::vector<KvBlock> blocks = Blocks(1 << 20);
  ASSERT_TRUE(receiver_.Accept("req", "rsv", blocks[0]).ok());
  absl::Status s = receiver_.Finish("req", "rsv", Final(2));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("num_chunks"), std::string::npos) << s;
}

TEST_F(KvReceiverTest, FinishRejectsMissingFirstToken) {
  ASSERT_TRUE(receiver_.Accept("req", "rsv", Blocks(1 << 20)[0]).ok());
  KvFinal f = Final(1);
  f.first_token_id = -1;
  absl::Status s = receiver_.Finish("req", "rsv", f);
  EXPECT_NE(s.message().find("first_token_id"), std::string::npos) << s;
}

// A valid serialised state for layer l over the prompt (received attention only).
std::string LayerStateBytes(int64_t l) {
  SelectionLayerState state;
  for (int64_t t = 0; t < kPrompt; ++t) state.received.push_back(static_cast<float>(l * 10 + t));
  return SerializeLayerState(state);
}

TEST_F(KvReceiverTest, FinishCarriesTheSelectionStatesOfEveryLayer) {
  ASSERT_TRUE(receiver_.Accept("req", "rsv", Blocks(1 << 20)[0]).ok());
  KvFinal f = Final(1);
  for (int64_t l = 0; l < 3; ++l) f.selection_states.push_back(LayerStateBytes(l));
  ASSERT_TRUE(receiver_.Finish("req", "rsv", f).ok());
  std::vector<SelectionLayerState> states = receiver_.TakeSelectionStates();
  ASSERT_EQ(states.size(), 3u);
  for (int64_t l = 0; l < 3; ++l) {
    ASSERT_EQ(states[l].received.size(), static_cast<size_t>(kPrompt));
    EXPECT_EQ(states[l].received[1], static_cast<float>(l * 10 + 1));
  }
  EXPECT_TRUE(receiver_.TakeSelectionStates().empty());
}

TEST_F(KvReceiverTest, FinishWithoutSelectionStatesIsStateless) {
  ASSERT_TRUE(receiver_.Accept("req", "rsv", Blocks(1 << 20)[0]).ok());
  ASSERT_TRUE(receiver_.Finish("req", "rsv", Final(1)).ok());
  EXPECT_TRUE(receiver_.TakeSelectionStates().empty());
}

TEST_F(KvReceiverTest, FinishRejectsAWrongSelectionStateCount) {
  ASSERT_TRUE(receiver_.Accept("req", "rsv", Blocks(1 << 20)[0]).ok());
  KvFinal f = Final(1);
  f.selection_states = {LayerStateBytes(0), LayerStateBytes(1)};  // 2 of 3 layers
  absl::Status s = receiver_.Finish("req", "rsv", f);
  ExpectRejected(s, "final.selection_states");
  EXPECT_NE(s.message().find("has 2 entries"), std::string::npos) << s;
  EXPECT_EQ(dst_.length(), 0);  // not runnable
  EXPECT_FALSE(receiver_.finished());
  EXPECT_TRUE(receiver_.TakeSelectionStates().empty());
}

TEST_F(KvReceiverTest, FinishRejectsACorruptSelectionState) {
  ASSERT_TRUE(receiver_.Accept("req", "rsv", Blocks(1 << 20)[0]).ok());
  KvFinal f = Final(1);
  for (int64_t l = 0; l < 3; ++l) f.selection_states.push_back(LayerStateBytes(l));
  f.selection_states[2][12] = static_cast<char>(f.selection_states[2][12] ^ 0x01);
  absl::Status s = receiver_.Finish("req", "rsv", f);
  ExpectRejected(s, "final.selection_states[2]");
  EXPECT_EQ(dst_.length(), 0);
  EXPECT_FALSE(receiver_.finished());
}

// A side channel that delivers each chunk from a queue of encoded blocks: it stands for the
// device link whose bytes never enter the stream.
class FakeSideChannel : public KvSideChannel {
 public:
  explicit FakeSideChannel(std::vector<KvBlock> payloads) : payloads_(std::move(payloads)) {}
  const std::string& id() const override { return id_; }
  absl::Status Receive(const KvBlockRange& range, KvStore* store) override {
    if (next_ >= payloads_.size()) return absl::UnavailableError("link closed");
    const KvBlock& b = payloads_[next_++];
    EXPECT_EQ(b.token_begin, range.token_begin);
    EXPECT_EQ(b.layer_end, range.layer_end);
    return store->Write(b);
  }
  absl::Status Flush() override {
    ++flushes_;
    return absl::OkStatus();
  }
  int flushes_ = 0;

 private:
  std::string id_ = "link-1";
  std::vector<KvBlock> payloads_;
  size_t next_ = 0;
};

// The stream's messages of `blocks` when their payload goes over a link.
std::vector<KvBlock> OutOfBand(std::vector<KvBlock> blocks, const std::string& link) {
  for (KvBlock& b : blocks) {
    b.data.clear();
    b.checksum.reset();
    b.link_id = link;
  }
  return blocks;
}

TEST_F(KvReceiverTest, LinkBlocksArriveThroughTheSideChannel) {
  std::vector<KvBlock> blocks = Blocks(200);
  FakeSideChannel side(blocks);
  for (const KvBlock& b : OutOfBand(blocks, "link-1")) {
    ASSERT_TRUE(receiver_.Accept("req", "rsv", b, &side).ok());
  }
  ASSERT_TRUE(
      receiver_.Finish("req", "rsv", Final(static_cast<int64_t>(blocks.size())), &side).ok());
  EXPECT_EQ(side.flushes_, 1);
  EXPECT_EQ(dst_.length(), kPrompt);
  ExpectPattern(dst_, kPrompt);
}

TEST_F(KvReceiverTest, RejectsALinkBlockWithoutItsLink) {
  std::vector<KvBlock> blocks = OutOfBand(Blocks(1 << 20), "link-1");
  ExpectRejected(receiver_.Accept("req", "rsv", blocks[0]), "chunk.link_id");
}

TEST_F(KvReceiverTest, RejectsALinkBlockOfAnotherLink) {
  FakeSideChannel side(Blocks(1 << 20));
  std::vector<KvBlock> blocks = OutOfBand(Blocks(1 << 20), "link-2");
  ExpectRejected(receiver_.Accept("req", "rsv", blocks[0], &side), "chunk.link_id");
}

TEST_F(KvReceiverTest, RejectsALinkBlockWithAPayload) {
  FakeSideChannel side(Blocks(1 << 20));
  KvBlock b = Blocks(1 << 20)[0];
  b.link_id = "link-1";
  b.checksum.reset();
  ExpectRejected(receiver_.Accept("req", "rsv", b, &side), "chunk.data");
}

TEST_F(KvReceiverTest, ASideChannelFailureFailsTheStream) {
  FakeSideChannel side({});  // nothing to deliver
  absl::Status s = receiver_.Accept("req", "rsv", OutOfBand(Blocks(1 << 20), "link-1")[0], &side);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(receiver_.Accept("req", "rsv", Blocks(1 << 20)[0]).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tokenselect::engine
