#include "wire/worker_flags.h"

#include <pthread.h>
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/status.h"

ABSL_FLAG(std::string, model, "", "model directory (config.json, *.safetensors, tokenizer.json)");
ABSL_FLAG(std::string, load_format, "auto", "auto | safetensors | dummy");
ABSL_FLAG(std::string, host, "0.0.0.0", "address to listen on");
ABSL_FLAG(int64_t, drain_timeout_ms, 10000, "on SIGTERM, time given to running requests");
ABSL_FLAG(std::string, device, "cpu",
          "cpu | cuda: where the model runs (cuda: on --gpu, bf16 weights, the KV cache as "
          "--kv_dtype says)");
ABSL_FLAG(int32_t, gpu, 0,
          "with --device cuda: the CUDA device ordinal (the first of --tp consecutive ones)");
ABSL_FLAG(int32_t, tp, 1,
          "with --device cuda: tensor-parallel size, the model sharded by heads over GPUs --gpu "
          ".. --gpu + tp - 1 (must divide the attention heads, KV heads and intermediate_size)");
ABSL_FLAG(int32_t, tp_invariant, 0,
          "with --device cuda: TP-invariant numerics for --tp sizes dividing this value (0 off, "
          "1, 2 or 4): logits bit for bit the same on 1, 2 or 4 GPUs, at some speed cost "
          "(docs/parallel.md); a prefill and a decode worker of different --tp need the same "
          "value");
ABSL_FLAG(int64_t, kv_pages, 4096,
          "KV-cache pages of --page_size token slots (--device cuda: 0 plans the capacity from "
          "the GPU's free memory, see --gpu_memory_fraction)");
ABSL_FLAG(int64_t, page_size, 16, "token slots per KV page");
ABSL_FLAG(std::string, kv_dtype, "bf16",
          "with --device cuda: the KV cache's element type, bf16 or fp8 (e4m3 with per-head "
          "scales: half the memory per token; docs/fp8_kv.md)");
ABSL_FLAG(int64_t, max_chunk, 512,
          "with --device cuda: the most tokens per forward step (prefill chunk sizes above it "
          "are refused)");
ABSL_FLAG(int64_t, max_batch, 64, "with --device cuda: the most sequences per decode step");
ABSL_FLAG(double, gpu_memory_fraction, 0.9,
          "with --device cuda and --kv_pages 0: the share of the GPU's memory this process may "
          "hold in all (weights, activations, KV)");
ABSL_FLAG(int64_t, kv_link_timeout_ms, 10000,
          "device K/V links (--transport nccl): longest wait for the peer to join a link, for a "
          "chunk or for a busy link");
ABSL_FLAG(int32_t, metrics_port, 0, "Prometheus /metrics port (0: no metrics endpoint)");
ABSL_FLAG(std::string, metrics_host, "0.0.0.0", "address the /metrics endpoint listens on");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate: serve TLS (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA that verifies client certificates (--tls_require_client_cert) and, on the "
          "prefill worker, the decode workers' certificates (--kv_tls)");
ABSL_FLAG(bool, tls_require_client_cert, true,
          "with TLS on, refuse callers without a certificate signed by --tls_ca (mutual TLS)");

namespace tokenselect::wire {

absl::StatusOr<WorkerFlags> WorkerFlagsFromFlags() {
  WorkerFlags f;
  f.model_dir = absl::GetFlag(FLAGS_model);
  if (f.model_dir.empty()) return absl::InvalidArgumentError("--model is required");
  f.load_format = absl::GetFlag(FLAGS_load_format);
  f.host = absl::GetFlag(FLAGS_host);
  f.drain_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_drain_timeout_ms));
  engine::WorkerBackendOptions& o = f.backend;
  o.device = absl::GetFlag(FLAGS_device);
  o.gpu = absl::GetFlag(FLAGS_gpu);
  o.tp = absl::GetFlag(FLAGS_tp);
  o.tp_invariant = absl::GetFlag(FLAGS_tp_invariant);
  ASSIGN_OR_RETURN(o.kv_dtype, engine::ParseKvCacheDType(absl::GetFlag(FLAGS_kv_dtype)));
  o.kv_pages = absl::GetFlag(FLAGS_kv_pages);
  o.page_size = absl::GetFlag(FLAGS_page_size);
  o.max_chunk = absl::GetFlag(FLAGS_max_chunk);
  o.max_batch = absl::GetFlag(FLAGS_max_batch);
  o.gpu_memory_fraction = absl::GetFlag(FLAGS_gpu_memory_fraction);
  RETURN_IF_ERROR(engine::ValidateWorkerBackendOptions(o));
  f.links.timeout = absl::Milliseconds(absl::GetFlag(FLAGS_kv_link_timeout_ms));
  f.setup.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  f.setup.tls_key = absl::GetFlag(FLAGS_tls_key);
  f.setup.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  f.setup.tls_require_client_cert = absl::GetFlag(FLAGS_tls_require_client_cert);
  f.setup.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  f.setup.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  return f;
}

absl::StatusOr<WorkerFlags> StartWorkerMain(int argc, char** argv, const char* usage,
                                            sigset_t* signals) {
  absl::StatusOr<WorkerFlags> flags;
  const auto args = common::ParseFlags(argc, argv, usage);
  if (!args.ok()) {
    flags = args.status();
  } else {
    flags = WorkerFlagsFromFlags();
  }
  if (!flags.ok()) {
    std::fprintf(stderr, "%s\n", std::string(flags.status().message()).c_str());
    return flags;
  }
  // Signals are taken by sigwait (WaitForTermination): blocked in every thread the server starts.
  sigemptyset(signals);
  sigaddset(signals, SIGINT);
  sigaddset(signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, signals, nullptr);
  return flags;
}

void WaitForTermination(const sigset_t& signals, const char* who) {
  int signal = 0;
  sigwait(&signals, &signal);
  TS_LOG(INFO, "{}: signal {}, draining", who, signal);
}

}  // namespace tokenselect::wire
