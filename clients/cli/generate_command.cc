// tokenselect generate --model DIR --prompt TEXT [--chat] [--device cpu|cuda] [sampling flags]
// Offline generation on the engine (the CPU backend, or with --device cuda the GPU backend of
// CUDA builds): loads the checkpoint (or dummy weights of its shape), streams the generated text
// to stdout as it is produced, and prints a summary to stderr.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "clients/cli/command.h"
#include "common/status.h"
#include "engine/generation/generator.h"
#include "engine/generation/model_loader.h"
#include "engine/kvcache/page_pool.h"
#include "engine/model/kv_cache_dtype.h"
#include "engine/model/tp_invariance.h"
#include "engine/selection/selection_options.h"
#ifdef TS_HAVE_CUDA_BACKEND
#include "engine/generation/cuda_backend.h"
#endif

ABSL_FLAG(std::string, model, "", "generate (offline), serve: Hugging Face checkpoint directory.");
ABSL_FLAG(std::string, load_format, "auto",
          "generate (offline), serve: auto (the directory's safetensors) or dummy (random weights "
          "of config.json's shape).");
ABSL_FLAG(uint64_t, dummy_seed, 0, "generate (offline): seed of the dummy weights.");
ABSL_FLAG(std::string, prompt, "", "generate: the prompt text.");
ABSL_FLAG(std::string, prompt_ids, "",
          "generate: the prompt as comma-separated token ids (instead of --prompt).");
ABSL_FLAG(std::string, prompt_ids_file, "",
          "generate: a file of token ids separated by commas or white space (instead of "
          "--prompt; for prompts too long for a command line).");
ABSL_FLAG(bool, chat, false,
          "generate: wrap the prompt as a user message in the model's chat template.");
ABSL_FLAG(std::string, system, "", "generate: system message, with --chat.");
ABSL_FLAG(int32_t, max_new_tokens, 128, "generate: maximum number of generated tokens.");
ABSL_FLAG(double, temperature, 0.0, "generate: sampling temperature; 0 is greedy.");
ABSL_FLAG(int32_t, top_k, 0, "generate: keep the k most likely tokens; 0 or -1: off.");
ABSL_FLAG(double, top_p, 1.0, "generate: nucleus sampling mass in (0, 1].");
ABSL_FLAG(double, min_p, 0.0, "generate: drop tokens below min_p times the top probability.");
ABSL_FLAG(double, repetition_penalty, 1.0, "generate: HF repetition penalty (> 0; 1 is off).");
ABSL_FLAG(double, frequency_penalty, 0.0, "generate: frequency penalty in [-2, 2].");
ABSL_FLAG(double, presence_penalty, 0.0, "generate: presence penalty in [-2, 2].");
ABSL_FLAG(int64_t, seed, -1, "generate: sampling seed (>= 0 for reproducible sampling).");
ABSL_FLAG(std::vector<std::string>, stop, {}, "generate: comma-separated stop strings.");
ABSL_FLAG(std::vector<std::string>, stop_token_ids, {},
          "generate: comma-separated token ids that end generation.");
ABSL_FLAG(bool, ignore_eos, false, "generate: keep generating past end-of-sequence tokens.");
ABSL_FLAG(bool, logprobs, false, "generate: print the generated ids with their logprobs.");
ABSL_FLAG(bool, print_ids, false, "generate: print the generated token ids at the end.");
ABSL_FLAG(std::string, policy, "tokenselect",
          "generate: token selection policy: tokenselect (head soft vote), topk, head_vote, dense, "
          "streaming, tokenselect_span, infllm, quest, cascade (also with --server).");
ABSL_FLAG(int64_t, k, 2048, "generate: selection budget: tokens chosen by the policy.");
ABSL_FLAG(int64_t, n_init, 128, "generate: selection budget: initial (sink) tokens always kept.");
ABSL_FLAG(int64_t, n_local, 512, "generate: selection budget: recent tokens always kept.");
ABSL_FLAG(double, theta, 0.9,
          "generate: selection-cache cosine threshold in [-1, 1]; above 1 disables the cache.");
ABSL_FLAG(int64_t, chunk_size, 512, "generate: prompt tokens per prefill step (chunked prefill).");
ABSL_FLAG(int64_t, page_size, 16, "generate (offline), serve: KV cache page size in tokens.");
ABSL_FLAG(std::string, device, "cpu",
          "generate (offline), serve: cpu, or cuda (bf16 weights; CUDA builds only; policies "
          "tokenselect, topk, quest, infllm, tokenselect_span, dense, streaming).");
ABSL_FLAG(int64_t, max_context, 131072,
          "generate (offline): with --device cuda, the KV capacity in tokens (prompt + new "
          "tokens).");
