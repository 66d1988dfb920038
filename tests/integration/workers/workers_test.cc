// A prefill worker and a decode worker in-process over loopback gRPC, driven the way the router
// drives them (Decode -> reservation -> Prefill -> tokens), on a generated checkpoint: outputs
// equal engine::Generator's token for token; cancellation, lease expiry, capacity and bad input
// behave as docs/DESIGN.md sections 2 and 7 say, and every end gives the KV pages back.
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/workers/workers_fixture.h"

namespace tokenselect::testing {
namespace {

TEST_F(WorkersTest, GreedyDenseMatchesGenerator) {
  pb::WorkerRequest request = Request("dense-1", 40, 12);
  request.mutable_selection()->set_policy(pb::SELECTION_POLICY_DENSE);
  request.mutable_selection()->set_chunk_size(16);  // three prefill chunks
  Outcome out = Run(request);
  ASSERT_TRUE(out.prefill_status.ok()) << out.prefill_status.error_message();
  ASSERT_TRUE(out.decode_status.ok()) << out.decode_status.error_message();
  engine::SelectionOptions selection;
  selection.policy = engine::SelectionPolicyKind::kDense;
  selection.chunk_size = 16;
  engine::GenerationResult want = Reference(request, selection);
  EXPECT_EQ(out.ids, want.token_ids);
  EXPECT_EQ(out.text, want.text);
  EXPECT_EQ(out.final.finish_reason(), pb::FINISH_REASON_LENGTH);
  EXPECT_EQ(out.final.usage().prompt_tokens(), 40);
  EXPECT_EQ(out.final.usage().completion_tokens(), 12);
  EXPECT_EQ(out.prefill.prompt_tokens(), 40);
  EXPECT_EQ(out.prefill.first_token_id(), want.token_ids[0]);
  EXPECT_GT(out.prefill.kv_chunks(), 3);
  EXPECT_EQ(out.prefill.kv_bytes(), 40LL * 4 * 2 * 2 * 32 * 4);
}

TEST_F(WorkersTest, GreedyTokenSelectMatchesGenerator) {
  // A budget far below the prompt, so both prefill (mean-query selection per chunk) and decode
  // (soft vote through the selection cache) select.
  pb::WorkerRequest request = Request("ts-1", 64, 10);
  engine::SelectionOptions selection = Select(
      {pb::SELECTION_POLICY_TOKENSELECT, engine::SelectionPolicyKind::kTokenSelect, 8, 4, 8, 16},
      &request);
  request.mutable_selection()->set_theta(0.5);
  selection.theta = 0.5;
  Outcome out = Run(request);
  ASSERT_TRUE(out.prefill_status.ok()) << out.prefill_status.error_message();
  ASSERT_TRUE(out.decode_status.ok()) << out.decode_status.error_message();
  engine::GenerationResult want = Reference(request, selection);
  EXPECT_EQ(out.ids, want.token_ids);
  EXPECT_EQ(out.final.selection_stats().cache_hits(), want.stats.cache.hits);
  EXPECT_EQ(out.final.selection_stats().cache_misses(), want.stats.cache.misses);
}

TEST_F(WorkersTest, SeededSamplingContinuesAcrossTheHandOver) {
  pb::WorkerRequest request = Request("seeded-1", 24, 16);
  request.mutable_sampling()->set_temperature(1.0f);
  request.mutable_sampling()->set_seed(1234);
  Outcome out = Run(request);
  ASSERT_TRUE(out.decode_status.ok()) << out.decode_status.error_message();
  engine::GenerationResult want = Reference(request, engine::SelectionOptions{});
  EXPECT_EQ(out.ids, want.token_ids);
  EXPECT_EQ(out.prefill.seed(), 1234u);
}

TEST_F(WorkersTest, ConcurrentRequestsBatchAndMatchGenerator) {
  // Four requests at once: the prefill worker queues them, the decode loop runs them in one
  // batch (each advances one token per step); every output equals the single-request reference.
  constexpr int kRequests = 4;
  std::vector<pb::WorkerRequest> requests;
  for (int i = 0; i < kRequests; ++i) {
    requests.push_back(Request("batch-" + std::to_string(i), 10 + 7 * i, 8 + 3 * i));
    requests.back().mutable_selection()->set_chunk_size(8);
  }
  std::vector<Outcome> outcomes(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] { outcomes[static_cast<size_t>(i)] = Run(requests[i]); });
  }
  for (std::thread& t : threads) t.join();
  engine::SelectionOptions selection;
  selection.chunk_size = 8;
  for (int i = 0; i < kRequests; ++i) {
    const Outcome& out = outcomes[static_cast<size_t>(i)];
    ASSERT_TRUE(out.decode_status.ok()) << i << ": " << out.decode_status.error_message();
    EXPECT_EQ(out.ids, Reference(requests[i], selection).token_ids) << "request " << i;
  }
}

TEST_F(WorkersTest, ShutdownLetsRunningRequestsFinish) {
  pb::WorkerRequest request = Request("drain-1", 16, 40);
  DecodeCall call;
  ASSERT_TRUE(OpenDecode(request, &call));
  ASSERT_TRUE(Prefill(request, call.reservation).ok());
  std::thread stopper([&] { decode_->Shutdown(absl::Seconds(10)); });
  Outcome out;
  EXPECT_TRUE(call.Finish(&out).ok());
  EXPECT_EQ(out.ids.size(), 40u);
  stopper.join();
  EXPECT_EQ(decode_->engine().kv_capacity().free_pages, 64);
}

