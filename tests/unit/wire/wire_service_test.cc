// The KV stream's records through the worker protocol: engine -> proto -> bytes on the wire ->
// proto -> engine gives the same record, the selection state's raw bytes included.
#include "wire/wire_service.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tokenselect::wire {
namespace {

// What the receiver sees: the message serialised and parsed as gRPC does.
v1::KvFinal OverTheWire(const engine::KvFinal& final) {
  v1::PushKvMessage msg;
  ToWire(final, msg.mutable_final());
  v1::PushKvMessage parsed;
  EXPECT_TRUE(parsed.ParseFromString(msg.SerializeAsString()));
  EXPECT_TRUE(parsed.has_final());
  return parsed.final();
}

TEST(WireServiceTest, KvFinalRoundTripCarriesTheSelectionStatesInLayerOrder) {
  engine::KvFinal final;
  final.first_token_id = 17;
  final.first_token_logprob = -0.25f;
  final.first_top_logprobs = {{17, -0.25f}, {3, -1.5f}};
  final.seed = 0xfeedbeefcafeULL;
  final.num_chunks = 9;
  final.prefill_seconds = 0.125;
  // Binary entries (NUL and high bytes, an empty layer): bytes, not text.
  final.selection_states = {std::string("TSLS\0\x01\xff", 7), std::string(),
                            std::string(1000, '\x80')};
  v1::KvFinal wire = OverTheWire(final);
  ASSERT_EQ(wire.selection_states_size(), 3);
  engine::KvFinal back = ToEngine(&wire);
  EXPECT_EQ(back.first_token_id, 17);
  ASSERT_TRUE(back.first_token_logprob.has_value());
  EXPECT_EQ(*back.first_token_logprob, -0.25f);
  ASSERT_EQ(back.first_top_logprobs.size(), 2u);
  EXPECT_EQ(back.first_top_logprobs[1].token_id, 3);
  EXPECT_EQ(back.seed, final.seed);
  EXPECT_EQ(back.num_chunks, 9);
  EXPECT_EQ(back.prefill_seconds, 0.125);
  EXPECT_EQ(back.selection_states, final.selection_states);
}

TEST(WireServiceTest, KvFinalWithoutSelectionStateStaysEmpty) {
  engine::KvFinal final;
  final.first_token_id = 1;
  v1::KvFinal wire = OverTheWire(final);
  EXPECT_EQ(wire.selection_states_size(), 0);
  engine::KvFinal back = ToEngine(&wire);
  EXPECT_TRUE(back.selection_states.empty());
  EXPECT_FALSE(back.first_token_logprob.has_value());
}

}  // namespace
}  // namespace tokenselect::wire