ABSL_FLAG(std::string, kv_dtype, "bf16",
          "generate (offline), serve: with --device cuda, the KV cache's element type: bf16, or "
          "fp8 (e4m3 with per-head scales, half the memory per token; docs/fp8_kv.md).");
ABSL_FLAG(int32_t, gpu, 0,
          "generate (offline), serve: with --device cuda, the CUDA device (generate: the first of "
          "--tp consecutive ones; serve: the one both workers use).");
ABSL_FLAG(int32_t, tp, 1,
          "generate (offline): with --device cuda, tensor-parallel size: the model sharded by "
          "heads over GPUs --gpu .. --gpu + tp - 1 (serve --all-in-one takes only 1; the worker "
          "binaries have their own --tp).");
ABSL_FLAG(int32_t, tp_invariant, 0,
          "generate (offline), serve: with --device cuda, TP-invariant numerics for --tp sizes "
          "dividing this value (0 off, 1, 2 or 4): the same tokens, bit for bit the same logits, "
          "on 1, 2 or 4 GPUs, at some speed cost (docs/parallel.md).");

// --server (remote_commands.cc): run the request on a router instead of offline.
ABSL_DECLARE_FLAG(std::string, server);

namespace tokenselect::cli {
namespace {

absl::StatusOr<engine::SamplingParams> SamplingFromFlags() {
  engine::SamplingParams p;
  p.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  p.top_k = absl::GetFlag(FLAGS_top_k);
  p.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  p.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  p.repetition_penalty = static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty));
  p.frequency_penalty = static_cast<float>(absl::GetFlag(FLAGS_frequency_penalty));
  p.presence_penalty = static_cast<float>(absl::GetFlag(FLAGS_presence_penalty));
  if (absl::GetFlag(FLAGS_seed) >= 0) p.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  p.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  p.stop = absl::GetFlag(FLAGS_stop);
  ASSIGN_OR_RETURN(p.stop_token_ids,
                   ParseTokenIds(absl::GetFlag(FLAGS_stop_token_ids), "stop_token_ids"));
  p.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  p.logprobs = absl::GetFlag(FLAGS_logprobs);
  return p;
}

absl::StatusOr<engine::SelectionOptions> SelectionFromFlags() {
  engine::SelectionOptions s;
  ASSIGN_OR_RETURN(s.policy, engine::ParsePolicy(absl::GetFlag(FLAGS_policy)));
  s.k = absl::GetFlag(FLAGS_k);
  s.n_init = absl::GetFlag(FLAGS_n_init);
  s.n_local = absl::GetFlag(FLAGS_n_local);
  s.theta = absl::GetFlag(FLAGS_theta);
  s.chunk_size = absl::GetFlag(FLAGS_chunk_size);
  RETURN_IF_ERROR(engine::ValidateSelectionOptions(s));
  return s;
}

// The end-of-run summary on stderr: throughput, then what selection did.
void PrintSummary(const engine::GenerationResult& result, const engine::SelectionOptions& sel,
                  bool gpu) {
  const engine::GenerationStats& s = result.stats;
  const double decode_steps = std::max<int64_t>(1, s.generated_tokens - 1);
  std::fprintf(stderr,
               "[generate] finish=%s prompt=%lld tokens generated=%lld tokens | prefill %.3f s "
               "(%.1f tok/s) | decode %.1f ms/token (%.1f tok/s)\n",
               std::string(engine::ToString(result.finish_reason)).c_str(),
               static_cast<long long>(s.prompt_tokens), static_cast<long long>(s.generated_tokens),
               s.prefill_seconds, s.prompt_tokens / std::max(1e-9, s.prefill_seconds),
               1e3 * s.decode_seconds / decode_steps,
               decode_steps / std::max(1e-9, s.decode_seconds));
  const engine::SelectionStats& st = s.selection;
  const double per_step =
      st.decode_layer_steps > 0 ? double(st.decode_attended_tokens) / st.decode_layer_steps : 0.0;
  const double hit_rate = s.cache.lookups() > 0 ? double(s.cache.hits) / s.cache.lookups() : 0.0;
  // On the GPU, selection runs asynchronously between the layers' kernels and is not timed per
  // request (bench_generate_cuda and bench_kernels_cuda time it).
  const std::string selection_time =
      gpu ? std::string("selection time not measured on the GPU")
          : absl::StrFormat("selection time %.1f%% of %.3f s",
                            100.0 * st.selection_seconds / std::max(1e-9, s.total_seconds),
                            s.total_seconds);
  std::fprintf(stderr,
               "[selection] policy=%s k=%lld n_init=%lld n_local=%lld theta=%.3g | cache hit "
               "rate %.1f%% (%lld of %lld lookups) | %s | tokens "
               "attended per decode step %.1f of %lld | full-attention layer steps %lld of %lld\n",
               std::string(engine::PolicyName(sel.policy)).c_str(), static_cast<long long>(sel.k),
               static_cast<long long>(sel.n_init), static_cast<long long>(sel.n_local), sel.theta,
               100.0 * hit_rate, static_cast<long long>(s.cache.hits),
               static_cast<long long>(s.cache.lookups()), selection_time.c_str(), per_step,
               static_cast<long long>(s.prompt_tokens + s.generated_tokens),
               static_cast<long long>(st.full_attention_steps),
               static_cast<long long>(st.layer_steps));
}

