// Failure paths of the workers (cancellation, lease expiry, capacity, bad input, broken KV
// streams, deadlines): every one ends with the documented status and gives the KV pages back.
#include <string>
#include <thread>
#include <vector>

#include "engine/selection/layer_state.h"
#include "tests/integration/workers/workers_fixture.h"

namespace tokenselect::testing {
namespace {

TEST_F(WorkersTest, PrefillPastItsDeadlineFreesItsPages) {
  pb::WorkerRequest request = Request("deadline-1", 600, 4);
  request.mutable_selection()->set_chunk_size(8);  // 75 chunks: plenty of abort points
  DecodeCall call;
  ASSERT_TRUE(OpenDecode(request, &call));
  grpc::ClientContext pctx;
  pctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(5));
  EXPECT_EQ(Prefill(request, call.reservation, nullptr, nullptr, &pctx).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  const engine::PagePool& pool = *prefill_->cpu_pool();
  const absl::Time end = absl::Now() + absl::Seconds(5);
  while (pool.num_free_pages() != pool.num_pages() && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(pool.num_free_pages(), pool.num_pages());
  // The decode side keeps the (rewound) reservation for a retry until the router gives up.
  EXPECT_EQ(decode_->engine().Load().waiting, 1);
  call.Cancel();
  EXPECT_TRUE(WaitForFreePages(decode_.get(), 64));
}

TEST_F(WorkersTest, CancelMidStreamFreesPages) {
  const int64_t baseline = decode_->engine().kv_capacity().free_pages;
  pb::WorkerRequest request = Request("cancel-1", 32, 500);
  DecodeCall call;
  ASSERT_TRUE(OpenDecode(request, &call));
  ASSERT_TRUE(call.msg.has_reservation());
  EXPECT_EQ(decode_->engine().kv_capacity().free_pages, baseline - (32 + 500 + 15) / 16);
  ASSERT_TRUE(Prefill(request, call.reservation).ok());
  int tokens = 0;
  while (tokens < 3 && call.reader->Read(&call.msg)) tokens += call.msg.tokens().token_ids_size();
  ASSERT_GE(tokens, 3);
  EXPECT_EQ(call.Cancel().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitForFreePages(decode_.get(), baseline));
  EXPECT_EQ(prefill_->engine().kv_capacity().free_pages, prefill_->engine().kv_capacity().total_pages);
}

TEST_F(WorkersTest, CancelRpcEndsTheStream) {
  const int64_t baseline = decode_->engine().kv_capacity().free_pages;
  DecodeCall call;
  ASSERT_TRUE(OpenDecode(Request("cancel-2", 8, 8), &call));
  grpc::ClientContext cctx;
  pb::CancelRequest creq;
  creq.set_request_id("cancel-2");
  pb::CancelResponse cresp;
  ASSERT_TRUE(call.stub->Cancel(&cctx, creq, &cresp).ok());
  EXPECT_TRUE(cresp.found());
  EXPECT_FALSE(call.reader->Read(&call.msg));
  EXPECT_EQ(call.reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(decode_->engine().kv_capacity().free_pages, baseline);
}

TEST_F(WorkersTest, ReservationWithoutKvExpiresAfterTheLease) {
  common::FakeClock clock(absl::FromUnixSeconds(1000));
  auto decode = StartDecode(16, absl::Seconds(5), &clock);
  ASSERT_NE(decode, nullptr);
  const int64_t baseline = decode->engine().kv_capacity().free_pages;
  const pb::WorkerRequest request = Request("lease-1", 20, 10);
  DecodeCall call;
  ASSERT_TRUE(OpenDecode(request, &call, decode.get()));
  EXPECT_EQ(call.reservation.lease_expires_unix_ms(), 1005000);
  EXPECT_EQ(decode->engine().kv_capacity().free_pages, baseline - 2);
  absl::SleepFor(absl::Milliseconds(50));  // real time alone frees nothing
  EXPECT_EQ(decode->engine().kv_capacity().free_pages, baseline - 2);
  clock.Advance(absl::Seconds(6));
  EXPECT_FALSE(call.reader->Read(&call.msg));
  EXPECT_EQ(call.reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(decode->engine().kv_capacity().free_pages, baseline);
  // KV arriving late finds no reservation.
  EXPECT_EQ(Prefill(request, call.reservation, decode.get()).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(prefill_->engine().kv_capacity().free_pages, prefill_->engine().kv_capacity().total_pages);
  decode->Shutdown(absl::ZeroDuration());
}

TEST_F(WorkersTest, OverCapacityIsResourceExhausted) {
  auto decode = StartDecode(8, absl::Seconds(30), nullptr);  // 128 token slots
  ASSERT_NE(decode, nullptr);
  DecodeCall first;
  ASSERT_TRUE(OpenDecode(Request("cap-1", 50, 40), &first, decode.get()));  // 6 pages
  ASSERT_TRUE(first.msg.has_reservation());

  Outcome second = Run(Request("cap-2", 30, 20), decode.get());  // 4 pages: 2 are free
  EXPECT_EQ(second.decode_status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << second.decode_status.error_message();
  Outcome too_long = Run(Request("cap-3", 100, 100), decode.get());
  EXPECT_EQ(too_long.decode_status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(too_long.decode_status.error_message().find("prompt too long"), std::string::npos);
  first.Cancel();
  EXPECT_TRUE(WaitForFreePages(decode.get(), 8));
  decode->Shutdown(absl::ZeroDuration());
}

TEST_F(WorkersTest, BadInputIsInvalidArgumentNamingTheField) {
  struct Case {
    std::string field;
    pb::WorkerRequest request;
  };
  std::vector<Case> cases;
  cases.push_back({"prompt_token_ids", Request("bad-1", 0, 4)});
  cases.push_back({"prompt_token_ids[1]", Request("bad-2", 4, 4)});
  cases.back().request.set_prompt_token_ids(1, 99999);
  cases.push_back({"sampling.top_p", Request("bad-3", 4, 4)});
  cases.back().request.mutable_sampling()->set_top_p(1.5f);
  cases.push_back({"sampling.max_new_tokens", Request("bad-4", 4, 0)});
  cases.push_back({"selection.k", Request("bad-5", 4, 4)});
  cases.back().request.mutable_selection()->set_k(-3);
  cases.push_back({"request_id", Request("", 4, 4)});
  for (const Case& c : cases) {
    Outcome out = Run(c.request);
    EXPECT_EQ(out.decode_status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_NE(out.decode_status.error_message().find(c.field), std::string::npos)
        << c.field << ": " << out.decode_status.error_message();
  }
  // The prefill worker checks its own inputs too.
  grpc::ClientContext pctx;
  pb::PrefillRequest preq;
  *preq.mutable_request() = Request("bad-6", 4, 4);
  pb::PrefillResponse presp;
  grpc::Status status = prefill_stub_->Prefill(&pctx, preq, &presp);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("decode_worker_address"), std::string::npos)
      << status.error_message();
  EXPECT_EQ(decode_->engine().kv_capacity().free_pages, 64);
}

TEST_F(WorkersTest, PrefillChecksTheReservationAndTheDecodeWorker) {
  pb::PrefillRequest preq;
  *preq.mutable_request() = Request("peer-1", 8, 4);
  pb::Reservation* r = preq.mutable_reservation();
  r->set_reservation_id("rsv-x");
  r->set_request_id("peer-1");
  r->set_prompt_tokens(8);
  r->mutable_layout()->set_num_layers(4);
  r->mutable_layout()->set_num_kv_heads(2);
  r->mutable_layout()->set_head_dim(64);  // the model has 32
  r->mutable_layout()->set_dtype(pb::KV_DTYPE_F32);
  preq.set_decode_worker_address("127.0.0.1:1");
  pb::PrefillResponse presp;
  {
    grpc::ClientContext ctx;
    grpc::Status status = prefill_stub_->Prefill(&ctx, preq, &presp);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(status.error_message().find("head_dim"), std::string::npos) << status.error_message();
  }
  r->mutable_layout()->set_head_dim(32);
  {
    grpc::ClientContext ctx;  // nobody listens on port 1
    EXPECT_EQ(prefill_stub_->Prefill(&ctx, preq, &presp).error_code(),
              grpc::StatusCode::UNAVAILABLE);
  }
  EXPECT_EQ(prefill_->engine().kv_capacity().free_pages, prefill_->engine().kv_capacity().total_pages);
}

TEST_F(WorkersTest, BadKvIsRejectedAndThePrefillCanBeRetried) {
  pb::WorkerRequest request = Request("retry-1", 20, 6);
  DecodeCall call;
  ASSERT_TRUE(OpenDecode(request, &call));

  // A broken sender: a block whose shape does not match the reservation's layout.
  {
    grpc::ClientContext kctx;
    pb::PushKvResponse kresp;
    auto writer = call.stub->PushKv(&kctx, &kresp);
    pb::PushKvMessage bad;
    bad.set_request_id("retry-1");
    bad.set_reservation_id(call.reservation.reservation_id());
    pb::KvChunk* chunk = bad.mutable_chunk();
    chunk->set_layer_begin(0);
    chunk->set_layer_end(1);
    chunk->set_token_begin(0);
    chunk->set_token_end(1);
    chunk->set_dtype(pb::KV_DTYPE_F32);
    for (int64_t d : {1, 2, 1, 2, 16}) chunk->add_shape(d);
    chunk->set_data(std::string(2 * 2 * 16 * 4, '\0'));
    writer->Write(bad);
    writer->WritesDone();
    grpc::Status status = writer->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find("shape"), std::string::npos) << status.error_message();
  }
  // The reservation was rewound, not lost: a retried prefill completes the request.
  ASSERT_NO_FATAL_FAILURE(CheckRetriedPrefill(request, engine::SelectionOptions{}, &call));
}

// Device K/V links on CPU workers: ConnectKvLink is FAILED_PRECONDITION, a chunk that names a
// link is INVALID_ARGUMENT naming chunk.link_id (and the reservation survives for a retried
// prefill), and a prefill worker asked for --transport nccl without a GPU refuses to start.
TEST_F(WorkersTest, DeviceLinksAreRefusedOnTheCpu) {
  pb::WorkerRequest request = Request("link-1", 20, 6);
  DecodeCall call;
  ASSERT_TRUE(OpenDecode(request, &call));
  {
    grpc::ClientContext ctx;
    pb::ConnectKvLinkRequest link;
    link.set_link_id("kvlink-x");
    link.set_nccl_unique_id(std::string(128, '\0'));
    link.set_max_chunk_tokens(512);
    pb::ConnectKvLinkResponse response;
    const grpc::Status status = call.stub->ConnectKvLink(&ctx, link, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(status.error_message().find("--device cuda"), std::string::npos)
        << status.error_message();
  }
  {
    grpc::ClientContext kctx;
    pb::PushKvResponse kresp;
    auto writer = call.stub->PushKv(&kctx, &kresp);
    pb::PushKvMessage msg;
    msg.set_request_id("link-1");
    msg.set_reservation_id(call.reservation.reservation_id());
    pb::KvChunk* chunk = msg.mutable_chunk();
    chunk->set_layer_end(call.reservation.layout().num_layers());
    chunk->set_token_end(20);
    chunk->set_dtype(pb::KV_DTYPE_F32);
    chunk->set_link_id("kvlink-x");
    writer->Write(msg);
    writer->WritesDone();
    const grpc::Status status = writer->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find("chunk.link_id"), std::string::npos)
        << status.error_message();
  }
  ASSERT_NO_FATAL_FAILURE(CheckRetriedPrefill(request, engine::SelectionOptions{}, &call));

  prefill_worker::PrefillWorkerOptions p;
  p.model_dir = *model_dir_;
  p.backend.kv_pages = 16;
  p.transport_kind = "nccl";
  auto nccl = prefill_worker::StartPrefillWorker(p);
  ASSERT_FALSE(nccl.ok());
  EXPECT_EQ(nccl.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(nccl.status().message().find("--transport nccl"), std::string::npos) << nccl.status();
  p.transport_kind = "carrier-pigeon";
  EXPECT_EQ(prefill_worker::StartPrefillWorker(p).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A hand-driven PushKv: complete K/V (zeros, one block per layer) for `reservation`, then a final
// record with `selection_states`. Returns the decode worker's verdict.
grpc::Status PushKvWithStates(pb::DecodeWorker::Stub* stub, const std::string& request_id,
                              const pb::Reservation& reservation,
                              const std::vector<std::string>& selection_states) {
  const pb::KvLayout& layout = reservation.layout();
  const int64_t tokens = reservation.prompt_tokens();
  grpc::ClientContext ctx;
  pb::PushKvResponse response;
  auto writer = stub->PushKv(&ctx, &response);
  for (int32_t l = 0; l < layout.num_layers(); ++l) {
    pb::PushKvMessage msg;
    msg.set_request_id(request_id);
    msg.set_reservation_id(reservation.reservation_id());
    pb::KvChunk* chunk = msg.mutable_chunk();
    chunk->set_sequence(l);
    chunk->set_layer_begin(l);
    chunk->set_layer_end(l + 1);
    chunk->set_token_begin(0);
    chunk->set_token_end(tokens);
    chunk->set_dtype(pb::KV_DTYPE_F32);
    for (int64_t d : {int64_t{1}, int64_t{2}, tokens, int64_t{layout.num_kv_heads()},
                      int64_t{layout.head_dim()}}) {
      chunk->add_shape(d);
    }
    chunk->set_data(std::string(
        static_cast<size_t>(2 * tokens * layout.num_kv_heads() * layout.head_dim() * 4), '\0'));
    if (!writer->Write(msg)) break;
  }
  pb::PushKvMessage last;
  last.set_request_id(request_id);
  last.set_reservation_id(reservation.reservation_id());
  last.mutable_final()->set_first_token_id(1);
  last.mutable_final()->set_num_chunks(layout.num_layers());
  for (const std::string& state : selection_states) {
    last.mutable_final()->add_selection_states(state);
  }
  writer->Write(last);
  writer->WritesDone();
  return writer->Finish();
}

TEST_F(WorkersTest, BadSelectionStateIsRejectedAndThePrefillCanBeRetried) {
  pb::WorkerRequest request = Request("state-1", 40, 6);
  const engine::SelectionOptions selection = Select(
      {pb::SELECTION_POLICY_INFLLM, engine::SelectionPolicyKind::kInfLlm, 8, 2, 4, 16}, &request);
  DecodeCall call;
  ASSERT_TRUE(OpenDecode(request, &call));
  const pb::Reservation& reservation = call.reservation;
  const int layers = reservation.layout().num_layers();
  ASSERT_GT(layers, 1);

  // A wrong count: one entry for a model of several layers.
  grpc::Status status = PushKvWithStates(call.stub.get(), "state-1", reservation, {"x"});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("final.selection_states has 1 entries"), std::string::npos)
      << status.error_message();
  // The right count, but layer 1 does not decode (the others are valid empty states).
  std::vector<std::string> corrupt(static_cast<size_t>(layers),
                                   engine::SerializeLayerState(engine::SelectionLayerState()));
  corrupt[1] = "TSLS garbage";
  status = PushKvWithStates(call.stub.get(), "state-1", reservation, corrupt);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("final.selection_states[1]"), std::string::npos)
      << status.error_message();

  // Nothing was decoded on the rejected state: a retried prefill completes the request and its
  // output equals one process's (the state restored this time).
  ASSERT_NO_FATAL_FAILURE(CheckRetriedPrefill(request, selection, &call));
  EXPECT_TRUE(WaitForFreePages(decode_.get(), 64));
}

TEST_F(WorkersTest, CancelAfterABadSelectionStateFreesThePages) {
  pb::WorkerRequest request = Request("state-2", 40, 6);
  request.mutable_selection()->set_policy(pb::SELECTION_POLICY_CASCADE);
  DecodeCall call;
  ASSERT_TRUE(OpenDecode(request, &call));
  EXPECT_LT(decode_->engine().kv_capacity().free_pages, 64);
  std::vector<std::string> corrupt(static_cast<size_t>(call.reservation.layout().num_layers()),
                                   std::string(64, '\x5a'));
  grpc::Status status = PushKvWithStates(call.stub.get(), "state-2", call.reservation, corrupt);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("final.selection_states[0]"), std::string::npos)
      << status.error_message();
  // The router gives up: cancelling the Decode stream frees the reservation at once.
  call.ctx.TryCancel();
  while (call.reader->Read(&call.msg)) {
    EXPECT_FALSE(call.msg.has_tokens()) << "decoded on a rejected selection state";
  }
  EXPECT_EQ(call.reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitForFreePages(decode_.get(), 64));
}

}  // namespace
}  // namespace tokenselect::testing
