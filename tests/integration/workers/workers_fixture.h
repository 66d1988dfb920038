// The fixture of the workers integration tests: a generated checkpoint, a decode worker and a
// prefill worker started in-process on loopback, and the router's part of a request (Decode ->
// reservation -> Prefill -> token stream) as a helper. docs/DESIGN.md section 2.
#ifndef TOKENSELECT_TESTS_INTEGRATION_WORKERS_WORKERS_FIXTURE_H_
#define TOKENSELECT_TESTS_INTEGRATION_WORKERS_WORKERS_FIXTURE_H_

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "decode_worker/decode_worker.h"
#include "engine/generation/demo_checkpoint.h"
#include "engine/generation/generator.h"
#include "engine/generation/model_loader.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prefill_worker/prefill_worker.h"
#include "proto/tokenselect/v1/worker.grpc.pb.h"

namespace tokenselect::testing {

namespace pb = ::tokenselect::v1;

struct Outcome {
  grpc::Status decode_status;
  grpc::Status prefill_status;
  pb::Reservation reservation;
  pb::PrefillResponse prefill;
  std::vector<int32_t> ids;
  std::string text;
  pb::DecodeFinal final;
};

// A Decode stream opened by WorkersTest::OpenDecode, the way the router opens one.
struct DecodeCall {
  // Reads the rest of the stream into out->ids, out->text and out->final; returns its status.
  grpc::Status Finish(Outcome* out) {
    while (reader->Read(&msg)) {
      if (msg.has_tokens()) {
        for (int32_t id : msg.tokens().token_ids()) out->ids.push_back(id);
        out->text += msg.tokens().text();
      } else if (msg.has_final()) {
        out->final = msg.final();
      }
    }
    return reader->Finish();
  }
  // The router gives up: cancels the stream, reads it to its end and returns its status.
  grpc::Status Cancel() {
    ctx.TryCancel();
    while (reader->Read(&msg)) {
    }
    return reader->Finish();
  }

