#include "router/worker_registry.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/status.h"
#include "rpc/health_client.h"

namespace tokenselect::router {
namespace {

// Splits "host:port" / "[v6]:port"; false without a numeric port.
bool SplitHostPort(absl::string_view target, std::string* host, std::string* port) {
  const size_t colon = target.rfind(':');
  if (colon == absl::string_view::npos || colon + 1 == target.size()) return false;
  int port_number;
  if (!absl::SimpleAtoi(target.substr(colon + 1), &port_number) || port_number <= 0 ||
      port_number > 65535) {
    return false;
  }
  absl::string_view h = target.substr(0, colon);
  if (absl::ConsumePrefix(&h, "[")) absl::ConsumeSuffix(&h, "]");
  *host = std::string(h);
  *port = std::string(target.substr(colon + 1));
  return !host->empty();
}

bool IsDns(absl::string_view target, absl::string_view* rest) {
  *rest = target;
  return absl::ConsumePrefix(rest, "dns:///") || absl::ConsumePrefix(rest, "dns:");
}

}  // namespace

const char* WorkerKindName(WorkerKind kind) {
  return kind == WorkerKind::kPrefill ? "prefill" : "decode";
}

absl::StatusOr<std::vector<std::string>> ParseTargets(const std::string& flag_value) {
  std::vector<std::string> targets;
  for (absl::string_view part : absl::StrSplit(flag_value, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    absl::string_view rest;
    IsDns(part, &rest);
    std::string host, port;
    if (!SplitHostPort(rest, &host, &port)) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker target '", part, "' must be host:port or dns:///name:port"));
    }
    targets.emplace_back(part);
  }
  return targets;
}

absl::StatusOr<std::vector<std::string>> ResolveTarget(const std::string& target) {
  absl::string_view rest;
  if (!IsDns(target, &rest)) return std::vector<std::string>{target};
  std::string host, port;
  if (!SplitHostPort(rest, &host, &port)) {
    return absl::InvalidArgumentError(absl::StrCat("bad target '", target, "'"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  std::set<std::string> addresses;
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (ai->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr, buf, sizeof buf);
      addresses.insert(absl::StrCat(buf, ":", port));
    } else if (ai->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr, buf,
                sizeof buf);
      addresses.insert(absl::StrCat("[", buf, "]:", port));
    }
  }
  freeaddrinfo(result);
  return std::vector<std::string>(addresses.begin(), addresses.end());
}

WorkerRegistry::WorkerRegistry(WorkerRegistryOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<WorkerRegistry>> WorkerRegistry::Create(
    WorkerRegistryOptions options) {
  if (options.prefill_targets.empty() || options.decode_targets.empty()) {
    return absl::InvalidArgumentError("at least one prefill and one decode worker are required");
  }
  for (const auto* list : {&options.prefill_targets, &options.decode_targets}) {
    for (const std::string& t : *list) RETURN_IF_ERROR(ParseTargets(t));
  }
  // Validate the credentials once so that channel creation below cannot fail.
  RETURN_IF_ERROR(rpc::MakeChannelCredentials(options.channel.tls));
  std::unique_ptr<WorkerRegistry> registry(new WorkerRegistry(std::move(options)));
  registry->Resolve();
  registry->ProbeAll();
  registry->thread_ = std::thread([r = registry.get()] { r->Loop(); });
  return registry;
}

WorkerRegistry::~WorkerRegistry() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void WorkerRegistry::Resolve() {
  for (WorkerKind kind : {WorkerKind::kPrefill, WorkerKind::kDecode}) {
    const auto& targets =
        kind == WorkerKind::kPrefill ? options_.prefill_targets : options_.decode_targets;
    std::set<std::string> wanted;
    bool complete = true;
    for (const std::string& target : targets) {
      absl::StatusOr<std::vector<std::string>> addresses = ResolveTarget(target);
      if (!addresses.ok()) {
        TS_LOG(WARN, "{} workers: {}", WorkerKindName(kind), addresses.status().ToString());
        complete = false;  // keep what we had rather than dropping every worker on a DNS blip
        continue;
      }
      wanted.insert(addresses->begin(), addresses->end());
    }
    absl::MutexLock lock(&mu_);
    WorkerMap& map = Map(kind);
    for (const std::string& address : wanted) {
      if (map.count(address)) continue;
      absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
          rpc::MakeChannel(address, options_.channel);
      if (!channel.ok()) continue;  // credentials were validated in Create
      TS_LOG(INFO, "{} worker {} added", WorkerKindName(kind), address);
      map[address].channel = *std::move(channel);
    }
    if (!complete) continue;
    for (auto it = map.begin(); it != map.end();) {
      if (wanted.count(it->first) == 0) {
        TS_LOG(INFO, "{} worker {} removed", WorkerKindName(kind), it->first);
        it = map.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void WorkerRegistry::ProbeAll() {
  for (WorkerKind kind : {WorkerKind::kPrefill, WorkerKind::kDecode}) {
    std::vector<std::pair<std::string, std::shared_ptr<grpc::Channel>>> workers;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [address, w] : Map(kind)) workers.emplace_back(address, w.channel);
    }
    for (const auto& [address, channel] : workers) {
      absl::StatusOr<rpc::ServingStatus> health =
          rpc::CheckHealth(channel, "", options_.probe_timeout);
      bool healthy = health.ok() && *health == rpc::ServingStatus::kServing;
      std::optional<WorkerLoadInfo> load;
      if (healthy && options_.load_probe) {
        absl::StatusOr<WorkerLoadInfo> l =
            options_.load_probe(kind, channel, options_.probe_timeout);
        if (l.ok()) {
          load = *l;
        } else {
          healthy = false;
        }
      }
      absl::MutexLock lock(&mu_);
      auto it = Map(kind).find(address);
      if (it == Map(kind).end()) continue;
      if (it->second.healthy != healthy) {
        TS_LOG(INFO, "{} worker {} is {}", WorkerKindName(kind), address,
               healthy ? "healthy" : "unhealthy");
      }
      it->second.healthy = healthy;
      if (load) it->second.load = *load;
    }
  }
}

void WorkerRegistry::Loop() {
  absl::Time next_resolve = absl::Now() + options_.resolve_interval;
  while (!stop_.WaitForNotificationWithTimeout(options_.probe_interval)) {
    if (absl::Now() >= next_resolve) {
      Resolve();
      next_resolve = absl::Now() + options_.resolve_interval;
    }
    ProbeAll();
  }
}

std::vector<WorkerSnapshot> WorkerRegistry::Healthy(WorkerKind kind) const {
  std::vector<WorkerSnapshot> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [address, w] : Map(kind)) {
    if (!w.healthy || w.load.draining) continue;
    out.push_back({address, w.channel, w.load, w.inflight, w.inflight_tokens});
  }
  return out;
}

std::vector<std::pair<std::string, bool>> WorkerRegistry::All(WorkerKind kind) const {
  std::vector<std::pair<std::string, bool>> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [address, w] : Map(kind)) out.emplace_back(address, w.healthy);
  return out;
}

void WorkerRegistry::AddInflight(WorkerKind kind, const std::string& address, int64_t requests,
                                 int64_t tokens) {
  absl::MutexLock lock(&mu_);
  auto it = Map(kind).find(address);
  if (it == Map(kind).end()) return;
  it->second.inflight += requests;
  it->second.inflight_tokens += tokens;
}

void WorkerRegistry::MarkUnhealthy(WorkerKind kind, const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = Map(kind).find(address);
  if (it != Map(kind).end()) it->second.healthy = false;
}

}  // namespace tokenselect::router
