#include "util/azurite.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "storage/detail/shared_key.h"
#include "test_paths.h"

namespace cohort::test {
namespace {

// `name` found on PATH, as execve needs a path.
std::string findOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(ss, dir, ':');) {
    const std::string candidate = dir + "/" + name;
    if (!dir.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  throw std::runtime_error(name + " is not on PATH (scripts/install-deps.sh installs it)");
}

bool accepts(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

bool exited(pid_t pid) {
  siginfo_t info{};
  return ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
         info.si_pid == pid;
}

}  // namespace

Azurite::Azurite(bool https, bool oauth) : https_(https) {
  const std::string main =
      std::string(COHORT_AZURITE_DIR) + "/node_modules/azurite/dist/src/blob/main.js";
  if (!std::filesystem::exists(main)) {
    throw std::runtime_error(main + " is missing: run `npm ci` in " COHORT_AZURITE_DIR
                                    " (scripts/test.sh does)");
  }
  std::vector<std::string> argv = {findOnPath("node"), main,
                                   "--blobHost",       "127.0.0.1",
                                   "--blobPort",       "",
                                   "--location",       dir_.file("data"),
                                   "--silent",         "--skipApiVersionCheck",
                                   "--loose",          "--disableTelemetry"};
  if (https_) {
    certFile_ = dir_.file("cert.pem");
    const std::string keyFile = dir_.file("key.pem");
    ProcessResult r = run({findOnPath("openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                           "-keyout", keyFile, "-out", certFile_, "-days", "2", "-subj",
                           "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"},
                          {}, std::chrono::seconds(60));
    if (r.exitCode != 0) throw std::runtime_error("openssl req failed: " + r.describe());
    argv.insert(argv.end(), {"--cert", certFile_, "--key", keyFile});
    if (oauth) argv.insert(argv.end(), {"--oauth", "basic"});
  } else if (oauth) {
    throw std::runtime_error("Azurite takes OAuth tokens over https only");
  }
  // The free port can be taken between freePort() and Azurite's bind (by a
  // parallel test): then try another one.
  for (int attempt = 0;; ++attempt) {
    port_ = freePort();
    argv[5] = std::to_string(port_);
    started_ = std::chrono::steady_clock::now();
    process_ = std::make_unique<Process>(argv);
    // Bounded wait until Azurite says it listens on the port and the port
    // accepts (a port that accepts alone may be another test's that took
    // it first); Azurite exiting ends it early.
    const auto deadline = started_ + std::chrono::seconds(30);
    const std::string listening = "successfully listens on " + std::string(https_ ? "https" : "http") +
                                  "://127.0.0.1:" + std::to_string(port_);
    bool up = true;
    while (process_->stdoutSoFar().find(listening) == std::string::npos || !accepts(port_)) {
      if (exited(process_->pid()) || std::chrono::steady_clock::now() > deadline) {
        up = false;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (up) return;
    ProcessResult r = process_->wait(std::chrono::milliseconds(1));
    process_.reset();
    if (attempt < 2 && (r.out + r.err).find("EADDRINUSE") != std::string::npos) continue;
    throw std::runtime_error("Azurite did not start on port " + std::to_string(port_) + ": " +
                             r.describe());
  }
}

Azurite::~Azurite() {
  if (!process_) return;
  process_->signal(SIGTERM);
  // Process::wait counts from the start; allow 10 s more for a clean exit,
  // after which it SIGKILLs and reaps.
  const auto ran = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - started_);
  process_->wait(ran + std::chrono::seconds(10));
}

std::string Azurite::endpoint() const {
  return std::string(https_ ? "https" : "http") + "://127.0.0.1:" + std::to_string(port_) + "/" +
         kAccount;
}

void SharedAzurite::start() {
  try {
    azurite_ = std::make_unique<Azurite>(https_, oauth_);
  } catch (const std::exception& e) {
    error_ = e.what();
  }
}

std::string accountSas(const std::string& account, const std::string& key) {
  namespace sd = cohort::storage::detail;
  const std::string version = "2021-08-06";
  const std::string permissions = "rwdlacup";
  const std::string services = "b";
  const std::string resourceTypes = "sco";
  const std::string expiry = "2099-01-01T00:00:00Z";
  const std::string protocol = "https,http";
  // Account SAS, versions 2020-12-06 and later: the last field is the
  // (empty) encryption scope, followed by a newline.
  const std::string toSign = account + "\n" + permissions + "\n" + services + "\n" + resourceTypes +
                             "\n" + "\n" + expiry + "\n" + "\n" + protocol + "\n" + version + "\n" +
                             "\n";
  const std::string sig = sd::base64Encode(sd::hmacSha256(sd::base64Decode(key), toSign));
  return sd::encodeQuery({{"sv", version},
                          {"ss", services},
                          {"srt", resourceTypes},
                          {"sp", permissions},
                          {"se", expiry},
                          {"spr", protocol},
                          {"sig", sig}});
}

}  // namespace cohort::test