  std::unique_ptr<pb::DecodeWorker::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<pb::DecodeResponse>> reader;
  pb::DecodeResponse msg;       // the message read last
  pb::Reservation reservation;  // from the stream's first message
};

// A selection set alike on a request (wire form) and on Reference's options (engine form).
struct Selection {
  pb::SelectionPolicy wire;
  engine::SelectionPolicyKind policy;
  int k;
  int n_init;
  int n_local;
  int chunk_size;
};

class WorkersTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_dir_ = new std::string(::testing::TempDir() + "/workers_test_model");
    ASSERT_TRUE(engine::WriteDemoCheckpoint(*model_dir_, engine::DemoCheckpointOptions{}).ok());
    auto loaded = engine::LoadModelDirectory(*model_dir_, engine::LoadFormat::kSafetensors);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    loaded_ = new engine::LoadedModel(std::move(*loaded));
  }
  static void TearDownTestSuite() {
    delete loaded_;
    delete model_dir_;
  }

  void SetUp() override {
    decode_ = StartDecode(64, absl::Seconds(30), nullptr);
    prefill_worker::PrefillWorkerOptions p;
    p.model_dir = *model_dir_;  // this one loads the checkpoint itself
    p.backend.kv_pages = 64;
    p.engine.kv.max_block_bytes = 4096;  // several PushKv messages per chunk
    p.engine.kv.checksum = true;
    auto prefill = prefill_worker::StartPrefillWorker(p);
    ASSERT_TRUE(prefill.ok()) << prefill.status();
    prefill_ = std::move(prefill).value();
    prefill_stub_ = pb::PrefillWorker::NewStub(
        grpc::CreateChannel(prefill_->address(), grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    prefill_->Shutdown(absl::Seconds(1));
    decode_->Shutdown(absl::Seconds(1));
    EXPECT_TRUE(prefill_->cpu_pool()->CheckNoLeaks().ok());
    EXPECT_TRUE(decode_->cpu_pool()->CheckNoLeaks().ok());
  }

  std::unique_ptr<decode_worker::DecodeWorker> StartDecode(int64_t pages, absl::Duration lease,
                                                           common::Clock* clock) {
    decode_worker::DecodeWorkerOptions d;
    d.model = loaded_->model.get();
    d.tokenizer = loaded_->tokenizer.get();
    d.backend.kv_pages = pages;
    d.backend.page_size = 16;
    d.engine.lease_timeout = lease;
    d.engine.clock = clock;
    auto worker = decode_worker::StartDecodeWorker(d);
    EXPECT_TRUE(worker.ok()) << worker.status();
    return worker.ok() ? std::move(worker).value() : nullptr;
  }

  static std::unique_ptr<pb::DecodeWorker::Stub> DecodeStub(const std::string& address) {
    return pb::DecodeWorker::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }

  static std::vector<int32_t> Prompt(int n) {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back((i * 7919 + 13) % 2000);
    return ids;
  }

  static pb::WorkerRequest Request(const std::string& id, int prompt_len, int max_new) {
    pb::WorkerRequest r;
    r.set_request_id(id);
    for (int32_t t : Prompt(prompt_len)) r.add_prompt_token_ids(t);
    r.mutable_sampling()->set_temperature(0);
    r.mutable_sampling()->set_max_new_tokens(max_new);
    r.mutable_sampling()->set_ignore_eos(true);
    return r;
  }

  // Sets `selection` on `request` and returns it in the engine's form, on top of `base`.
  static engine::SelectionOptions Select(const Selection& selection, pb::WorkerRequest* request,
                                         engine::SelectionOptions base = {}) {
    pb::SelectionParams* s = request->mutable_selection();
    s->set_policy(selection.wire);
    s->set_k(selection.k);
    s->set_n_init(selection.n_init);
    s->set_n_local(selection.n_local);
    s->set_chunk_size(selection.chunk_size);
    base.policy = selection.policy;
    base.k = selection.k;
    base.n_init = selection.n_init;
    base.n_local = selection.n_local;
    base.chunk_size = selection.chunk_size;
    return base;
  }

  // Opens a Decode stream for `request` on `decode` (default decode_) and reads its first message
  // into call->reservation. False when the stream ends first (call->reader->Finish() says why).
  bool OpenDecode(const pb::WorkerRequest& request, DecodeCall* call,
                  decode_worker::DecodeWorker* decode = nullptr) {
    if (decode == nullptr) decode = decode_.get();
    call->stub = DecodeStub(decode->address());
    pb::DecodeRequest dreq;
    *dreq.mutable_request() = request;
    dreq.set_prefill_worker_address(prefill_->address());
    call->reader = call->stub->Decode(&call->ctx, dreq);
    if (!call->reader->Read(&call->msg)) return false;
    call->reservation = call->msg.reservation();
    return true;
  }

  // Prefills `request` into `reservation` on `decode` (default decode_); `ctx` (default: a fresh
  // one) may carry a deadline. The response goes to `response` when given.
  grpc::Status Prefill(const pb::WorkerRequest& request, const pb::Reservation& reservation,
                       decode_worker::DecodeWorker* decode = nullptr,
                       pb::PrefillResponse* response = nullptr,
                       grpc::ClientContext* ctx = nullptr) {
    if (decode == nullptr) decode = decode_.get();
    grpc::ClientContext own_ctx;
    pb::PrefillResponse own_response;
    pb::PrefillRequest preq;
    *preq.mutable_request() = request;
    preq.set_decode_worker_address(decode->address());
    *preq.mutable_reservation() = reservation;
    return prefill_stub_->Prefill(ctx != nullptr ? ctx : &own_ctx, preq,
                                  response != nullptr ? response : &own_response);
  }

  // A retried Prefill into call's (rewound) reservation completes the request, and its tokens
  // equal the single-process reference under `selection`. Fatal failures: wrap the call in
  // ASSERT_NO_FATAL_FAILURE.
  void CheckRetriedPrefill(const pb::WorkerRequest& request,
                           const engine::SelectionOptions& selection, DecodeCall* call) {
    const grpc::Status prefill = Prefill(request, call->reservation);
    ASSERT_TRUE(prefill.ok()) << prefill.error_message();
    Outcome out;
    ASSERT_TRUE(call->Finish(&out).ok());
    EXPECT_EQ(out.ids, Reference(request, selection).token_ids);
  }

  // The router's part: Decode, then Prefill into the reservation, then read the token stream.
  Outcome Run(const pb::WorkerRequest& request, decode_worker::DecodeWorker* decode = nullptr) {
    if (decode == nullptr) decode = decode_.get();
    Outcome out;
    DecodeCall call;
    if (!OpenDecode(request, &call, decode)) {
      out.decode_status = call.reader->Finish();
      return out;
    }
    EXPECT_TRUE(call.msg.has_reservation());
    out.reservation = call.reservation;
    out.prefill_status = Prefill(request, out.reservation, decode, &out.prefill);
    out.decode_status = call.Finish(&out);
    return out;
  }

  engine::GenerationResult Reference(const pb::WorkerRequest& request,
                                     const engine::SelectionOptions& selection) {
    auto pool = engine::PagePool::Create(loaded_->model->KvCacheOptions(64, 16));
    EXPECT_TRUE(pool.ok());
    engine::Generator generator(loaded_->model.get(), loaded_->tokenizer.get(), pool->get());
    engine::GenerationOptions options;
    options.sampling.temperature = request.sampling().temperature();
    if (request.sampling().has_seed()) options.sampling.seed = request.sampling().seed();
    options.sampling.max_new_tokens = request.sampling().max_new_tokens();
    options.sampling.ignore_eos = request.sampling().ignore_eos();
    options.selection = selection;
    std::vector<int32_t> prompt(request.prompt_token_ids().begin(),
                                request.prompt_token_ids().end());
    auto result = generator.Generate(prompt, options, nullptr);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : engine::GenerationResult{};
  }

  // Polls until the decode worker's free pages equal `want` (pages are freed between steps).
  static bool WaitForFreePages(decode_worker::DecodeWorker* w, int64_t want) {
    const absl::Time end = absl::Now() + absl::Seconds(5);
    while (absl::Now() < end) {
      if (w->engine().kv_capacity().free_pages == want) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }

  static std::string* model_dir_;
  static engine::LoadedModel* loaded_;
  std::unique_ptr<decode_worker::DecodeWorker> decode_;
  std::unique_ptr<prefill_worker::PrefillWorker> prefill_;
  std::unique_ptr<pb::PrefillWorker::Stub> prefill_stub_;
};

}  // namespace tokenselect::testing

#endif  // TOKENSELECT_TESTS_INTEGRATION_WORKERS_WORKERS_FIXTURE_H_