absl::StatusOr<std::vector<int32_t>> PromptIds(const tokenizer::Tokenizer& tok) {
  ASSIGN_OR_RETURN(std::optional<std::vector<int32_t>> ids, PromptIdsFromFlags());
  if (ids.has_value()) return *std::move(ids);
  const std::string text = absl::GetFlag(FLAGS_prompt);
  if (!absl::GetFlag(FLAGS_chat)) return tok.Encode(text, /*add_special_tokens=*/true);
  std::vector<tokenizer::ChatMessage> messages;
  if (!absl::GetFlag(FLAGS_system).empty()) {
    messages.push_back({"system", absl::GetFlag(FLAGS_system)});
  }
  messages.push_back({"user", text});
  ASSIGN_OR_RETURN(std::string rendered,
                   tok.ApplyChatTemplate(messages, /*add_generation_prompt=*/true));
  return tok.Encode(rendered, /*add_special_tokens=*/false);
}

// The CPU backend: weights in host memory, a KV pool that holds exactly this request.
absl::StatusOr<engine::GenerationResult> GenerateOnCpu(engine::LoadFormat format,
                                                       const engine::GenerationOptions& options,
                                                       const engine::TokenCallback& on_token) {
  ASSIGN_OR_RETURN(engine::LoadedModel loaded,
                   engine::LoadModelDirectory(absl::GetFlag(FLAGS_model), format,
                                              absl::GetFlag(FLAGS_dummy_seed)));
  ASSIGN_OR_RETURN(std::vector<int32_t> prompt, PromptIds(*loaded.tokenizer));
  // A pool that holds exactly this request: prompt + max_new_tokens, rounded up to pages.
  const int64_t page_size = absl::GetFlag(FLAGS_page_size);
  const int64_t tokens = static_cast<int64_t>(prompt.size()) + options.sampling.max_new_tokens;
  ASSIGN_OR_RETURN(std::unique_ptr<engine::PagePool> pool,
                   engine::PagePool::Create(loaded.model->KvCacheOptions(
                       (tokens + page_size - 1) / page_size, page_size)));
  engine::Generator generator(loaded.model.get(), loaded.tokenizer.get(), pool.get());
  return generator.Generate(prompt, options, on_token);
}

#ifdef TS_HAVE_CUDA_BACKEND
// The GPU backend: bf16 weights and KV on GPU 0 (--tp > 1: sharded over GPUs 0 .. tp - 1),
// sized for --max_context tokens.
absl::StatusOr<engine::GenerationResult> GenerateOnCuda(engine::LoadFormat format,
                                                        const engine::GenerationOptions& options,
                                                        const engine::TokenCallback& on_token) {
  engine::TpCudaModelOptions tp;
  tp.tp_size = absl::GetFlag(FLAGS_tp);
  if (tp.tp_size < 1) return absl::InvalidArgumentError("--tp must be >= 1");
  for (int r = 0; r < tp.tp_size; ++r) tp.devices.push_back(absl::GetFlag(FLAGS_gpu) + r);
  engine::TpCudaModel::RequestEagerLoading(tp.tp_size);  // before the first CUDA call
  engine::CudaModelOptions& cuda = tp.model;
  cuda.max_chunk = options.selection.chunk_size;
  cuda.page_size = absl::GetFlag(FLAGS_page_size);
  cuda.max_tokens = absl::GetFlag(FLAGS_max_context);
  cuda.max_batch = 1;  // one request: no batched decode
  cuda.capture_on_first_sight = true;  // its decode rows never change: no step by segments
  ASSIGN_OR_RETURN(cuda.kv_dtype, engine::ParseKvCacheDType(absl::GetFlag(FLAGS_kv_dtype)));
  cuda.invariant_shards = absl::GetFlag(FLAGS_tp_invariant);
  if (cuda.max_tokens < 1) return absl::InvalidArgumentError("--max_context must be >= 1");
  ASSIGN_OR_RETURN(engine::LoadedTpCudaModel loaded,
                   engine::LoadTpCudaModelDirectory(absl::GetFlag(FLAGS_model), format,
                                                    absl::GetFlag(FLAGS_dummy_seed), tp));
  ASSIGN_OR_RETURN(std::vector<int32_t> prompt, PromptIds(*loaded.tokenizer));
  engine::CudaBackend backend(loaded.model.get());
  engine::Generator generator(&backend, loaded.tokenizer.get());
  return generator.Generate(prompt, options, on_token);
}
#endif

}  // namespace

