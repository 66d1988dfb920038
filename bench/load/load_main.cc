// bench_load: a closed-loop load generator against a router (clients/client.h). N workers each
// keep one streaming request in flight until --requests have completed, then it reports
// time to first token, inter-token latency and end-to-end latency (p50/p95/p99, measured at
// the client) and the output tokens/s.
//
//   build/bin/bench_load --server localhost:50051 --concurrency 8 --requests 64
//       --prompt_tokens 512 --max_new_tokens 64   (one command line)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "clients/client.h"
#include "common/flags.h"

ABSL_FLAG(std::string, server, "localhost:50051", "Router address.");
ABSL_FLAG(int32_t, concurrency, 4, "Requests in flight at once.");
ABSL_FLAG(int32_t, requests, 32, "Requests in total.");
ABSL_FLAG(int32_t, prompt_tokens, 256, "Prompt length in tokens (ids sent directly).");
ABSL_FLAG(int32_t, max_new_tokens, 32, "Generated tokens per request (EOS ignored).");
ABSL_FLAG(int32_t, vocab, 1000, "Prompt ids are drawn from [10, vocab).");
ABSL_FLAG(std::string, api_key, "", "API key.");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA of the server (enables TLS).");
ABSL_FLAG(double, timeout_s, 600, "Per-request deadline.");

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * (v.size() - 1) + 0.5));
  return v[i];
}

void Report(const char* name, const std::vector<double>& v) {
  std::printf("%-18s p50 %9.2f ms   p95 %9.2f ms   p99 %9.2f ms   (n=%zu)\n", name,
              1e3 * Percentile(v, 50), 1e3 * Percentile(v, 95), 1e3 * Percentile(v, 99), v.size());
}

int Main(int argc, char** argv) {
  auto args = tokenselect::common::ParseFlags(argc, argv, "bench_load --server HOST:PORT ...");
  if (!args.ok()) {
    std::fprintf(stderr, "%s\n", std::string(args.status().message()).c_str());
    return 2;
  }
  tokenselect::clients::ClientOptions options;
  options.target = absl::GetFlag(FLAGS_server);
  options.api_key = absl::GetFlag(FLAGS_api_key);
  if (!absl::GetFlag(FLAGS_tls_ca).empty()) {
    options.tls.enabled = true;
    options.tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  }
  auto client = tokenselect::clients::Client::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  const int total = absl::GetFlag(FLAGS_requests);
  std::atomic<int> next{0};
  std::mutex mu;
  std::vector<double> ttft, itl, e2e;
  int64_t tokens = 0;
  int failures = 0;
  std::string first_error;
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int w = 0; w < absl::GetFlag(FLAGS_concurrency); ++w) {
    threads.emplace_back([&] {
      for (int i = next++; i < total; i = next++) {
        tokenselect::clients::GenerateInput in;
        for (int t = 0; t < absl::GetFlag(FLAGS_prompt_tokens); ++t) {
          in.prompt_ids.push_back(10 + (i * 7919 + t * 104729) % (absl::GetFlag(FLAGS_vocab) - 10));
        }
        in.sampling.temperature = 0;
        in.sampling.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
        in.sampling.ignore_eos = true;
        tokenselect::clients::CallOptions call;
        call.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
        const auto t0 = Clock::now();
        auto last = t0;
        bool first = true;
        std::vector<double> gaps;
        double first_token = 0;
        auto result =
            (*client)->Generate(in, call, [&](const tokenselect::clients::StreamChunk& c) {
              if (c.token_ids.empty()) return true;
              const auto now = Clock::now();
              if (first) {
                first_token = Seconds(now - t0);
                first = false;
              } else {
                // A chunk may carry several tokens: spread the gap over them.
                const double gap = Seconds(now - last) / static_cast<double>(c.token_ids.size());
                for (size_t k = 0; k < c.token_ids.size(); ++k) gaps.push_back(gap);
              }
              last = now;
              return true;
            });
        const double total_s = Seconds(Clock::now() - t0);
        std::lock_guard<std::mutex> lock(mu);
        if (!result.ok()) {
          if (failures++ == 0) first_error = result.status().ToString();
          continue;
        }
        ttft.push_back(first_token);
        itl.insert(itl.end(), gaps.begin(), gaps.end());
        e2e.push_back(total_s);
        tokens += static_cast<int64_t>(result->token_ids.size());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double wall = Seconds(Clock::now() - start);
  std::printf(
      "bench_load: %d requests, concurrency %d, prompt %d tokens, %d new tokens, "
      "server %s\n",
      total, absl::GetFlag(FLAGS_concurrency), absl::GetFlag(FLAGS_prompt_tokens),
      absl::GetFlag(FLAGS_max_new_tokens), options.target.c_str());
  Report("ttft", ttft);
  Report("inter-token", itl);
  Report("end-to-end", e2e);
  std::printf("throughput         %.1f output tokens/s, %.2f requests/s over %.2f s\n",
              tokens / wall, e2e.size() / wall, wall);
  if (failures > 0) {
    std::printf("failures           %d (first: %s)\n", failures, first_error.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
