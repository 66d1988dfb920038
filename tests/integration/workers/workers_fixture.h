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
    p.engine.kv_pages = 64;
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
    EXPECT_TRUE(prefill_->engine().pool().CheckNoLeaks().ok());
    EXPECT_TRUE(decode_->engine().pool().CheckNoLeaks().ok());
  }

  std::unique_ptr<decode_worker::DecodeWorker> StartDecode(int64_t pages, absl::Duration lease,
                                                           common::Clock* clock) {
    decode_worker::DecodeWorkerOptions d;
    d.model = loaded_->model.get();
    d.tokenizer = loaded_->tokenizer.get();
    d.engine.kv_pages = pages;
    d.engine.page_size = 16;
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

  // The router's part: Decode, then Prefill into the reservation, then read the token stream.
  Outcome Run(const pb::WorkerRequest& request, decode_worker::DecodeWorker* decode = nullptr) {
    if (decode == nullptr) decode = decode_.get();
    Outcome out;
    auto stub = DecodeStub(decode->address());
    grpc::ClientContext dctx;
    pb::DecodeRequest dreq;
    *dreq.mutable_request() = request;
    dreq.set_prefill_worker_address(prefill_->address());
    auto reader = stub->Decode(&dctx, dreq);
    pb::DecodeResponse msg;
    if (!reader->Read(&msg)) {
      out.decode_status = reader->Finish();
      return out;
    }
    EXPECT_TRUE(msg.has_reservation());
    out.reservation = msg.reservation();
    grpc::ClientContext pctx;
    pb::PrefillRequest preq;
    *preq.mutable_request() = request;
    preq.set_decode_worker_address(decode->address());
    *preq.mutable_reservation() = out.reservation;
    out.prefill_status = prefill_stub_->Prefill(&pctx, preq, &out.prefill);
    while (reader->Read(&msg)) {
      if (msg.has_tokens()) {
        for (int32_t id : msg.tokens().token_ids()) out.ids.push_back(id);
        out.text += msg.tokens().text();
      } else if (msg.has_final()) {
        out.final = msg.final();
      }
    }
    out.decode_status = reader->Finish();
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
      if (w->engine().pool().num_free_pages() == want) return true;
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
