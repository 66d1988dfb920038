// Test harness: starts the real binaries (router, prefill_worker, decode_worker) as child
// processes on loopback with free ports, and stops them. Logs go to files in the test's temp dir.
#ifndef TOKENSELECT_TESTS_INTEGRATION_SERVICES_CLUSTER_H_
#define TOKENSELECT_TESTS_INTEGRATION_SERVICES_CLUSTER_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "rpc/channels.h"

namespace tokenselect::testing {

// A port that was free a moment ago (bound to port 0 and released).
int FreePort();

// The build's bin/ directory (TS_BINARY_DIR from ctest, else ./build-rtr).
std::string BinDir();

class Process {
 public:
  Process() = default;
  // Starts argv[0] with the rest as arguments; stdout and stderr go to `log_path`.
  Process(const std::vector<std::string>& argv, const std::string& log_path);
  Process(Process&& other) noexcept;
  Process& operator=(Process&& other) noexcept;
  ~Process();  // Kill(SIGKILL) if still running

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  // Sends `signal` and waits for the exit; returns the wait status (or -1 when not running).
  int Kill(int signal);

 private:
  pid_t pid_ = -1;
};

// Runs argv to completion; returns its stdout (stderr goes to `log_path`) and exit code.
std::string RunAndCapture(const std::vector<std::string>& argv, const std::string& log_path,
                          int* exit_code);

// A fresh temp directory.
std::string MakeTempDir(const std::string& prefix);

// Polls grpc.health.v1 on 127.0.0.1:port until `service` is SERVING (true) or `timeout_s` passes.
bool WaitServing(int port, const std::string& service, double timeout_s);
// The same on `target` over a channel with `options` (TLS, a client certificate).
bool WaitServing(const std::string& target, const rpc::ChannelOptions& options,
                 const std::string& service, double timeout_s);

// True when the openssl CLI is installed.
bool HaveOpenssl();

// Writes, with the openssl CLI, ca.pem (a test CA) and server.pem / server.key (a certificate
// for localhost and 127.0.0.1 signed by it, usable as server and as client certificate) to
// `dir`. False when openssl fails (its output is in dir/openssl.log).
bool MakeCertificates(const std::string& dir);

}  // namespace tokenselect::testing

#endif  // TOKENSELECT_TESTS_INTEGRATION_SERVICES_CLUSTER_H_