// grpc.health.v1.Health/Check with an empty request (the whole server); the response's field 1
// (status) is SERVING = 1, serialized as bytes 08 01. Raw bytes keep the test free of the
// health proto.
std::string HealthCheck(const std::string& address) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  grpc::Slice empty("", 0);
  grpc::ByteBuffer request(&empty, 1);  // an empty HealthCheckRequest
  grpc::ByteBuffer response;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = s;
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return "error: " + status.error_message();
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return "error: dump";
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes;
}

TEST_F(WorkersTest, HealthServiceReportsServing) {
  EXPECT_EQ(HealthCheck(decode_->address()), std::string("\x08\x01"));
  EXPECT_EQ(HealthCheck(prefill_->address()), std::string("\x08\x01"));
}

TEST_F(WorkersTest, GetLoadReportsCapacity) {
  auto stub = DecodeStub(decode_->address());
  grpc::ClientContext ctx;
  pb::WorkerLoad load;
  ASSERT_TRUE(stub->GetLoad(&ctx, pb::GetLoadRequest(), &load).ok());
  EXPECT_EQ(load.total_kv_pages(), 64);
  EXPECT_EQ(load.free_kv_pages(), 64);
  EXPECT_EQ(load.page_size(), 16);
  EXPECT_FALSE(load.draining());
  grpc::ClientContext pctx;
  ASSERT_TRUE(prefill_stub_->GetLoad(&pctx, pb::GetLoadRequest(), &load).ok());
  EXPECT_EQ(load.queued_prefill_tokens(), 0);
}

TEST_F(WorkersTest, EveryPolicyMatchesGenerator) {
  // The budget (4 + 32 + 16) is far below the 200-token prompt, so every policy selects. The
  // stateful ones (tokenselect_span: span index; infllm: received attention; cascade: its
  // sub-caches) build per-layer state during prefill that travels in the KV stream's final
  // record (docs/kv_transfer.md, "Selection state"): the decode worker continues from it, so
  // they too equal the single-process output token for token.
  struct Case {
    pb::SelectionPolicy wire;
    engine::SelectionPolicyKind policy;
  };
  const std::vector<Case> cases = {
      {pb::SELECTION_POLICY_TOPK, engine::SelectionPolicyKind::kTopK},
      {pb::SELECTION_POLICY_HEAD_VOTE, engine::SelectionPolicyKind::kHeadVote},
      {pb::SELECTION_POLICY_STREAMING, engine::SelectionPolicyKind::kStreaming},
      {pb::SELECTION_POLICY_INFLLM, engine::SelectionPolicyKind::kInfLlm},
      {pb::SELECTION_POLICY_QUEST, engine::SelectionPolicyKind::kQuest},
      {pb::SELECTION_POLICY_TOKENSELECT_SPAN, engine::SelectionPolicyKind::kTokenSelectSpan},
      {pb::SELECTION_POLICY_CASCADE, engine::SelectionPolicyKind::kCascade}};
  int n = 0;
  for (const Case& c : cases) {
    pb::WorkerRequest request = Request("policy-" + std::to_string(n++), 200, 12);
    const engine::SelectionOptions selection = Select({c.wire, c.policy, 32, 4, 16, 32}, &request);
    Outcome out = Run(request);
    const std::string name(engine::PolicyName(c.policy));
    ASSERT_TRUE(out.prefill_status.ok()) << name << ": " << out.prefill_status.error_message();
    ASSERT_TRUE(out.decode_status.ok()) << name << ": " << out.decode_status.error_message();
    EXPECT_EQ(out.ids.size(), 12u) << name;
    EXPECT_EQ(out.ids, Reference(request, selection).token_ids) << name;
  }
}

TEST_F(WorkersTest, InfLlmWithSmallBlocksMatchesGenerator) {
  // With the default 128-token blocks a k of 32 selects no block, so InfLLM's received attention
  // (its representative keys) would not matter above; with 8-token blocks it picks 4 blocks by
  // representatives chosen from the attention received during prefill, which only the final
  // record's selection state gives the decode worker.
  engine::SelectionOptions selection;
  selection.policy = engine::SelectionPolicyKind::kInfLlm;
  selection.baselines.infllm_block_size = 8;
  selection.baselines.infllm_representatives = 2;
  prefill_->Shutdown(absl::Seconds(1));
  prefill_worker::PrefillWorkerOptions p;
  p.model_dir = *model_dir_;
  p.backend.kv_pages = 64;
  p.default_selection = selection;
  auto prefill = prefill_worker::StartPrefillWorker(p);
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  prefill_ = std::move(prefill).value();
  prefill_stub_ = pb::PrefillWorker::NewStub(
      grpc::CreateChannel(prefill_->address(), grpc::InsecureChannelCredentials()));
  decode_worker::DecodeWorkerOptions d;
  d.model = loaded_->model.get();
  d.tokenizer = loaded_->tokenizer.get();
  d.backend.kv_pages = 64;
  d.backend.page_size = 16;
  d.default_selection = selection;
  auto decode = decode_worker::StartDecodeWorker(d);
  ASSERT_TRUE(decode.ok()) << decode.status();

  pb::WorkerRequest request = Request("infllm-blocks", 200, 12);
  const engine::SelectionOptions reference =
      Select({pb::SELECTION_POLICY_INFLLM, engine::SelectionPolicyKind::kInfLlm, 32, 4, 16, 32},
             &request, selection);
  Outcome out = Run(request, decode->get());
  ASSERT_TRUE(out.prefill_status.ok()) << out.prefill_status.error_message();
  ASSERT_TRUE(out.decode_status.ok()) << out.decode_status.error_message();
  EXPECT_EQ(out.ids, Reference(request, reference).token_ids);
  (*decode)->Shutdown(absl::Seconds(1));
  EXPECT_TRUE((*decode)->cpu_pool()->CheckNoLeaks().ok());
}

}  // namespace
}  // namespace tokenselect::testing
