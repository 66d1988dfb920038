// Offline generation of one request on the engine: chunked prefill, then a decode loop of
// forward -> sample -> detokenize -> stop check, streaming each token's safe text to a callback.
// This is what `tokenselect generate` runs, and the reference the services' outputs are compared
// with token for token.
//
// Per request: a TokenTable reserving prompt + max_new_tokens slots up front (all or nothing),
// a Sampler, a StopChecker and a tokenizer::StreamDecoder. The KV pages are returned when
// Generate returns, on success and on every error.
#ifndef TOKENSELECT_ENGINE_GENERATION_GENERATOR_H_
#define TOKENSELECT_ENGINE_GENERATION_GENERATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/generation/backend.h"
#include "engine/kvcache/page_pool.h"
#include "engine/model/model.h"
#include "engine/sampling/finish_reason.h"
#include "engine/sampling/sampler.h"
#include "engine/sampling/sampling_params.h"
#include "engine/selection/selection_attention.h"
#include "engine/selection/selection_options.h"
#include "tokenizer/tokenizer.h"

namespace tokenselect::engine {

struct GenerationOptions {
  SamplingParams sampling;
  // Token selection (policy, budget, selection-cache theta) and the prefill chunk size
  // (selection.chunk_size prompt tokens per forward call).
  SelectionOptions selection;
  bool skip_special_tokens = true;  // in the streamed text
};

// One generated token as the stream sees it.
struct GeneratedToken {
  int32_t id = -1;
  std::optional<float> logprob;  // when sampling.logprobs
  std::vector<TokenLogprob> top_logprobs;
  // Text that became safe to send with this token (may be empty: an unfinished UTF-8
  // character, or text held back while it could be the start of a stop string).
  std::string text;
};

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;  // prompt forward passes, up to the first sampled token
  double decode_seconds = 0;   // every later forward pass and sample
  double total_seconds = 0;
  SelectionStats selection;           // summed over layers and steps
  SelectionCacheCounters cache;       // decode selection-cache lookups over all layers
};

struct GenerationResult {
  std::vector<int32_t> token_ids;  // every sampled token, a final stop token included
  std::string text;                // the concatenation of every streamed text
  FinishReason finish_reason = FinishReason::kNone;
  GenerationStats stats;
};

// Called once per generated token, in order, from the thread running Generate.
using TokenCallback = std::function<void(const GeneratedToken&)>;

class Generator {
 public:
  // The CPU backend. `model`, `tokenizer` and `pool` must outlive the generator; `pool` must fit
  // the model (Model::KvCacheOptions).
  Generator(const Model* model, const tokenizer::Tokenizer* tokenizer, PagePool* pool);
  // Any backend (e.g. the GPU's, cuda_backend.h); `backend` and `tokenizer` must outlive the
  // generator.
  Generator(GenerationBackend* backend, const tokenizer::Tokenizer* tokenizer);

  // Generates a continuation of `prompt` (token ids). Errors:
  //   InvalidArgument   empty prompt, a token id outside the vocabulary, invalid sampling or
  //                     selection parameters (the message names the field)
  //   ResourceExhausted the KV pool cannot hold prompt + max_new_tokens tokens
  //   Unimplemented     a selection policy the backend does not run (GPU backend)
  // `on_token` may be empty.
  absl::StatusOr<GenerationResult> Generate(absl::Span<const int32_t> prompt,
                                            const GenerationOptions& options,
                                            const TokenCallback& on_token) const;

  // The end-of-sequence ids used for stopping: the model config's and the tokenizer's.
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }

 private:
  std::unique_ptr<GenerationBackend> owned_backend_;  // the CPU backend of the first constructor
  GenerationBackend* backend_;
  const tokenizer::Tokenizer* tokenizer_;
  std::vector<int32_t> eos_ids_;
};

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_GENERATION_GENERATOR_H_
