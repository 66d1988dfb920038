#include "tests/integration/services/cluster.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/time/time.h"
#include "rpc/channels.h"
#include "rpc/health_client.h"

namespace tokenselect::testing {

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

std::string BinDir() {
  const char* dir = std::getenv("TS_BINARY_DIR");
  return std::string(dir != nullptr ? dir : "build-rtr") + "/bin";
}

Process::Process(const std::vector<std::string>& argv, const std::string& log_path) {
  pid_ = fork();
  if (pid_ == 0) {
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::perror("execv");
    _exit(127);
  }
}

Process::Process(Process&& other) noexcept : pid_(other.pid_) { other.pid_ = -1; }

Process& Process::operator=(Process&& other) noexcept {
  if (this != &other) {
    Kill(SIGKILL);
    pid_ = other.pid_;
    other.pid_ = -1;
  }
  return *this;
}

Process::~Process() { Kill(SIGKILL); }

int Process::Kill(int signal) {
  if (pid_ <= 0) return -1;
  kill(pid_, signal);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return status;
}

std::string RunAndCapture(const std::vector<std::string>& argv, const std::string& log_path,
                          int* exit_code) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return "";
  const pid_t pid = fork();
  if (pid == 0) {
    close(pipe_fds[0]);
    dup2(pipe_fds[1], 1);
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) dup2(fd, 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(pipe_fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(pipe_fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

std::string MakeTempDir(const std::string& prefix) {
  std::string pattern = "/tmp/" + prefix + "-XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  const char* dir = mkdtemp(buf.data());
  return dir != nullptr ? std::string(dir) : std::string();
}

bool WaitServing(int port, const std::string& service, double timeout_s) {
  return WaitServing(rpc::LoopbackTarget(port), rpc::ChannelOptions(), service, timeout_s);
}

bool WaitServing(const std::string& target, const rpc::ChannelOptions& options,
                 const std::string& service, double timeout_s) {
  auto channel = rpc::MakeChannel(target, options);
  if (!channel.ok()) return false;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    auto status = rpc::CheckHealth(*channel, service, absl::Seconds(1));
    if (status.ok() && *status == rpc::ServingStatus::kServing) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

namespace {

constexpr char kOpenssl[] = "/usr/bin/openssl";

bool RunOk(const std::vector<std::string>& argv, const std::string& log) {
  int rc = 0;
  RunAndCapture(argv, log, &rc);
  return rc == 0;
}

}  // namespace

bool HaveOpenssl() { return access(kOpenssl, X_OK) == 0; }

bool MakeCertificates(const std::string& dir) {
  const std::string log = dir + "/openssl.log";
  {
    std::ofstream ext(dir + "/san.ext");
    ext << "subjectAltName=DNS:localhost,IP:127.0.0.1\n";
  }
  return RunOk({kOpenssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                "/CN=tokenselect-test-ca", "-keyout", dir + "/ca.key", "-out", dir + "/ca.pem"},
               log) &&
         RunOk({kOpenssl, "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
                "-keyout", dir + "/server.key", "-out", dir + "/server.csr"},
               log) &&
         RunOk({kOpenssl, "x509", "-req", "-in", dir + "/server.csr", "-CA", dir + "/ca.pem",
                "-CAkey", dir + "/ca.key", "-CAcreateserial", "-days", "2", "-extfile",
                dir + "/san.ext", "-out", dir + "/server.pem"},
               log);
}

}  // namespace tokenselect::testing