absl::Status RunGenerate(const std::vector<std::string>& args) {
  if (!absl::GetFlag(FLAGS_server).empty()) return RunRemoteGenerate(args);
  if (!args.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected arguments: ", absl::StrJoin(args, " ")));
  }
  if (absl::GetFlag(FLAGS_model).empty()) return absl::InvalidArgumentError("--model is required");
  ASSIGN_OR_RETURN(engine::LoadFormat format,
                   engine::ParseLoadFormat(absl::GetFlag(FLAGS_load_format)));
  if (absl::GetFlag(FLAGS_page_size) < 1) {
    return absl::InvalidArgumentError("--page_size must be >= 1");
  }
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device != "cpu" && device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device must be cpu or cuda, got '", device, "'"));
  }
  if (absl::GetFlag(FLAGS_tp) != 1 && device != "cuda") {
    return absl::InvalidArgumentError("--tp > 1 needs --device cuda");
  }
  if (absl::GetFlag(FLAGS_gpu) < 0) return absl::InvalidArgumentError("--gpu must be >= 0");
  ASSIGN_OR_RETURN(const engine::KvCacheDType kv_dtype,
                   engine::ParseKvCacheDType(absl::GetFlag(FLAGS_kv_dtype)));
  if (kv_dtype != engine::KvCacheDType::kBF16 && device != "cuda") {
    return absl::InvalidArgumentError("--kv_dtype fp8 needs --device cuda");
  }
  if (const int s = absl::GetFlag(FLAGS_tp_invariant); s != 0) {
    const int tp = absl::GetFlag(FLAGS_tp);
    if (device != "cuda") return absl::InvalidArgumentError("--tp_invariant needs --device cuda");
    if (!engine::ValidInvariantShards(s, tp)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tp_invariant must be 0, 1, 2 or 4 and a multiple of --tp ", tp, ", got ", s));
    }
  }
  engine::GenerationOptions options;
  ASSIGN_OR_RETURN(options.sampling, SamplingFromFlags());
  ASSIGN_OR_RETURN(options.selection, SelectionFromFlags());
  std::vector<std::string> logprob_lines;
  const engine::TokenCallback on_token = [&](const engine::GeneratedToken& token) {
    std::fputs(token.text.c_str(), stdout);
    std::fflush(stdout);
    if (token.logprob) logprob_lines.push_back(absl::StrCat(token.id, ":", *token.logprob));
  };
  engine::GenerationResult result;
  if (device == "cuda") {
#ifdef TS_HAVE_CUDA_BACKEND
    ASSIGN_OR_RETURN(result, GenerateOnCuda(format, options, on_token));
#else
    return absl::UnimplementedError("--device cuda: this build has no CUDA backend");
#endif
  } else {
    ASSIGN_OR_RETURN(result, GenerateOnCpu(format, options, on_token));
  }
  std::fputs("\n", stdout);
  if (absl::GetFlag(FLAGS_print_ids)) {
    std::printf("ids: %s\n", absl::StrJoin(result.token_ids, ",").c_str());
  }
  if (!logprob_lines.empty()) {
    std::printf("logprobs: %s\n", absl::StrJoin(logprob_lines, " ").c_str());
  }
  PrintSummary(result, options.selection, device == "cuda");
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::vector<int32_t>>> PromptIdsFromFlags() {
  const std::string text = absl::GetFlag(FLAGS_prompt);
  const std::string ids = absl::GetFlag(FLAGS_prompt_ids);
  const std::string ids_file = absl::GetFlag(FLAGS_prompt_ids_file);
  if (static_cast<int>(!text.empty()) + static_cast<int>(!ids.empty()) +
          static_cast<int>(!ids_file.empty()) !=
      1) {
    return absl::InvalidArgumentError(
        "give exactly one of --prompt, --prompt_ids and --prompt_ids_file");
  }
  if (!ids_file.empty()) {
    std::ifstream in(ids_file);
    if (!in) {
      return absl::NotFoundError(absl::StrCat("--prompt_ids_file: cannot read ", ids_file));
    }
    std::stringstream content;
    content << in.rdbuf();
    return ParseTokenIds(
        absl::StrSplit(content.str(), absl::ByAnyChar(", \t\r\n"), absl::SkipWhitespace()),
        "prompt_ids_file");
  }
  if (!ids.empty()) {
    return ParseTokenIds(absl::StrSplit(ids, ',', absl::SkipWhitespace()), "prompt_ids");
  }
  return std::nullopt;
}

}  // namespace tokenselect::cli
