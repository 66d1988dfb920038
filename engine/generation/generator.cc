#include "engine/generation/generator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/ids.h"
#include "common/status.h"
#include "engine/kvcache/token_table.h"
#include "engine/sampling/stop_checker.h"
#include "tokenizer/stream_decoder.h"

namespace tokenselect::engine {

Generator::Generator(const Model* model, const tokenizer::Tokenizer* tokenizer, PagePool* pool)
    : Generator(new CpuBackend(model, pool), tokenizer) {
  owned_backend_.reset(backend_);
}

Generator::Generator(GenerationBackend* backend, const tokenizer::Tokenizer* tokenizer)
    : backend_(backend), tokenizer_(tokenizer) {
  for (int64_t id : backend_->config().eos_token_ids) {
    eos_ids_.push_back(static_cast<int32_t>(id));
  }
  for (int32_t id : tokenizer_->eos_ids()) eos_ids_.push_back(id);
  std::sort(eos_ids_.begin(), eos_ids_.end());
  eos_ids_.erase(std::unique(eos_ids_.begin(), eos_ids_.end()), eos_ids_.end());
}

absl::StatusOr<GenerationResult> Generator::Generate(absl::Span<const int32_t> prompt,
                                                     const GenerationOptions& options,
                                                     const TokenCallback& on_token) const {
  const int64_t vocab = backend_->config().vocab_size;
  if (prompt.empty()) return absl::InvalidArgumentError("prompt must not be empty");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " (id ", prompt[i],
                                                     ") is outside the vocabulary [0, ", vocab,
                                                     ")"));
    }
  }
  ASSIGN_OR_RETURN(Sampler sampler, Sampler::Create(options.sampling, static_cast<int>(vocab)));
  const common::Stopwatch total;
  GenerationResult result;
  result.stats.prompt_tokens = static_cast<int64_t>(prompt.size());
  // The whole request's KV up front: a request that starts never runs out mid-way.
  ASSIGN_OR_RETURN(std::unique_ptr<SequenceRunner> runner,
                   backend_->Start(result.stats.prompt_tokens + options.sampling.max_new_tokens,
                                   options.selection));

  // Greedy without penalties or logprobs: the backend picks (on the GPU only the id crosses to
  // the host), the first token too; -1 when the logits came back instead, for the sampler.
  const bool backend_picks = sampler.PicksArgmaxOfRawLogits();
  int32_t picked = -1;
  std::vector<float> logits;
  const int64_t n = result.stats.prompt_tokens;
  const int64_t chunk = options.selection.chunk_size;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t end = std::min(n, begin + chunk);
    const absl::Span<const int32_t> part = prompt.subspan(begin, end - begin);
    if (end < n) {
      RETURN_IF_ERROR(runner->Forward(part, nullptr));
    } else if (backend_picks) {
      RETURN_IF_ERROR(runner->ForwardGreedy(part, &picked, &logits));
    } else {
      RETURN_IF_ERROR(runner->Forward(part, &logits));
    }
  }
  result.stats.prefill_seconds = total.ElapsedSeconds();

  StopChecker stop(options.sampling, eos_ids_);
  tokenizer::StreamDecoder decoder(*tokenizer_, options.skip_special_tokens);
  const common::Stopwatch decode;
  while (true) {
    SampleResult sample;
    if (picked >= 0) {
      sample.token_id = picked;
    } else {
      ASSIGN_OR_RETURN(sample, sampler.Sample(logits, prompt, result.token_ids));
    }
    result.token_ids.push_back(sample.token_id);
    ASSIGN_OR_RETURN(StopCheckResult checked,
                     stop.Append(sample.token_id, decoder.Push(sample.token_id)));
    if (checked.finish_reason == FinishReason::kLength) {
      // At a length limit the decoder may still hold the start of an unfinished UTF-8
      // character: release it as Decode of all ids would (as U+FFFD). After a stop token or a
      // stop string the remainder is dropped by design.
      checked.text += decoder.Flush();
    }
    GeneratedToken token{sample.token_id, sample.logprob, std::move(sample.top_logprobs),
                         std::move(checked.text)};
    result.text += token.text;
    if (on_token) on_token(token);
    if (stop.finished()) {
      result.finish_reason = stop.finish_reason();
      break;
    }
    const int32_t next = result.token_ids.back();
    if (backend_picks) {
      RETURN_IF_ERROR(runner->ForwardGreedy(absl::MakeConstSpan(&next, 1), &picked, &logits));
    } else {
      RETURN_IF_ERROR(runner->Forward(absl::MakeConstSpan(&next, 1), &logits));
    }
  }
  result.stats.generated_tokens = static_cast<int64_t>(result.token_ids.size());
  result.stats.decode_seconds = decode.ElapsedSeconds();
  result.stats.total_seconds = total.ElapsedSeconds();
  result.stats.selection = runner->selection_stats();
  ASSIGN_OR_RETURN(result.stats.cache, runner->cache_counters());
  return result;
}

}  // namespace tokenselect::engine
