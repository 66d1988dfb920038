// C++ client of the public tokenselect.v1.Generation API (no generated types in this header):
// blocking GenerateUnary, streaming Generate with a callback or an iterator, Tokenize,
// GetModelInfo and a health check; deadlines, cancellation, TLS and API keys.
//
//   ClientOptions options;
//   options.target = "localhost:50051";
//   ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Create(options));
//   GenerateInput input;
//   input.prompt = "Hello";
//   input.sampling.temperature = 0;
//   ASSIGN_OR_RETURN(GenerateResult r, client->Generate(input, {}, [](const StreamChunk& c) {
//     std::fputs(c.text.c_str(), stdout);
//     return true;  // false cancels the request
//   }));
#ifndef TOKENSELECT_CLIENTS_CLIENT_H_
#define TOKENSELECT_CLIENTS_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rpc/channels.h"
#include "rpc/health_client.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace tokenselect::clients {

struct ClientOptions {
  std::string target;   // "host:port" or "dns:///name:port"
  rpc::TlsOptions tls;  // disabled: plaintext
  std::string api_key;  // sent as "authorization: Bearer KEY" when not empty
  int max_message_bytes = rpc::kDefaultMaxMessageBytes;
};

// Mirrors tokenselect.v1.SamplingParams; unset fields take the server's defaults.
struct Sampling {
  std::optional<float> temperature, top_p, min_p, repetition_penalty, frequency_penalty,
      presence_penalty;
  std::optional<int32_t> top_k, max_new_tokens;
  std::optional<uint64_t> seed;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  bool logprobs = false;
  int32_t top_logprobs = 0;
};

// Mirrors tokenselect.v1.SelectionParams; `policy` is "" (keeps the server's) or one of
// "tokenselect", "topk", "head_vote", "dense", "streaming", "tokenselect_span", "infllm",
// "quest", "cascade" (every value of tokenselect.v1.SelectionPolicy).
struct Selection {
  std::string policy;
  std::optional<int64_t> k, n_init, n_local, chunk_size;
  std::optional<double> theta;
};

struct GenerateInput {
  // Exactly one of prompt, prompt_ids and chat (role, content pairs).
  std::string prompt;
  std::vector<int32_t> prompt_ids;
  std::vector<std::pair<std::string, std::string>> chat;
  std::optional<bool> add_special_tokens;
  std::string request_id;  // empty: the server assigns one
  Sampling sampling;
  Selection selection;
  std::optional<bool> skip_special_tokens;
};

struct CallOptions {
  absl::Duration timeout = absl::InfiniteDuration();  // the call's deadline, from now
};

struct Timings {
  double queue_seconds = 0, ttft_seconds = 0, total_seconds = 0, prefill_seconds = 0;
};

// One streamed response.
struct StreamChunk {
  std::string request_id;
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;  // one per token when sampling.logprobs
  bool final = false;
  std::string finish_reason;  // "stop", "stop_string", "length" on the final chunk
  int64_t prompt_tokens = 0, completion_tokens = 0;  // on the final chunk
  Timings timings;                                   // on the final chunk
};

struct GenerateResult {
  std::string request_id;
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;
  std::string finish_reason;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  Timings timings;
};

struct ModelInfoResult {
  std::string model_name, architecture;
  int64_t vocab_size = 0, num_layers = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t max_position_embeddings = 0, max_prompt_tokens = 0;
  std::vector<int32_t> eos_token_ids;
};

// An in-flight streaming call, read like an iterator:
//   while (stream->Next(&chunk)) { ... }   then   absl::Status s = stream->Finish();
class GenerateStream {
 public:
  virtual ~GenerateStream() = default;
  // The next chunk; false at the end of the stream (or after an error: see Finish).
  virtual bool Next(StreamChunk* chunk) = 0;
  // Cancels the call (thread-safe; Next then returns false and Finish CANCELLED).
  virtual void Cancel() = 0;
  // The call's status, after Next returned false. The server's code and message: INVALID_ARGUMENT,
  // RESOURCE_EXHAUSTED, UNAVAILABLE, UNAUTHENTICATED, DEADLINE_EXCEEDED, CANCELLED.
  virtual absl::Status Finish() = 0;
};

class Client {
 public:
  // InvalidArgument for an empty target or inconsistent TLS options; NotFound for unreadable
  // certificate files. Connects lazily.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const ClientOptions& options);
  virtual ~Client() = default;

  // The whole output at once.
  virtual absl::StatusOr<GenerateResult> GenerateUnary(const GenerateInput& input,
                                                       const CallOptions& call = {}) = 0;
  // Streams; `on_chunk` runs for every response on the calling thread and returns false to
  // cancel (the result is then CANCELLED). Returns the accumulated result.
  virtual absl::StatusOr<GenerateResult> Generate(
      const GenerateInput& input, const CallOptions& call,
      const std::function<bool(const StreamChunk&)>& on_chunk) = 0;
  // Starts a streaming call and returns it as an iterator.
  virtual std::unique_ptr<GenerateStream> StartGenerate(const GenerateInput& input,
                                                        const CallOptions& call = {}) = 0;

  virtual absl::StatusOr<std::vector<int32_t>> Tokenize(const std::string& text,
                                                        const CallOptions& call = {}) = 0;
  virtual absl::StatusOr<ModelInfoResult> GetModelInfo(const CallOptions& call = {}) = 0;
  // grpc.health.v1 Check of `service` ("" is the whole server).
  virtual absl::StatusOr<rpc::ServingStatus> Health(const std::string& service = "",
                                                    absl::Duration timeout = absl::Seconds(5)) = 0;
};

}  // namespace tokenselect::clients

#endif  // TOKENSELECT_CLIENTS_CLIENT_H_
